"""Normalisation layers, exact under any domain sharding.

* ``LayerNorm`` normalises over channels. Each token holds all its channels, so the statistics
  are local; only the affine ``weight``/``bias`` (canonical shape ``(C,)``) are sharded over the
  domain ranks and gathered at use (the gather's backward reduce-scatters, which sums the weight
  gradient over every token of the globe).
* ``GroupNorm`` / ``InstanceNorm`` normalise each (sample, group) over the *whole* domain. The
  statistics are two-pass: the global mean first (an ``all_reduce`` of per-tile sums), then the
  global sums of the deviations from it and of their squares (a second ``all_reduce``; the first
  corrects the mean's rounding), all divided by the global element count, so uneven tiles are
  exact and there is no ``E[x²] − E[x]²`` cancellation.
  Statistics are computed in float32 whatever the input dtype, and under autocast the output is
  float32, as for ``F.group_norm``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed.collectives import all_gather, all_reduce
from ..distributed.comm import comm_site
from .base import Domain, sharded_parameter

__all__ = ["GroupNorm", "InstanceNorm", "LayerNorm", "gather_affine"]


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


class _AffineNorm(nn.Module):
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

    def _affine(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
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


class GroupNorm(_AffineNorm):
    """Group norm of a field tile ``(B, C, h, w)`` with statistics over the whole global grid.

    Equals ``F.group_norm(x_global, num_groups, weight, bias, eps)``.
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = self._tile_shape
        if x.dim() != 4 or x.shape[1] != self.channels or tuple(x.shape[2:]) != (h, w):
            raise ValueError(
                f"{type(self).__name__} expects this rank's field tile (B, {self.channels}, {h}, {w}), "
                f"got {tuple(x.shape)}"
            )
        weight, bias = self._affine()
        autocast = torch.is_autocast_enabled(x.device.type)
        out_dtype = torch.float32 if autocast else x.dtype
        B, C, G = x.shape[0], self.channels, self.num_groups
        count = (C // G) * self.domain.grid.n_lat * self.domain.grid.n_lon
        with torch.autocast(x.device.type, enabled=False), comm_site(type(self).__name__):
            xg = x.float().reshape(B, G, -1)
            mean = all_reduce(xg.sum(-1), self.domain.axis) / count
            xc = xg - mean.unsqueeze(-1)
            # corrected two-pass: the second reduction also re-centres (fixes the mean's rounding)
            moments = all_reduce(torch.stack([xc.sum(-1), xc.square().sum(-1)], -1), self.domain.axis) / count
            shift, var = moments[..., 0], moments[..., 1] - moments[..., 0].square()
            y = ((xc - shift.unsqueeze(-1)) * torch.rsqrt(var + self.eps).unsqueeze(-1)).reshape(x.shape)
            if weight is not None:
                y = y * weight.float().view(1, C, 1, 1) + bias.float().view(1, C, 1, 1)
        return y.to(out_dtype)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.channels}, eps={self.eps}, affine={self.weight is not None}"


class InstanceNorm(GroupNorm):
    """Instance norm (one group per channel) of a field tile ``(B, C, h, w)`` over the whole grid.

    Equals ``F.instance_norm(x_global, weight=..., bias=..., eps=eps)`` (no running statistics).
    """

    def __init__(self, domain: Domain, channels: int, eps: float = 1e-5, affine: bool = False):
        super().__init__(domain, channels, channels, eps, affine)
