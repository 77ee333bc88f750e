"""Plain-PyTorch twins of the jigsaw field layers: one native op after sphere padding.

Each twin holds the jigsaw layer's parameters under the same names (``load_jigsaw`` converts the
layouts that differ, see ``canonical_to_twin``) and computes the same function on the whole
global field, written as a PyTorch user would write it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.conv import Padding, resolve_padding
from ..layers.patch import patch_layout
from ..layers.resample import bilinear_source
from .pad import sphere_pad

__all__ = ["Conv2d", "ConvTranspose2d", "Downsample", "PatchEmbed", "PatchRecovery", "Upsample"]

Pair = tuple[int, int]


def _pair(v: int | Sequence[int]) -> Pair:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


class Conv2d(nn.Conv2d):
    """``nn.Conv2d`` (no built-in padding) applied to the sphere-padded field."""

    def __init__(
        self,
        in_ch: int,
        out_ch: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        dilation: int | Sequence[int] = 1,
        padding: Padding = "same",
        lat_mode: str = "zeros",
        lon_mode: str = "periodic",
        bias: bool = True,
    ):
        kernel, dil = _pair(kernel_size), _pair(dilation)
        super().__init__(in_ch, out_ch, kernel, _pair(stride), 0, dil, bias=bias)
        self.sphere = resolve_padding(padding, kernel, dil)
        self.modes = (lat_mode, lon_mode)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = sphere_pad(x, *self.sphere, *self.modes)
        return F.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation)


class ConvTranspose2d(nn.ConvTranspose2d):
    """``nn.ConvTranspose2d`` on the input extended by the boundary rules, cropped to ``out_grid``."""

    def __init__(
        self,
        in_ch: int,
        out_ch: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int],
        padding: int | Sequence[int] = 0,
        out_grid: tuple[int, int] | None = None,
        lat_mode: str = "zeros",
        lon_mode: str = "periodic",
        bias: bool = True,
    ):
        super().__init__(in_ch, out_ch, _pair(kernel_size), _pair(stride), 0, bias=bias)
        self.pad, self.out_grid, self.modes = _pair(padding), out_grid, (lat_mode, lon_mode)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n_in = x.shape[-2:]
        out = self.out_grid or tuple(
            (n - 1) * s - 2 * p + k for n, s, p, k in zip(n_in, self.stride, self.pad, self.kernel_size)
        )
        # input points [lo, hi) reach outputs [0, out); z[t] is output t + lo*s - p
        lo = [-(-(p - k + 1) // s) for p, k, s in zip(self.pad, self.kernel_size, self.stride)]
        hi = [(o - 1 + p) // s + 1 for o, p, s in zip(out, self.pad, self.stride)]
        before = [max(0, -a) for a in lo]
        after = [max(0, b - n) for b, n in zip(hi, n_in)]
        if any(before) or any(after):
            x = sphere_pad(x, (before[0], after[0]), (before[1], after[1]), *self.modes)
        x = x[..., lo[0] + before[0] : hi[0] + before[0], lo[1] + before[1] : hi[1] + before[1]]
        z = F.conv_transpose2d(x, self.weight, self.bias, self.stride)
        top, left = (p - a * s for p, a, s in zip(self.pad, lo, self.stride))
        if (top, left) == (0, 0) and tuple(z.shape[-2:]) == tuple(out):
            return z
        return z[..., top : top + out[0], left : left + out[1]]


class PatchEmbed(nn.Module):
    """Strided convolution with kernel ``patch`` on the sphere-padded field, returned channels-last.

    ``weight`` is ``nn.Conv2d``'s ``(D, C, p, p)`` (jigsaw's ``(C*p*p, D)`` transposed)."""

    def __init__(
        self,
        grid: tuple[int, int],
        in_ch: int,
        embed_dim: int,
        patch: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
        lat_mode: str = "zeros",
        lon_mode: str = "periodic",
        bias: bool = True,
    ):
        super().__init__()
        self.patch = _pair(patch)
        self.stride = _pair(stride if stride is not None else patch)
        layouts = [patch_layout(n, p, s) for n, p, s in zip(grid, self.patch, self.stride)]
        self.tokens = tuple(t for t, _ in layouts)
        self.padding = tuple(pad for _, pad in layouts)
        self.modes = (lat_mode, lon_mode)
        self.weight = nn.Parameter(torch.empty(embed_dim, in_ch, *self.patch))
        self.bias = nn.Parameter(torch.zeros(embed_dim)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=5**0.5)

    def canonical_to_twin(self, name: str, t: torch.Tensor) -> torch.Tensor:
        return t.t().reshape(self.weight.shape) if name == "weight" else t

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = sphere_pad(x, *self.padding, *self.modes)
        return F.conv2d(x, self.weight, self.bias, self.stride).permute(0, 2, 3, 1)


class PatchRecovery(nn.Module):
    """``F.linear`` per token, ``F.fold`` onto the padded grid, crop (``overlap="mean"`` averages).

    ``weight`` is ``nn.Linear``'s ``(out_ch*p*p, D)`` (jigsaw's ``(D, out_ch*p*p)`` transposed)."""

    def __init__(
        self,
        embed_dim: int,
        out_ch: int,
        patch: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
        out_grid: tuple[int, int] = (1, 1),
        overlap: str = "sum",
        bias: bool = True,
    ):
        super().__init__()
        self.patch = _pair(patch)
        self.stride = _pair(stride if stride is not None else patch)
        self.out_grid = tuple(out_grid)
        layouts = [patch_layout(n, p, s) for n, p, s in zip(out_grid, self.patch, self.stride)]
        self.tokens = tuple(t for t, _ in layouts)
        self.before = tuple(pad[0] for _, pad in layouts)
        self.padded = tuple((t - 1) * s + p for t, s, p in zip(self.tokens, self.stride, self.patch))
        cols = out_ch * self.patch[0] * self.patch[1]
        self.weight = nn.Parameter(torch.empty(cols, embed_dim))
        self.bias = nn.Parameter(torch.zeros(cols)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=5**0.5)
        self.register_buffer("inv_count", None, persistent=False)
        if overlap == "mean":
            ones = torch.ones(
                1, self.patch[0] * self.patch[1], self.tokens[0] * self.tokens[1], dtype=torch.float64
            )
            count = F.fold(ones, self.padded, self.patch, stride=self.stride)[0, 0]
            count = count[self._crop()]
            self.inv_count = 1.0 / count

    def _crop(self) -> tuple[slice, slice]:
        (t, l), (h, w) = self.before, self.out_grid
        return slice(t, t + h), slice(l, l + w)

    def canonical_to_twin(self, name: str, t: torch.Tensor) -> torch.Tensor:
        return t.t() if name == "weight" else t

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, h, w, D = x.shape
        cols = F.linear(x.reshape(B, h * w, D), self.weight, self.bias).transpose(1, 2)
        y = F.fold(cols, self.padded, self.patch, stride=self.stride)
        if tuple(y.shape[-2:]) != self.out_grid:
            y = y[(..., *self._crop())]
        return y if self.inv_count is None else y * self.inv_count.to(y.dtype)


class Downsample(nn.Module):
    """Strided ``Conv2d`` twin (``mode="conv"``) or ceil-mode pooling then a 1×1 ``nn.Conv2d``."""

    def __init__(
        self,
        channels: int,
        out_channels: int | None = None,
        mode: str = "conv",
        factor: int = 2,
        kernel_size: int | None = None,
        lat_mode: str = "zeros",
        lon_mode: str = "periodic",
        bias: bool = True,
    ):
        super().__init__()
        out_channels = out_channels or channels
        self.mode, self.factor = mode, factor
        self.proj: nn.Conv2d | None = None
        if mode == "conv":
            k = kernel_size or 2 * (factor // 2) + 1
            self.conv = Conv2d(channels, out_channels, k, factor, 1, "same", lat_mode, lon_mode, bias)
        elif out_channels != channels:
            self.proj = nn.Conv2d(channels, out_channels, 1, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "conv":
            return self.conv(x)
        pool = F.avg_pool2d if self.mode == "avgpool" else F.max_pool2d
        y = pool(x, self.factor, self.factor, ceil_mode=True)
        return self.proj(y) if self.proj is not None else y


class Upsample(nn.Module):
    """``ConvTranspose2d`` twin (``mode="transposed"``), or a 1×1 ``nn.Conv2d`` then nearest /
    sphere-bilinear interpolation onto ``out_grid``."""

    def __init__(
        self,
        grid: tuple[int, int],
        channels: int,
        out_channels: int | None = None,
        mode: str = "transposed",
        factor: int = 2,
        out_grid: tuple[int, int] | None = None,
        kernel_size: int | None = None,
        lat_mode: str = "zeros",
        lon_mode: str = "periodic",
        bias: bool = True,
    ):
        super().__init__()
        out_channels = out_channels or channels
        self.mode, self.modes = mode, (lat_mode, lon_mode)
        self.out_grid = tuple(out_grid) if out_grid is not None else (grid[0] * factor, grid[1] * factor)
        self.proj: nn.Conv2d | None = None
        if mode == "transposed":
            k = kernel_size or factor
            self.conv = ConvTranspose2d(
                channels, out_channels, k, factor, (k - factor) // 2, self.out_grid, lat_mode, lon_mode, bias
            )
            return
        if out_channels != channels:
            self.proj = nn.Conv2d(channels, out_channels, 1, bias=bias)
        if mode == "bilinear":
            for dim, (n_in, n_out) in enumerate(zip(grid, self.out_grid)):
                lower, lam = bilinear_source(n_in, n_out)
                self.register_buffer(f"idx{dim}", torch.tensor(lower) + 1, persistent=False)
                self.register_buffer(f"lam{dim}", torch.tensor(lam, dtype=torch.float64), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "transposed":
            return self.conv(x)
        if self.proj is not None:
            x = self.proj(x)
        if self.mode == "nearest":
            return F.interpolate(x, size=self.out_grid, mode="nearest")
        y = sphere_pad(x, (1, 1), (1, 1), *self.modes)
        for dim in (0, 1):
            axis, idx, lam = -2 + dim, getattr(self, f"idx{dim}"), getattr(self, f"lam{dim}").to(y.dtype)
            lam = lam.view(-1, 1) if dim == 0 else lam
            y = y.index_select(axis, idx) * (1 - lam) + y.index_select(axis, idx + 1) * lam
        return y
