"""Latitude-weighted MSE over the GLOBAL domain and global batch, identical on every mesh.

Each rank holds one tile of its replica's part of the global batch. The loss is

    L = Σ_{b,k,c,i,j} w_lat[i] · w_c[c] · (pred − target)² / (B_global · K · C · H · W)

with ``w_lat`` the WB2 latitude weights (mean 1 over the global grid) and ``w_c`` the per-channel
weights (per-variable × per-level). Each rank computes the sum over its own tile and samples and
divides by the *global* count, so

* the **gradient** flows from this local term only: the loss is the sum of the local terms over
  every rank, so the local term's gradient is exactly this rank's share (a cotangent per tile,
  like the layer harness uses). Backpropagating an all-reduced value would multiply the
  gradient by the domain size, because the all-reduce's adjoint is itself an all-reduce;
* the **value** is the detached local term summed over the domain and data axes (``global_value``).

Parameter gradients are then summed (not averaged) over the data axis (``optim.sync_gradients``).

``TrainingLoss`` holds the loss section's knobs as the trainer uses them: the channel weights,
tendency scaling (the weights divided by each channel's tendency variance; the CRPS kinds compare
fields in units of the tendency std instead, their L1 analogue) and the choice of MSE or an ensemble
loss (``crps.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ..distributed.comm import all_reduce_
from ..distributed.mesh import DomainMesh
from .crps import ensemble_loss

if TYPE_CHECKING:
    from ..config.schema import TrainConfig
    from ..data.samples import TrainData

__all__ = ["TrainingLoss", "channel_weights", "global_value", "weighted_sq_error"]


def channel_weights(
    channels: Sequence[str], variable_weights: dict[str, float], level_weights: dict[int, float]
) -> torch.Tensor:
    """``(C,)`` weight per channel: ``variable_weights[name or variable] × level_weights[level]``.

    Channel names are ``variable@level`` (upper air) or the surface variable's name.
    """
    out = []
    for name in channels:
        var, _, lev = name.partition("@")
        w = variable_weights.get(name, variable_weights.get(var, 1.0))
        if lev:
            w *= level_weights.get(int(lev), 1.0)
        out.append(float(w))
    return torch.tensor(out, dtype=torch.float32)


def weighted_sq_error(
    pred: torch.Tensor, target: torch.Tensor, lat_weights: torch.Tensor, ch_weights: torch.Tensor
) -> torch.Tensor:
    """Σ w_lat · w_c · (pred − target)² over this rank's ``(B, C, h, w)`` tile (float32 scalar).

    ``lat_weights`` is the tile's rows ``(h,)`` of the global weights; ``ch_weights`` is ``(C,)``.
    """
    if pred.shape != target.shape:
        raise ValueError(f"prediction {tuple(pred.shape)} and target {tuple(target.shape)} differ in shape")
    err = (pred.float() - target.float()).square()
    w = ch_weights.view(1, -1, 1, 1) * lat_weights.view(1, 1, -1, 1)
    return (err * w).sum()


def global_value(local: torch.Tensor, mesh: DomainMesh) -> torch.Tensor:
    """Sum of a detached per-rank scalar over every rank (domain and data axes)."""
    value = local.detach().double().clone()
    if mesh.is_distributed and dist.is_initialized():
        all_reduce_(value, mesh.world, op="loss.value")
    return value


class TrainingLoss:
    """The configured loss of a training step (``cfg.loss``), its constant weights on the mesh's device.

    ``tendency`` is the ``(C,)`` tendency std under ``loss.tendency_scaling`` (the model step scales its
    residual by it too), else ``None``; ``count`` is the global number of terms, ``B_global · K · C · H · W``.
    """

    def __init__(self, cfg: TrainConfig, data: TrainData, mesh: DomainMesh):
        loss, dev = cfg.loss, mesh.device
        self.kind, self.alpha, self.mse_weight = loss.kind, loss.alpha, loss.mse_weight
        self.members, self.ensemble = cfg.training.members, mesh.ensemble
        weights = channel_weights(data.channels, loss.variable_weights, loss.level_weights)
        self.tendency = data.tendency_std.to(dev) if loss.tendency_scaling else None
        self.crps_weights, self.crps_scale = weights.to(dev), None
        if self.tendency is not None:
            weights = weights / data.tendency_std.square()
            self.crps_scale = (1.0 / data.tendency_std).view(1, -1, 1, 1).to(dev)
        self.ch_weights = weights.to(dev)
        self.lat_weights = data.lat_weights.to(dev)
        g, t = data.grid, cfg.training
        self.count = t.batch_size * t.rollout_steps * len(data.channels) * g.n_lat * g.n_lon

    def step_term(self, state: torch.Tensor, target: torch.Tensor, members: int) -> torch.Tensor:
        """This rank's share of one rollout step's sum (divide the steps' total by ``count``): ``state``
        ``(members · B, C, h, w)`` the members batched on this rank (member-major rows), ``target``
        ``(B, C, h, w)``; the ensemble axis holds the other members."""
        if self.members == 1 and self.kind == "mse":
            return weighted_sq_error(state, target, self.lat_weights, self.ch_weights)
        pred, w = state.view(members, -1, *state.shape[1:]), self.ch_weights
        if self.kind != "mse" and self.crps_scale is not None:  # in tendency-std units
            pred, target, w = pred * self.crps_scale, target * self.crps_scale, self.crps_weights
        return ensemble_loss(
            self.kind, pred, target, self.lat_weights, w, n_members=self.members, alpha=self.alpha,
            mse_weight=self.mse_weight, members=self.ensemble,
        )  # fmt: skip
