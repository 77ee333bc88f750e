"""Gradient reduction of a sharded model: data replicas and parameters replicated over the domain.

Each rank backpropagates its own term of the global loss (its tile of its replica's rows), so the
gradient of a parameter is the sum of the ranks' gradients over every rank that holds the same
block:

* over the **data** axis for every parameter (the replicas hold identical blocks);
* over the **domain** axis as well for a parameter replicated on every domain rank (made with
  ``sharded_parameter(shape, None)``, or a plain ``nn.Parameter``): each copy only saw its tile.
  Without this sum the copies drift apart and the run depends on the mesh.

A block held by some but not all domain ranks has no group to be summed over and is refused.
Both sums are bucketed (flat buffers in a fixed order, so the result is deterministic) and go
through ``comm.all_reduce_``: the ledger counts them under ``grad.data`` and ``grad.replicated``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from .comm import all_reduce_, comm_site
from .mesh import Axis, DomainMesh

__all__ = ["check_replicas", "domain_holders", "reduce_gradients", "replication", "sum_gradients"]

BUCKET_ELEMS = 1 << 22


def _block_key(p: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    spec = getattr(p, "_jigsaw_spec", None)
    offsets = tuple(spec.offsets) if spec is not None else (0,) * p.dim()
    return offsets, tuple(p.shape)


def domain_holders(
    params: Sequence[torch.Tensor], mesh: DomainMesh, names: Sequence[str] | None = None
) -> list[int]:
    """How many domain ranks hold each parameter's block (collective over the domain axis).

    1 for a sharded block, the domain size for a replicated one; a block held by some but not all
    domain ranks is refused with the parameter's name.
    """
    axis = mesh.domain
    if axis.size == 1:
        return [1] * len(params)
    keys = [_block_key(p) for p in params]
    everyone: list = [None] * axis.size
    dist.all_gather_object(everyone, keys, group=axis.group)
    if any(len(k) != len(keys) for k in everyone):
        raise ValueError(
            "domain ranks hold different numbers of parameters; the model must be built identically"
        )
    holders = []
    for i, key in enumerate(keys):
        n = Counter(k[i] for k in everyone)[key]
        if 1 < n < axis.size and params[i].numel():
            name = names[i] if names is not None else f"#{i} of shape {tuple(params[i].shape)}"
            raise ValueError(
                f"parameter {name} is held identically by {n} of {axis.size} domain ranks, so its gradient "
                "cannot be summed over them; shard it over all domain ranks (sharded_parameter(shape, dim, "
                "*domain.split(n))) or replicate it on all of them (sharded_parameter(shape, None))"
            )
        holders.append(n)
    return holders


def check_replicas(
    params: Sequence[torch.Tensor], holders: Sequence[int], names: Sequence[str], mesh: DomainMesh
) -> None:
    """Refuse replicated parameters whose copies differ between domain ranks (collective, at set-up).

    A replicated parameter's value must not depend on the rank: a plain ``nn.Parameter`` drawn from
    torch's global generator in ``__init__`` may differ, and its copies would then never agree.
    """
    axis = mesh.domain
    picked = [(p, n) for p, h, n in zip(params, holders, names, strict=True) if h == axis.size and h > 1]
    if not picked:
        return
    flat = torch.cat([p.detach().reshape(-1).double() for p, _ in picked])
    low, high = flat.clone(), flat.clone()
    all_reduce_(low, axis, op="replicas.min", reduce=dist.ReduceOp.MIN)
    all_reduce_(high, axis, op="replicas.max", reduce=dist.ReduceOp.MAX)
    differs = (low != high) & ~(flat.isnan())
    if bool(differs.any()):
        at, offset = int(differs.nonzero()[0]), 0
        for p, name in picked:
            if at < offset + p.numel():
                raise ValueError(
                    f"replicated parameter {name} has different values on the domain ranks; initialise it "
                    "deterministically: make it with sharded_parameter(shape, None) and fill it in the "
                    "layer's reset_parameters(seed, key), or use a plain torch layer (init_model seeds it)"
                )
            offset += p.numel()


def replication(model: nn.Module, mesh: DomainMesh) -> list[int]:
    """``domain_holders`` of the model's trainable parameters, after checking replicated copies agree."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    names, params = [n for n, _ in named], [p for _, p in named]
    holders = domain_holders(params, mesh, names)
    check_replicas(params, holders, names, mesh)
    return holders


def reduce_gradients(
    params: Sequence[nn.Parameter], axis: Axis, *, op: str, bucket_elems: int = BUCKET_ELEMS
) -> None:
    """Sum the gradients of ``params`` over ``axis`` in flat buckets; a missing gradient counts as 0."""
    if axis.size == 1 or not params:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    bucket: list[nn.Parameter] = []
    size = 0
    for p in [*params, None]:
        if p is not None:
            bucket.append(p)
            size += p.numel()
        if bucket and (p is None or size >= bucket_elems):
            flat = torch.cat([q.grad.reshape(-1) for q in bucket])
            all_reduce_(flat, axis, op=op)
            offset = 0
            for q in bucket:
                q.grad.copy_(flat[offset : offset + q.numel()].view_as(q.grad))
                offset += q.numel()
            bucket, size = [], 0


def sum_gradients(
    params: Sequence[nn.Parameter],
    mesh: DomainMesh,
    holders: Sequence[int] | None = None,
    bucket_elems: int = BUCKET_ELEMS,
) -> None:
    """Once per step: sum every gradient over the replicas (data × ensemble: every group holding the
    same weights) and replicated ones over the domain axis.

    ``holders`` is ``domain_holders(params, mesh)`` (found once at set-up); without it no
    parameter is taken as replicated.
    """
    with comm_site("gradients"):
        reduce_gradients(params, mesh.replicas, op="grad.data", bucket_elems=bucket_elems)
        if holders is not None and mesh.domain.size > 1:
            replicated = [p for p, n in zip(params, holders, strict=True) if n == mesh.domain.size]
            reduce_gradients(replicated, mesh.domain, op="grad.replicated", bucket_elems=bucket_elems)
