"""AdamW with state sharded like the parameters, warmup + cosine schedule, exact global clipping.

* **Sharded state**: every rank's optimizer holds only its parameter shards, so AdamW's moments
  are sharded exactly like the weights (no rank holds a full moment tensor).
* **Data parallelism**: gradients are summed over the data axis in flat buckets (the loss is
  already divided by the global batch), which equals the gradient of the global batch. This is
  what DDP does, written out so the order of reduction is fixed and the sharded parameters need
  no wrapper. Parameters replicated on every domain rank are summed over the domain axis too
  (``distributed/grads.py``), so their copies stay identical.
* **Global norm**: the squared norm of each shard is summed over the domain axis, every
  element counted once: a parameter block held by several domain ranks (replicated, e.g. a
  ``dim=None`` parameter) is weighted by 1 / (number of holders), found once at set-up by
  comparing the ShardSpec offsets of every rank. After the data-axis sum the gradients are equal
  on every replica, so the norm is the same on every rank and on every mesh.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..config.schema import OptimConfig
from ..distributed.comm import all_reduce_
from ..distributed.grads import domain_holders, sum_gradients
from ..distributed.mesh import DomainMesh

__all__ = ["build_optimizer", "clip_grad_norm", "lr_at", "replication_weights", "sync_gradients"]


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW over this rank's shards; weight decay on matrices only (not biases or norm scales)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            global_shape = getattr(getattr(p, "_jigsaw_spec", None), "global_shape", p.shape)
            (decay if len(global_shape) >= 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    fused = cfg.implementation == "fused" or (
        cfg.implementation == "auto" and any(p.is_cuda for g in groups for p in g["params"])
    )
    return torch.optim.AdamW(
        [g for g in groups if g["params"]], lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
        foreach=False, fused=fused or None,
    )  # fmt: skip


def lr_at(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup, then cosine to min_lr."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * progress))


def sync_gradients(
    params: list[nn.Parameter],
    mesh: DomainMesh,
    holders: list[int] | None = None,
    bucket_elems: int = 1 << 22,
) -> None:
    """Sum gradients over the data axis, and those of replicated parameters over the domain axis.

    ``holders`` is ``distributed.grads.domain_holders(params, mesh)``; the rule lives there.
    """
    sum_gradients(params, mesh, holders, bucket_elems)


def replication_weights(params: list[nn.Parameter], mesh: DomainMesh) -> list[float]:
    """1 / (number of domain ranks holding the same block) for each parameter (collective)."""
    return [1.0 / n for n in domain_holders(params, mesh)]


def clip_grad_norm(
    params: list[nn.Parameter], weights: list[float], max_norm: float, mesh: DomainMesh
) -> torch.Tensor:
    """Global gradient norm over all shards (call after ``sync_gradients``); clip to ``max_norm``.

    Returns the norm before clipping as a float64 scalar on the gradients' device, and clips there:
    no host round trip. ``max_norm <= 0`` only measures; a non-finite norm leaves the gradients as
    they are (the caller skips or stops the step).
    """
    grads = [(p.grad, w) for p, w in zip(params, weights, strict=True) if p.grad is not None]
    device = grads[0][0].device if grads else mesh.device
    total = torch.zeros((), dtype=torch.float64, device=device)
    for g, w in grads:
        total += w * g.detach().double().square().sum()
    all_reduce_(total, mesh.domain, op="grad_norm")
    norm = total.sqrt()
    if max_norm > 0 and grads:
        scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        scale = torch.where(torch.isfinite(norm), scale, torch.ones_like(scale))
        torch._foreach_mul_([g for g, _ in grads], scale.to(grads[0][0].dtype))
    return norm
