"""Read-only access to a trained run for inference: which checkpoint, is this config its config.

Nothing here writes to the run directory: no claim, no ``config.yaml``, no ``history.jsonl``
entry, no optimizer (the trainer's ``rundir.py`` does those for training only). The checkpoint
is pinned while it is read (``checkpoint.pinned``) so a training run pruning the same directory
skips it.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ..checkpoint import latest_checkpoint, read_meta
from ..config.schema import TrainConfig
from ..config.shape_keys import compare_shape_keys
from ..data.preflight import default_climatology_path

__all__ = [
    "check_against_checkpoint",
    "find_checkpoint",
    "prediction_config",
    "protected_paths",
]


def prediction_config(
    config: str | None, overrides: list[str], model: str | None = None, checkpoint: str | None = None
) -> TrainConfig:
    """The forecast's configuration for this job's ranks: the run's ``config`` file with the
    ``overrides``, or with ``model`` (a shared model's folder) the configuration its contract
    describes, the overrides applied (an override given where ``config`` stands is one of them)."""
    from ..config import load_config
    from ..mesh_setup import world_size_from_env

    if model is None:
        if config is None:
            raise ValueError("give the run's config (predict CONFIG --out STORE ...) or a shared model "
                             "(predict --model DIR ...)")  # fmt: skip
        return load_config(config, overrides, world_size=world_size_from_env())
    from ..sharing.folder import ModelFolder
    from ..sharing.use import model_config

    if config is not None and "=" in config:  # an override where CONFIG would stand
        overrides, config = [config, *overrides], None
    if config is not None or checkpoint is not None:
        given = "CONFIG " + config if config is not None else "--checkpoint"
        raise ValueError(
            f"--model {model} is the model to forecast with; leave out {given} (set the store with "
            "data.store=STORE)"
        )
    return model_config(ModelFolder.open(model), overrides, world_size_from_env())


def find_checkpoint(cfg: TrainConfig, checkpoint: str | None) -> Path:
    """``--checkpoint`` as given, else the newest complete checkpoint of ``run.dir``."""
    if checkpoint is not None:
        read_meta(checkpoint)  # complete, or an error naming what is missing
        return Path(checkpoint)
    found = latest_checkpoint(cfg.run.dir)
    if found is None:
        raise FileNotFoundError(
            f"no checkpoint in run directory {cfg.run.dir!r}: train first (jigsaw-earth train) "
            f"or pass --checkpoint"
        )
    return found


def check_against_checkpoint(cfg: TrainConfig, checkpoint: Path) -> None:
    """Refuse a config whose model shape or channels differ from the checkpoint's run config.

    The checkpoint's config is its run directory's ``config.yaml`` (written by ``train``); a
    checkpoint copied without it is checked tensor by tensor when loaded.
    """
    saved_file = checkpoint.parent.parent / "config.yaml"
    if not saved_file.is_file():
        return
    try:
        saved = yaml.safe_load(saved_file.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return
    fix = "predict with the configuration it was trained with (drop the override of {item})"
    compare_shape_keys(cfg, saved, f"the config of checkpoint {checkpoint} ({saved_file})", fix)


def protected_paths(
    cfg: TrainConfig, checkpoint: Path, model: bool = False
) -> tuple[tuple[str, str | Path | None], ...]:
    """What ``predict --out`` may never be, contain or lie inside (``model``: ``checkpoint`` is a
    shared model's folder, ``predict --model``)."""
    d = cfg.data
    stores = (
        ("truth/training store data.store", d.store),
        ("climatology", d.climatology or default_climatology_path(d.store)),
    )
    if model:
        return (*stores, ("model folder", checkpoint))
    return (
        *stores,
        ("checkpoint folder", checkpoint.parent),
        ("checkpoints of run.dir", Path(cfg.run.dir) / "checkpoints"),
    )
