"""Configs that parse but cannot learn what they ask for: the loss and the ensemble, and a freeze.

``learning_problems(cfg)`` returns ``(errors, warnings)``, each one line with the fix. ``train``
refuses the errors before anything is written (``Trainer``) and logs the warnings;
``config validate`` prints both. ``predict`` does not ask: a trained run's config is what it is.

* a CRPS loss with one member: the CRPS of one member is its absolute error, so a stochastic
  model (``model.noise_channels > 0``) cannot learn a spread from it — refused; for a deterministic
  model it is an MAE loss — a warning;
* ``loss.kind: mse`` with several members: every member is pulled to the mean, the noise learns
  nothing and the members do not spread — refused;
* noise channels with one member and ``mse``: the model learns to ignore its noise — a warning;
* ``loss.alpha`` set for a kind other than ``almost_fair_crps``, or ``loss.mse_weight`` for
  ``mse``: ignored — a warning;
* ``training.freeze`` without ``training.init_from``: the frozen parameters keep their random
  initialisation and never train — a warning.
"""

from __future__ import annotations

from .schema import LossConfig, TrainConfig

__all__ = ["check_learnable", "learning_problems"]

_CRPS = ("crps", "fair_crps", "almost_fair_crps")


def learning_problems(cfg: TrainConfig) -> tuple[list[str], list[str]]:
    """``(errors, warnings)`` of ``cfg``'s loss and ensemble (see the module doc)."""
    loss, members, noise = cfg.loss, cfg.training.members, cfg.model.noise_channels
    errors: list[str] = []
    warnings: list[str] = []
    if loss.kind in _CRPS and members == 1:
        what = f"config loss.kind={loss.kind!r} with training.members=1 is the absolute error of one member"
        if noise:
            errors.append(
                f"{what}: a stochastic model (model.noise_channels={noise}) cannot learn a spread from it; "
                f"set training.members to 2 or more (e.g. training.members=2, or mesh.ensemble=2 to spread "
                f"them), or loss.kind=mse with model.noise_channels=0 for a deterministic model"
            )
        else:
            warnings.append(f"{what} (an MAE loss); set loss.kind=mse for the MSE, or make the model "
                            f"stochastic (model.noise_channels, training.members >= 2)")  # fmt: skip
    if loss.kind == "mse" and members > 1:
        errors.append(
            f"config loss.kind='mse' with training.members={members} pulls every member to the mean: the "
            f"noise learns nothing and the members will not spread; use loss.kind=fair_crps (or "
            f"almost_fair_crps) to train an ensemble"
        )
    if loss.kind == "mse" and members == 1 and noise:
        warnings.append(
            f"config model.noise_channels={noise} with one member and loss.kind='mse': the model learns to "
            f"ignore its noise; train an ensemble (training.members >= 2, loss.kind=fair_crps) or set "
            f"model.noise_channels=0"
        )
    defaults = LossConfig()
    if loss.alpha != defaults.alpha and loss.kind != "almost_fair_crps":
        warnings.append(
            f"config loss.alpha={loss.alpha} is ignored: only loss.kind=almost_fair_crps uses it (kind is "
            f"{loss.kind!r}); drop it or set loss.kind=almost_fair_crps"
        )
    if loss.mse_weight != defaults.mse_weight and loss.kind == "mse":
        warnings.append(
            f"config loss.mse_weight={loss.mse_weight} is ignored for loss.kind='mse' (it adds the MSE to "
            f"a CRPS loss); drop it"
        )
    freeze, init_from = cfg.training.freeze, cfg.training.init_from
    if freeze and not init_from:
        warnings.append(
            f"config training.freeze={freeze} without training.init_from: the frozen parameters keep their "
            f"random initialisation and never train; set training.init_from to a trained run to fine-tune "
            f"it, or drop training.freeze"
        )
    return errors, warnings


def check_learnable(cfg: TrainConfig) -> list[str]:
    """Raise the first error of ``learning_problems``; return its warnings."""
    errors, warnings = learning_problems(cfg)
    if errors:
        raise ValueError(errors[0])
    return warnings
