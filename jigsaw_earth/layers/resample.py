"""Down- and up-sampling of field tiles for U-Net encoders and decoders, exact on any mesh.

Every output grid is split over the mesh with the standard uneven rule, independently of the
input grid; each rank gathers (``gather_windows``) exactly the input points its output tile
reads and computes locally, so odd global and tile sizes need no special care.

* ``Downsample`` — ``"conv"``: ``Conv2d`` with kernel ``2*(factor//2)+1`` (3 for factor 2),
  stride ``factor``, ``"same"`` padding under the boundary rules; ``"avgpool"``/``"maxpool"``:
  windows ``factor × factor`` at stride ``factor`` with ``ceil_mode``: no padding, the last
  window of an odd-sized grid holds the remaining points only (and averages over just those) —
  exactly ``F.avg_pool2d``/``F.max_pool2d(x, f, f, ceil_mode=True)``. All modes return
  ``ceil(n / factor)`` points per dimension (721 → 361, 33 → 17).
* ``Upsample`` — ``"transposed"``: ``ConvTranspose2d`` (kernel ``factor``, stride ``factor``);
  ``"nearest"``: torch's index rule (``F.interpolate(mode="nearest")``, source index taken from
  torch itself); ``"bilinear"``: torch's ``align_corners=False`` rule ``src = (o + 0.5)·n_in/n_out
  − 0.5``, but on the sphere: the neighbours of an edge point come from the boundary rules
  (periodic longitude; latitude zeros / replicate / across the pole) instead of clamping —
  ``lat_mode="replicate"`` reproduces torch's clamping exactly. ``out_grid`` sets the exact
  output size (default ``factor × n``), so a decoder returns to 33 rows from 17.

When ``out_channels != channels``, pooling is followed and interpolation preceded (on the
coarse grid, the cheaper side) by a 1×1 ``Conv2d``; the transposed and strided convolutions
change channels themselves.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed.comm import comm_site
from ..distributed.halo import LatMode, LonMode, gather_windows
from ..distributed.matmul import Strategy
from .base import Domain
from .conv import Conv2d, check_field
from .conv_transpose import ConvTranspose2d
from .cost import Cost, window_bytes

__all__ = ["Downsample", "Upsample", "bilinear_source", "interpolate_window", "nearest_source"]

DownMode = Literal["conv", "avgpool", "maxpool"]
UpMode = Literal["transposed", "nearest", "bilinear"]


def nearest_source(n_in: int, n_out: int) -> list[int]:
    """Source index of every output point under ``F.interpolate(mode="nearest")``."""
    probe = torch.arange(n_in, dtype=torch.float32).view(1, 1, n_in)
    return F.interpolate(probe, size=n_out, mode="nearest").view(-1).long().tolist()


def bilinear_source(n_in: int, n_out: int) -> tuple[list[int], list[float]]:
    """Lower neighbour ``floor(src)`` (may be -1 or ``n_in - 1``) and weight ``src - floor(src)``."""
    src = [(o + 0.5) * n_in / n_out - 0.5 for o in range(n_out)]
    lower = [math.floor(v) for v in src]
    return lower, [v - i for v, i in zip(src, lower)]


def interpolate_window(
    y: torch.Tensor, mode: str, idx: tuple[torch.Tensor, torch.Tensor], lam: tuple[torch.Tensor, ...] = ()
) -> torch.Tensor:
    """Separable nearest or bilinear interpolation of a window ``(..., rows, cols)`` of the input:
    per dimension the source point of every output point (``idx``, into the window) and, for
    bilinear, the weight ``lam`` of its upper neighbour."""
    for dim in (0, 1):
        axis = -2 + dim
        if mode == "nearest":
            y = y.index_select(axis, idx[dim])
            continue
        w = lam[dim].to(y.dtype)
        w = w.view(-1, 1) if dim == 0 else w
        y = y.index_select(axis, idx[dim]) * (1 - w) + y.index_select(axis, idx[dim] + 1) * w
    return y


class _Pool(nn.Module):
    """``factor × factor`` pooling at stride ``factor`` with ``ceil_mode`` (see module doc)."""

    def __init__(self, domain: Domain, factor: int, mode: str):
        super().__init__()
        self.domain, self.factor, self.mode = domain, factor, mode
        g = domain.grid
        self.out_domain = domain.resized(-(-g.n_lat // factor), -(-g.n_lon // factor))
        f = factor
        self.windows = tuple(
            (t.lat_start * f, min(t.lat_stop * f, g.n_lat), t.lon_start * f, min(t.lon_stop * f, g.n_lon))
            for t in self.out_domain.grid.tiles()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        win = gather_windows(x, self.domain.grid, self.windows, self.domain.axis, "zeros", "zeros")
        pool = F.avg_pool2d if self.mode == "avgpool" else F.max_pool2d
        return pool(win, self.factor, self.factor, ceil_mode=True)


class _Interpolate(nn.Module):
    """Separable nearest or bilinear interpolation of a field tile onto ``out_domain``."""

    def __init__(self, domain: Domain, out: tuple[int, int], mode: str, lat_mode: LatMode, lon_mode: LonMode):
        super().__init__()
        self.domain, self.mode, self.modes = domain, mode, (lat_mode, lon_mode)
        self.out_domain = domain.resized(*out)
        g, tile = domain.grid, self.out_domain.tile
        spans = []
        for dim, (n_in, n_out, o0, o1) in enumerate(
            [
                (g.n_lat, out[0], tile.lat_start, tile.lat_stop),
                (g.n_lon, out[1], tile.lon_start, tile.lon_stop),
            ]
        ):
            if mode == "nearest":
                src = nearest_source(n_in, n_out)
                span = [(src[a], src[b - 1] + 1) for a, b in self._tile_ranges(dim)]
                lo = span[self._coord(dim)][0]
                self.register_buffer(f"idx{dim}", torch.tensor(src[o0:o1]) - lo, persistent=False)
            else:
                lower, lam = bilinear_source(n_in, n_out)
                span = [(lower[a], lower[b - 1] + 2) for a, b in self._tile_ranges(dim)]
                lo = span[self._coord(dim)][0]
                self.register_buffer(f"idx{dim}", torch.tensor(lower[o0:o1]) - lo, persistent=False)
                self.register_buffer(
                    f"lam{dim}", torch.tensor(lam[o0:o1], dtype=torch.float64), persistent=False
                )
            spans.append(span)
        m_lon = len(spans[1])
        self.windows = tuple(
            (*spans[0][k // m_lon], *spans[1][k % m_lon]) for k in range(len(spans[0]) * m_lon)
        )

    def _tile_ranges(self, dim: int) -> list[tuple[int, int]]:
        g = self.out_domain.grid
        off = g.lat_offsets if dim == 0 else g.lon_offsets
        return [(off[i], off[i + 1]) for i in range(len(off) - 1)]

    def _coord(self, dim: int) -> int:
        return self.domain.mesh.lat_index if dim == 0 else self.domain.mesh.lon_index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        modes = self.modes if self.mode == "bilinear" else ("zeros", "zeros")
        y = gather_windows(x, self.domain.grid, self.windows, self.domain.axis, *modes)
        lam = (self.lam0, self.lam1) if self.mode == "bilinear" else ()
        return interpolate_window(y, self.mode, (self.idx0, self.idx1), lam)


def _window_cost(
    resampler: _Pool | _Interpolate, modes, elements: int, elsize: int, input_grad: bool
) -> Cost:
    """A pooling or interpolation: its window gathered (``elements`` per cell) and saved."""
    d = resampler.domain
    lat0, lat1, lon0, lon1 = resampler.windows[d.index]
    cost = Cost(saved=elements * (lat1 - lat0) * (lon1 - lon0) * elsize)
    if d.size > 1:
        f, b = window_bytes(d.grid, resampler.windows, *modes, elements, elsize)
        cost.bytes["resample.windows"] = (f, b if input_grad else 0)
    return cost


class _Resample(nn.Module):
    """What ``Downsample`` and ``Upsample`` share: the tile's domain, the channels in and out
    (``out_channels`` None: as many as in), the mode, and a positive whole ``factor``."""

    def __init__(self, domain: Domain, channels: int, out_channels: int | None, mode: str, factor: int):
        super().__init__()
        self.domain, self.channels, self.mode = domain, channels, mode
        self.out_channels = out_channels or channels
        if not isinstance(factor, int) or factor < 1:
            raise ValueError(f"factor must be a positive int, got {factor!r}")
        self.proj: Conv2d | None = None  # a 1x1 channel projection where the mode keeps the channels


class Downsample(_Resample):
    """Field tile ``(B, channels, h, w)`` → ``(B, out_channels, h', w')`` on ``ceil(n/factor)``."""

    def __init__(
        self,
        domain: Domain,
        channels: int,
        out_channels: int | None = None,
        mode: DownMode = "conv",
        factor: int = 2,
        kernel_size: int | None = None,
        lat_mode: LatMode = "zeros",
        lon_mode: LonMode = "periodic",
        bias: bool = True,
        strategy: Strategy = "auto",
    ):
        super().__init__(domain, channels, out_channels, mode, factor)
        out_channels = self.out_channels
        if mode == "conv":
            k = kernel_size or 2 * (factor // 2) + 1
            self.conv = Conv2d(
                domain, channels, out_channels, k, factor, 1, "same", lat_mode, lon_mode, bias, strategy
            )
            self.out_domain = self.conv.out_domain
        elif mode in ("avgpool", "maxpool"):
            self.pool = _Pool(domain, factor, mode)
            self.out_domain = self.pool.out_domain
            if out_channels != channels:
                self.proj = Conv2d(
                    self.out_domain, channels, out_channels, 1, padding=0, bias=bias, strategy=strategy
                )
        else:
            raise ValueError(f"Downsample mode {mode!r}: use 'conv', 'avgpool' or 'maxpool'")

    def cost(self, batch: int, elsize: int = 4, input_grad: bool = True) -> Cost:
        """The pooling window gather (``conv``/``proj`` price themselves)."""
        if self.mode == "conv":
            return Cost()
        return _window_cost(self.pool, ("zeros", "zeros"), batch * self.channels, elsize, input_grad)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_field(x, self.domain, self.channels, "Downsample")
        if self.mode == "conv":
            return self.conv(x)
        with comm_site("downsample"):
            y = self.pool(x)
        return self.proj(y) if self.proj is not None else y


class Upsample(_Resample):
    """Field tile ``(B, channels, h, w)`` → ``(B, out_channels, h', w')`` on ``out_grid``."""

    def __init__(
        self,
        domain: Domain,
        channels: int,
        out_channels: int | None = None,
        mode: UpMode = "transposed",
        factor: int = 2,
        out_grid: tuple[int, int] | None = None,
        kernel_size: int | None = None,
        lat_mode: LatMode = "zeros",
        lon_mode: LonMode = "periodic",
        bias: bool = True,
        strategy: Strategy = "auto",
    ):
        super().__init__(domain, channels, out_channels, mode, factor)
        out_channels = self.out_channels
        g = domain.grid
        out = tuple(out_grid) if out_grid is not None else (g.n_lat * factor, g.n_lon * factor)
        if len(out) != 2 or min(out) < 1:
            raise ValueError(f"out_grid must be (n_lat, n_lon) with positive sizes, got {out_grid!r}")
        if mode == "transposed":
            k = kernel_size or factor
            self.conv = ConvTranspose2d(
                domain,
                channels,
                out_channels,
                k,
                factor,
                (k - factor) // 2,
                out,
                lat_mode,
                lon_mode,
                bias,
                strategy,
            )
            self.out_domain = self.conv.out_domain
        elif mode in ("nearest", "bilinear"):
            if out_channels != channels:
                self.proj = Conv2d(domain, channels, out_channels, 1, padding=0, bias=bias, strategy=strategy)
            self.interp = _Interpolate(domain, out, mode, lat_mode, lon_mode)  # type: ignore[arg-type]
            self.out_domain = self.interp.out_domain
        else:
            raise ValueError(f"Upsample mode {mode!r}: use 'transposed', 'nearest' or 'bilinear'")

    def cost(self, batch: int, elsize: int = 4, input_grad: bool = True) -> Cost:
        """The interpolation's window gather (``conv``/``proj`` price themselves)."""
        if self.mode == "transposed":
            return Cost()
        modes = self.interp.modes if self.mode == "bilinear" else ("zeros", "zeros")
        return _window_cost(self.interp, modes, batch * self.out_channels, elsize, input_grad)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_field(x, self.domain, self.channels, "Upsample")
        if self.mode == "transposed":
            return self.conv(x)
        if self.proj is not None:
            x = self.proj(x)
        with comm_site("upsample"):
            return self.interp(x)
