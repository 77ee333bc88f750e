"""Normalisation layers, exact under any domain sharding.

* ``LayerNorm`` normalises over channels. Each token holds all its channels, so the statistics
  are local; only the affine ``weight``/``bias`` (canonical shape ``(C,)``) are sharded over the
  domain ranks and gathered at use (the gather's backward reduce-scatters, which sums the weight
  gradient over every token of the globe).
* ``GroupNorm`` / ``InstanceNorm`` normalise each (sample, group) over the *whole* domain. On one
  rank they are exactly ``F.group_norm``. On P ranks (``_GroupNormFn``): one fused statistics
  pass over the tile (``torch.var_mean``) gives each rank its ``(count, mean, M2)`` per (sample,
  group); one all-reduce of a small zero-padded ``(P, B, G, 2)`` tensor hands every rank every
  rank's figures, merged exactly (Chan et al.'s parallel variance, in float64, the same order on
  every rank), so uneven tiles are exact and there is no ``E[x²] − E[x]²`` cancellation; then
  the affine apply in one op. The backward is the closed-form group-norm backward with one
  all-reduce of the ``(B, G, 2)`` sums ``Σ w·dy`` and ``Σ w·dy·x̂``. Statistics are float32 for
  bf16/fp16 inputs (float64 stays float64); under autocast the output has the dtype
  ``F.group_norm`` gives there (float32 on CUDA, the input's on CPU).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed.collectives import all_gather
from ..distributed.comm import all_reduce_, comm_site, run_exchange
from ..distributed.mesh import Axis
from .base import Domain, sharded_parameter
from .channels import ChannelDim, ChannelDims
from .cost import Cost, all_reduce_bytes, gather_bytes
from .replicas import Replicating

__all__ = ["GroupNorm", "InstanceNorm", "LayerNorm", "gather_affine", "prefetch_affine", "release_affine"]

_LOW = (torch.bfloat16, torch.float16)


def gather_affine(
    weight: torch.Tensor | None, bias: torch.Tensor | None, domain: Domain, channels: int
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The full ``(C,)`` weight and bias from their shards, in one all-gather (autograd-aware)."""
    present = [t for t in (weight, bias) if t is not None]
    if not present or domain.size == 1:
        return weight, bias
    full = all_gather(torch.stack(present), domain.axis, dim=1, sizes=domain.split_sizes(channels))
    parts = iter(full.unbind(0))
    return (next(parts) if weight is not None else None), (next(parts) if bias is not None else None)


def prefetch_affine(model: nn.Module) -> tuple[_AffineNorm, ...]:
    """Gather the affine weights and biases of every sharded norm of ``model`` in ONE all-gather
    (per domain axis) for one forward, instead of one per norm and use: one rendezvous of the ranks
    instead of dozens, and one reduce-scatter of all their gradients in the backward. The values
    and gradients are those of ``gather_affine`` (the same gather, then a selection: its backward
    adds each norm's gradient into place before the one reduce-scatter).

    Returns the norms now holding their gathered affine; pass them to ``release_affine`` when the
    forward ends. A norm used after that (a recompute under activation checkpointing) gathers its
    own. No context manager: under ``torch.compile`` the forward between the two calls is compiled
    around its exchanges (one around them would make Dynamo skip it); a forward that raises leaves
    the norms holding values of their current parameters until the next forward replaces them.
    An exchange, run through ``run_exchange`` (eagerly under ``torch.compile``)."""
    return run_exchange(_hold_affine, model)


def _hold_affine(model: nn.Module) -> tuple[_AffineNorm, ...]:
    groups: dict[tuple[int, ...], list[_AffineNorm]] = {}
    for m in model.modules():  # a norm holding its gathered affine (replicas.py) needs no gather
        if isinstance(m, _AffineNorm) and m.weight is not None and m.domain.size > 1 and m.replica() is None:
            groups.setdefault(m.domain.axis.ranks, []).append(m)
    held: list[_AffineNorm] = []
    for norms in groups.values():
        if len(norms) > 1:
            for m, wb in zip(norms, _gather_all(norms)):
                m._prefetched = wb
            held.extend(norms)
    return tuple(held)


def release_affine(norms: tuple[_AffineNorm, ...]) -> None:
    """End ``prefetch_affine``'s hold: the norms gather their own affine again."""
    for m in norms:
        m._prefetched = None


def _gather_all(norms: list[_AffineNorm]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every norm's full ``(weight, bias)`` from one all-gather of all their shards."""
    d = norms[0].domain
    sizes = tuple(tuple(d.split_sizes(m.channels)) for m in norms)  # per norm: every rank's shard
    local = torch.cat([torch.stack([m.weight, m.bias]).reshape(-1) for m in norms])
    per_rank = [2 * sum(s[r] for s in sizes) for r in range(d.size)]
    with comm_site("LayerNorm"):
        flat = all_gather(local, d.axis, dim=0, sizes=per_rank)
    picked = flat[_affine_index(sizes).to(flat.device)]
    parts = picked.split([m.channels for m in norms for _ in (0, 1)])
    return [(parts[2 * i], parts[2 * i + 1]) for i in range(len(norms))]


@functools.cache
def _affine_index(sizes: tuple[tuple[int, ...], ...]) -> torch.Tensor:
    """Positions in ``_gather_all``'s gathered vector of each norm's full weight, then its bias:
    rank ``r``'s block holds, norm after norm, that norm's weight shard then its bias shard."""
    ranks = range(len(sizes[0]))
    per_rank = [2 * sum(s[r] for s in sizes) for r in ranks]
    starts = [sum(per_rank[:r]) for r in ranks]
    index, offset = [], [0 for _ in ranks]
    for s in sizes:
        for part in (0, 1):
            for r in ranks:
                first = starts[r] + offset[r] + part * s[r]
                index.extend(range(first, first + s[r]))
        for r in ranks:
            offset[r] += 2 * s[r]
    return torch.tensor(index, dtype=torch.int64)


class _AffineNorm(Replicating, nn.Module):
    """Shared parameter handling: ``weight`` (ones) and ``bias`` (zeros), shards of ``(C,)``."""

    jigsaw_layer = True

    def __init__(self, domain: Domain, channels: int, affine: bool):
        super().__init__()
        self.domain, self.channels = domain, channels
        start, stop = domain.split(channels)
        self.weight = sharded_parameter((channels,), 0, start, stop) if affine else None
        self.bias = sharded_parameter((channels,), 0, start, stop) if affine else None
        self.reset_parameters()

    def reset_parameters(self, seed: int = 0, key: str = "norm") -> None:
        """torch's default: weight 1, bias 0 (deterministic, so trivially mesh-invariant)."""
        if self.weight is not None:
            with torch.no_grad():
                self.weight.fill_(1.0)
                self.bias.fill_(0.0)

    def channel_dims(
        self, inputs: Sequence[str] | None = None, outputs: Sequence[str] | None = None
    ) -> ChannelDims:
        """Scale and shift by channel (``inputs`` or ``outputs``: the same channels); an added
        channel keeps the fresh 1 and 0. The statistics of a norm *over* channels change when
        channels are added or removed, so the kept channels' output only starts near the parent's."""
        names = inputs if inputs is not None else outputs
        if names is None or self.weight is None:
            return {}
        dim = (ChannelDim(0, tuple(names), zero_new=False),)
        return {"weight": dim, "bias": dim}

    def cost(self, batch: int, elsize: int = 4, input_grad: bool = True) -> Cost:
        """The affine all-gather; the input and the fp32 statistics are saved."""
        d = self.domain
        n = d.counts(batch)[d.index] * self.channels
        stats = batch * d.tile.shape[0] * d.tile.shape[1] if isinstance(self, LayerNorm) else 0
        gather = gather_bytes(d.split_sizes(self.channels), 2 if self.weight is not None else 0, elsize)
        return Cost(
            bytes={"norm.affine": gather} if d.size > 1 else {},
            flops=(8 * n, 16 * n),
            saved=n * elsize + 2 * stats * 4,
            peak=n * elsize,
        )

    _prefetched: tuple[torch.Tensor, torch.Tensor] | None = None  # set by ``prefetch_affine``

    def gather_replica(self) -> tuple[torch.Tensor, ...]:
        """The whole affine weight and bias (``replicas.py``; collective); none without affine."""
        if self.weight is None:
            return ()
        with comm_site(type(self).__name__):
            return gather_affine(self.weight, self.bias, self.domain, self.channels)  # type: ignore[return-value]

    def replica_numel(self) -> int:
        return 0 if self.weight is None else 2 * self.channels

    def _affine(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        replica = self.replica()
        if replica:
            return replica  # type: ignore[return-value]
        if self._prefetched is not None:
            return self._prefetched
        with comm_site(type(self).__name__):
            return gather_affine(self.weight, self.bias, self.domain, self.channels)


class LayerNorm(_AffineNorm):
    """Layer norm over channels of a token tile ``(B, h, w, C)``, or of a field ``(B, C, h, w)``
    with ``channels_first=True``. Equals ``F.layer_norm`` over the channel dim of the global tensor.
    """

    def __init__(
        self,
        domain: Domain,
        channels: int,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        channels_first: bool = False,
    ):
        super().__init__(domain, channels, elementwise_affine)
        self.eps, self.channels_first = eps, channels_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cdim = 1 if self.channels_first else -1
        if x.dim() < 2 or x.shape[cdim] != self.channels:
            layout = "(B, C, h, w)" if self.channels_first else "(B, h, w, C)"
            raise ValueError(
                f"LayerNorm expects {self.channels} channels in dim {cdim} of a {layout} tile, "
                f"got shape {tuple(x.shape)}"
            )
        weight, bias = self._affine()
        if self.channels_first:
            x = x.movedim(1, -1)
        y = F.layer_norm(x, (self.channels,), weight, bias, self.eps)
        return y.movedim(-1, 1) if self.channels_first else y

    def extra_repr(self) -> str:
        affine = self.weight is not None
        return f"{self.channels}, eps={self.eps}, affine={affine}, channels_first={self.channels_first}"


@functools.cache
def _autocast_dtype(device_type: str, dtype: torch.dtype, autocast_dtype: torch.dtype) -> torch.dtype:
    """The output dtype of ``F.group_norm`` on ``dtype`` input under autocast (fp32 on CUDA,
    the input's on CPU): the sharded norm returns the same."""
    with torch.autocast(device_type, dtype=autocast_dtype):
        return F.group_norm(torch.zeros(1, 1, 2, dtype=dtype, device=device_type), 1).dtype


def _merge_stats(local: torch.Tensor, counts: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Chan et al.: every rank's ``(mean, M2)`` in ``local (P, B, G, 2)`` with ``counts (P,)``
    elements each → the global ``(mean, M2)`` of shape ``(B, G)``, in float64."""
    stats = local.double()
    n = counts.double().view(-1, 1, 1)
    mean = (n * stats[..., 0]).sum(0) / total
    m2 = stats[..., 1].sum(0) + (n * (stats[..., 0] - mean).square()).sum(0)
    return mean, m2


class _GroupNormFn(torch.autograd.Function):
    """Group norm of a tile ``(B, C, h, w)`` with statistics over every rank's tile."""

    @staticmethod
    def forward(ctx, x, weight, bias, axis: Axis, groups: int, eps: float, counts: torch.Tensor, total: int):  # type: ignore[override]
        B, C = x.shape[:2]
        dt = torch.float32 if x.dtype in _LOW else x.dtype
        xs = x.to(dt)
        var, mean = torch.var_mean(xs.reshape(B, groups, -1), dim=-1, correction=0)
        n_local = xs[0, : C // groups].numel()
        local = xs.new_zeros(axis.size, B, groups, 2)
        local[axis.index] = torch.stack([mean, var * n_local], dim=-1)
        all_reduce_(local, axis, op="group_norm.stats")
        g_mean, m2 = _merge_stats(local, counts, total)
        rstd = torch.rsqrt(m2 / total + eps).to(dt)
        g_mean = g_mean.to(dt)
        per = C // groups
        scale = rstd.repeat_interleave(per, dim=1)  # (B, C)
        if weight is not None:
            scale = scale * weight.to(dt)
        shift = -g_mean.repeat_interleave(per, dim=1) * scale
        if bias is not None:
            shift = shift + bias.to(dt)
        y = torch.addcmul(shift[:, :, None, None], xs, scale[:, :, None, None])
        ctx.save_for_backward(x, weight, g_mean, rstd)
        ctx.args = (axis, groups, total, bias is not None)
        return y

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, weight, mean, rstd = ctx.saved_tensors
        axis, groups, total, has_bias = ctx.args
        B, C = x.shape[:2]
        per, dt = C // groups, rstd.dtype
        dy = dy.to(dt)
        bc = (B, C, 1, 1)
        mean_c, rstd_c = mean.repeat_interleave(per, dim=1), rstd.repeat_interleave(per, dim=1)
        xhat = torch.addcmul((-mean_c * rstd_c).view(bc), x.to(dt), rstd_c.view(bc))
        t = (dy * xhat).sum((2, 3))  # (B, C): Σ dy·x̂
        u = dy.sum((2, 3))  # (B, C): Σ dy
        w = weight.to(dt) if weight is not None else None
        wt, wu = (t * w, u * w) if w is not None else (t, u)
        sums = torch.stack([wu.view(B, groups, per).sum(-1), wt.view(B, groups, per).sum(-1)], dim=-1)
        all_reduce_(sums, axis, op="group_norm.backward")
        s1, s2 = (sums[..., i].repeat_interleave(per, dim=1) / total for i in (0, 1))
        a = rstd_c * w if w is not None else rstd_c
        dx = None
        if ctx.needs_input_grad[0]:
            dx = torch.addcmul(
                torch.addcmul((-rstd_c * s1).view(bc), xhat, (-rstd_c * s2).view(bc)), dy, a.view(bc)
            )
            dx = dx.to(x.dtype)
        dw = t.sum(0).to(weight.dtype) if weight is not None and ctx.needs_input_grad[1] else None
        db = u.sum(0).to(weight.dtype) if has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db, None, None, None, None, None


def _group_norm(x, weight, bias, axis: Axis, groups: int, eps: float, counts: torch.Tensor, total: int):
    """``_GroupNormFn`` outside autocast, its output in the dtype ``F.group_norm`` gives under it."""
    dev = x.device.type
    out = x.dtype
    if torch.is_autocast_enabled(dev):
        out = _autocast_dtype(dev, x.dtype, torch.get_autocast_dtype(dev))
    with torch.autocast(dev, enabled=False):
        y = _GroupNormFn.apply(x, weight, bias, axis, groups, eps, counts, total)
    return y.to(out)


class GroupNorm(_AffineNorm):
    """Group norm of a field tile ``(B, C, h, w)`` with statistics over the whole global grid.

    Equals ``F.group_norm(x_global, num_groups, weight, bias, eps)``; on one rank it is that call.
    """

    def __init__(
        self, domain: Domain, num_groups: int, channels: int, eps: float = 1e-5, affine: bool = True
    ):
        if num_groups < 1 or channels % num_groups:
            raise ValueError(
                f"GroupNorm: {channels} channels cannot be split into {num_groups} groups; "
                f"choose a number of groups that divides {channels}"
            )
        super().__init__(domain, channels, affine)
        self.num_groups, self.eps = num_groups, eps
        self._tile_shape = domain.tile.shape  # read once: forward touches no cached_property
        per = channels // num_groups
        counts = torch.tensor([per * t.shape[0] * t.shape[1] for t in domain.grid.tiles()])
        self.register_buffer("_counts", counts, persistent=False)  # moves with the model to its device
        self._total = per * domain.grid.n_lat * domain.grid.n_lon

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = self._tile_shape
        if x.dim() != 4 or x.shape[1] != self.channels or tuple(x.shape[2:]) != (h, w):
            raise ValueError(
                f"{type(self).__name__} expects this rank's field tile (B, {self.channels}, {h}, {w}), "
                f"got {tuple(x.shape)}"
            )
        if self.domain.size == 1:
            return self._single(x)
        weight, bias = self._affine()
        args = (x, weight, bias, self.domain.axis, self.num_groups, self.eps, self._counts, self._total)
        with comm_site(type(self).__name__):
            return run_exchange(_group_norm, *args)

    def cost(self, batch: int, elsize: int = 4, input_grad: bool = True) -> Cost:
        """``_AffineNorm``'s, plus the statistics' all-reduces: ``(P, B, G, 2)`` fp32 forward,
        ``(B, G, 2)`` backward."""
        cost = super().cost(batch, elsize, input_grad)
        P = self.domain.size
        if P > 1:
            stats = batch * self.num_groups * 2 * 4
            cost.bytes["norm.stats"] = (all_reduce_bytes(P, P * stats), all_reduce_bytes(P, stats))
        return cost

    def _single(self, x: torch.Tensor) -> torch.Tensor:
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.channels}, eps={self.eps}, affine={self.weight is not None}"


class InstanceNorm(GroupNorm):
    """Instance norm (one group per channel) of a field tile ``(B, C, h, w)`` over the whole grid.

    Equals ``F.instance_norm(x_global, weight=..., bias=..., eps=eps)`` (no running statistics);
    on one rank it is that call.
    """

    def __init__(self, domain: Domain, channels: int, eps: float = 1e-5, affine: bool = False):
        super().__init__(domain, channels, channels, eps, affine)

    def _single(self, x: torch.Tensor) -> torch.Tensor:
        return F.instance_norm(x, weight=self.weight, bias=self.bias, eps=self.eps)
