"""Autograd-aware collectives along one mesh axis, exact for uneven shard sizes.

Each forward has its exact adjoint as backward:

=================  =========================  ==========================
function           forward                    backward
=================  =========================  ==========================
``all_gather``     concat shards along dim    reduce-scatter of the grad
``reduce_scatter`` sum, keep own slice        all-gather of the grad
``all_reduce``     sum over the axis          all-reduce of the grad
=================  =========================  ==========================

Shard sizes along ``dim`` are passed explicitly (``sizes``, one per axis position), so no
collective needs padding and every rank knows every buffer size in advance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .comm import all_reduce_, exchange, run_exchange
from .mesh import Axis

__all__ = ["all_gather", "all_reduce", "reduce_scatter"]

ShardOp = Callable[[torch.Tensor, Axis, int, Sequence[int], str], torch.Tensor]  # (x, axis, dim, sizes, op)


def _gather(x: torch.Tensor, axis: Axis, dim: int, sizes: Sequence[int], op: str) -> torch.Tensor:
    if axis.size == 1:
        return x
    me = axis.index
    if x.shape[dim] != sizes[me]:
        raise ValueError(f"{op}: local size {x.shape[dim]} along dim {dim}, expected {sizes[me]}")
    peers = [k for k in range(axis.size) if k != me]
    shape = list(x.shape)

    def shape_of(k: int) -> tuple[int, ...]:
        shape[dim] = sizes[k]
        return tuple(shape)

    pending = exchange(
        axis,
        [(axis.ranks[k], x) for k in peers],
        [(axis.ranks[k], shape_of(k)) for k in peers],
        op=op,
        dtype=x.dtype,
        device=x.device,
    )
    got = dict(zip(peers, pending.wait()))
    got[me] = x
    return torch.cat([got[k] for k in range(axis.size)], dim=dim)


def _scatter_sum(x: torch.Tensor, axis: Axis, dim: int, sizes: Sequence[int], op: str) -> torch.Tensor:
    if axis.size == 1:
        return x
    me = axis.index
    if x.shape[dim] != sum(sizes):
        raise ValueError(f"{op}: size {x.shape[dim]} along dim {dim}, expected {sum(sizes)}")
    pieces = torch.split(x, list(sizes), dim=dim)
    peers = [k for k in range(axis.size) if k != me]
    pending = exchange(
        axis,
        [(axis.ranks[k], pieces[k]) for k in peers],
        [(axis.ranks[k], pieces[me].shape) for k in peers],
        op=op,
        dtype=x.dtype,
        device=x.device,
    )
    out = pieces[me].clone()
    for buf in pending.wait():
        out += buf
    return out


class _ShardCollective(torch.autograd.Function):
    """``forward`` runs ``fwd`` (``_gather`` or ``_scatter_sum``), ``backward`` its adjoint ``bwd``."""

    @staticmethod
    def forward(ctx, x, axis, dim, sizes, fwd, bwd, op):  # type: ignore[override]
        ctx.args = (axis, dim, sizes, bwd, op)
        return fwd(x, axis, dim, sizes, op)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        axis, dim, sizes, bwd, op = ctx.args
        return bwd(grad.contiguous(), axis, dim, sizes, f"{op}.backward"), *[None] * 6


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axis):  # type: ignore[override]
        ctx.axis = axis
        return all_reduce_(x.clone(), axis)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return all_reduce_(grad.clone(), ctx.axis, op="all_reduce.backward"), None


def _norm_dim(x: torch.Tensor, dim: int) -> int:
    return dim % x.dim()


def _shard_collective(
    x: torch.Tensor, axis: Axis, dim: int, sizes: Sequence[int], fwd: ShardOp, bwd: ShardOp, op: str
) -> torch.Tensor:
    if axis.size == 1:
        return x
    return run_exchange(_ShardCollective.apply, x, axis, _norm_dim(x, dim), tuple(sizes), fwd, bwd, op)


def all_gather(x: torch.Tensor, axis: Axis, dim: int, sizes: Sequence[int]) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` in axis order; shard ``k`` has ``sizes[k]``."""
    return _shard_collective(x, axis, dim, sizes, _gather, _scatter_sum, "all_gather")


def reduce_scatter(x: torch.Tensor, axis: Axis, dim: int, sizes: Sequence[int]) -> torch.Tensor:
    """Sum ``x`` over the axis and keep this rank's slice (``sizes`` split ``dim``)."""
    return _shard_collective(x, axis, dim, sizes, _scatter_sum, _gather, "reduce_scatter")


def all_reduce(x: torch.Tensor, axis: Axis) -> torch.Tensor:
    """Sum of ``x`` over the axis, on every rank."""
    if axis.size == 1:
        return x
    return run_exchange(_AllReduce.apply, x, axis)
