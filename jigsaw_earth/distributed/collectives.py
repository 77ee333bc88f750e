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

from collections.abc import Sequence

import torch

from .comm import all_reduce_, exchange, run_exchange
from .mesh import Axis

__all__ = ["all_gather", "all_reduce", "reduce_scatter"]


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


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axis, dim, sizes):  # type: ignore[override]
        ctx.args = (axis, dim, sizes)
        return _gather(x, axis, dim, sizes, "all_gather")

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        axis, dim, sizes = ctx.args
        return _scatter_sum(grad, axis, dim, sizes, "all_gather.backward"), None, None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axis, dim, sizes):  # type: ignore[override]
        ctx.args = (axis, dim, sizes)
        return _scatter_sum(x, axis, dim, sizes, "reduce_scatter")

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        axis, dim, sizes = ctx.args
        return _gather(grad.contiguous(), axis, dim, sizes, "reduce_scatter.backward"), None, None, None


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


def all_gather(x: torch.Tensor, axis: Axis, dim: int, sizes: Sequence[int]) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` in axis order; shard ``k`` has ``sizes[k]``."""
    if axis.size == 1:
        return x
    return run_exchange(_AllGather.apply, x, axis, _norm_dim(x, dim), tuple(sizes))


def reduce_scatter(x: torch.Tensor, axis: Axis, dim: int, sizes: Sequence[int]) -> torch.Tensor:
    """Sum ``x`` over the axis and keep this rank's slice (``sizes`` split ``dim``)."""
    if axis.size == 1:
        return x
    return run_exchange(_ReduceScatter.apply, x, axis, _norm_dim(x, dim), tuple(sizes))


def all_reduce(x: torch.Tensor, axis: Axis) -> torch.Tensor:
    """Sum of ``x`` over the axis, on every rank."""
    if axis.size == 1:
        return x
    return run_exchange(_AllReduce.apply, x, axis)
