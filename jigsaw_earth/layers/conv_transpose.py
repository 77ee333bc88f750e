"""Distributed transposed convolution (learned upsampling) on field tiles.

Definition, per dimension, for kernel ``k``, stride ``s`` and padding ``p`` (``k >= s``)::

    y[o] = bias + sum over (i, j) with i*s + j - p == o of  x[i] · W[:, :, j]

where input points ``i`` outside the grid follow the boundary rules (longitude periodic or zero,
latitude zeros / replicate / across the pole) — the input is *extended* by the rules, as for a
convolution. ``o`` runs over ``[0, n_out)``; by default ``n_out = (n-1)*s - 2p + k`` (torch's
size), but any size may be asked for (``out_grid``: a decoder returning to 33 rows from 17).
With ``lat_mode="zeros"`` and the default size this is exactly ``F.conv_transpose2d``.

Each rank gathers the input points that reach its output tile — rows
``[ceil((o0 + p - k + 1)/s), floor((o1 - 1 + p)/s) + 1)`` — applies the native
``F.conv_transpose2d`` (no padding) to that window and crops its tile. Strategy ``"weights"``:
the weight's output-channel blocks circulate in a ring (``conv_ring``), each transfer
overlapped with the block in hand. Strategy ``"activations"``: the window's points go through
``matmul_channels``' activation exchange against the weight viewed as ``(in_ch, out_ch*kh*kw)``,
then ``F.fold``. Either way a rank sends ``in_ch`` values per halo point instead of
``out_ch*k*k`` partial sums. On one rank: one ``F.conv_transpose2d`` with its bias, then a crop
(none when the output is torch's size).

Weights: the canonical weight is torch's ``(in_ch, out_ch, kh, kw)``; rank ``q`` holds
``weight[:, out_q]`` and ``bias[out_q]`` (``out_q = domain.split(out_ch)``). The bias is
gathered at use (``all_gather``; its backward reduce-scatters).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed.collectives import all_gather
from ..distributed.comm import comm_site
from ..distributed.conv_ring import conv_ring
from ..distributed.halo import LatMode, LonMode, Window, gather_windows
from ..distributed.matmul import Strategy, autocast_operands, channel_strategy, matmul_channels
from ..distributed.tiles import TileGrid
from .base import Domain, fill_fan_in_, output_sharded
from .conv import _pair, check_field, conv_strategy
from .cost import Cost, channel_matmul, gather_bytes, window_bytes

__all__ = ["ConvTranspose2d", "crop_output", "transposed_windows"]

Pair = tuple[int, int]


def _in_span(o0: int, o1: int, k: int, s: int, p: int) -> Pair:
    return -(-(o0 + p - k + 1) // s), (o1 - 1 + p) // s + 1


def transposed_windows(out_grid: TileGrid, kernel: Pair, stride: Pair, padding: Pair) -> tuple[Window, ...]:
    """Input points that reach each output tile, in domain-axis order."""
    return tuple(
        (
            *_in_span(t.lat_start, t.lat_stop, kernel[0], stride[0], padding[0]),
            *_in_span(t.lon_start, t.lon_stop, kernel[1], stride[1], padding[1]),
        )
        for t in out_grid.tiles()
    )


def crop_output(z: torch.Tensor, offset: Pair, shape: Pair) -> torch.Tensor:
    """``z[..., top : top + h, left : left + w]`` for ``offset = (top, left)`` and ``shape = (h, w)``
    (zeros where ``z`` ends short): the output tile inside the transposed convolution of its input
    window, whose point ``t`` is output ``t + lo·s − p``."""
    (top, left), (h, w) = offset, shape
    if (top, left, top + h, left + w) == (0, 0, *z.shape[-2:]):
        return z
    return F.pad(z, (-left, left + w - z.shape[-1], -top, top + h - z.shape[-2]))


class ConvTranspose2d(nn.Module):
    """Transposed convolution on a field tile ``(B, in_ch, h, w)`` → ``(B, out_ch, h', w')``.

    See the module docstring for the definition; the output grid is ``self.out_domain``.
    """

    jigsaw_layer = True

    def __init__(
        self,
        domain: Domain,
        in_ch: int,
        out_ch: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int],
        padding: int | Sequence[int] = 0,
        out_grid: tuple[int, int] | None = None,
        lat_mode: LatMode = "zeros",
        lon_mode: LonMode = "periodic",
        bias: bool = True,
        strategy: Strategy = "auto",
    ):
        super().__init__()
        self.domain, self.in_ch, self.out_ch = domain, in_ch, out_ch
        self.kernel, self.stride = _pair(kernel_size, "kernel_size"), _pair(stride, "stride")
        pad = (padding, padding) if isinstance(padding, int) else tuple(padding)
        if len(pad) != 2 or min(pad) < 0:
            raise ValueError(f"padding must be an int >= 0 or a (lat, lon) pair, got {padding!r}")
        self.padding: Pair = pad  # type: ignore[assignment]
        if any(k < s for k, s in zip(self.kernel, self.stride)):
            raise ValueError(
                f"kernel {self.kernel} smaller than stride {self.stride} leaves output points that no "
                f"input reaches; use kernel_size >= stride"
            )
        grid = domain.grid
        default = tuple(
            (n - 1) * s - 2 * p + k
            for n, k, s, p in zip((grid.n_lat, grid.n_lon), self.kernel, self.stride, self.padding)
        )
        out = tuple(out_grid) if out_grid is not None else default
        if len(out) != 2 or min(out) < 1:
            raise ValueError(f"out_grid must be (n_lat, n_lon) with positive sizes, got {out_grid!r}")
        self.out_domain = domain.resized(*out)
        self.modes: tuple[LatMode, LonMode] = (lat_mode, lon_mode)
        self.windows = transposed_windows(self.out_domain.grid, self.kernel, self.stride, self.padding)
        tile, window = self.out_domain.tile, self.windows[domain.index]
        self.offset = tuple(  # where this rank's output tile starts in its window's transposed conv
            o + p - lo * s
            for o, p, lo, s in zip((tile.lat_start, tile.lon_start), self.padding, window[::2], self.stride)
        )
        self.strategy: Strategy = strategy
        shape = (in_ch, out_ch, *self.kernel)
        self.out_sizes, self.weight, self.bias = output_sharded(domain, shape, 1, bias)
        self.reset_parameters()

    def reset_parameters(self, seed: int = 0, key: str = "conv_transpose") -> None:
        """``torch.nn.ConvTranspose2d``'s default: uniform in ±1/sqrt(out_ch*kh*kw)."""
        fill_fan_in_(self.weight, self.bias, seed, key, self.out_ch * self.kernel[0] * self.kernel[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_field(x, self.domain, self.in_ch, "ConvTranspose2d")
        (kh, kw), (sh, sw) = self.kernel, self.stride
        lat_lo, lat_hi, lon_lo, lon_hi = self.windows[self.domain.index]
        lh, lw = lat_hi - lat_lo, lon_hi - lon_lo
        b = x.shape[0]
        axis = self.domain.axis
        one_rank = self.domain.size == 1
        x, w, bias = autocast_operands(x, self.weight, self.bias if one_rank else None)
        with comm_site("conv_transpose2d"):
            win = gather_windows(x, self.domain.grid, self.windows, axis, *self.modes, op="gather_windows")
            counts = [b * (w_[1] - w_[0]) * (w_[3] - w_[2]) for w_ in self.windows]
            col_sizes = [n * kh * kw for n in self.out_sizes]
            strategy = conv_strategy(
                self.strategy, self.domain, lambda: counts, self.in_ch, col_sizes, win, w, None
            )
            if strategy == "weights":
                z = conv_ring(win, w, bias, axis, self.out_sizes, self.stride, transposed=True)
            else:  # tokens of in_ch through the activation-exchange matmul, then fold
                tokens = win.permute(0, 2, 3, 1).reshape(b * lh * lw, self.in_ch)
                cols = matmul_channels(
                    tokens, w.reshape(self.in_ch, -1), None, axis, col_sizes, counts, "activations"
                )
                cols = cols.reshape(b, lh * lw, self.out_ch * kh * kw).transpose(1, 2)
                z = F.fold(cols, ((lh - 1) * sh + kh, (lw - 1) * sw + kw), self.kernel, stride=self.stride)
            if not one_rank and self.bias is not None:
                (local_bias,) = autocast_operands(self.bias)  # sent in the compute dtype
                bias = all_gather(local_bias, axis, 0, self.out_sizes).to(z.dtype)
        y = crop_output(z, self.offset, self.out_domain.tile.shape)
        return y if one_rank or bias is None else y + bias.view(1, -1, 1, 1)

    def cost(self, batch: int, elsize: int = 4, input_grad: bool = True) -> Cost:
        """The input window gather, then ``in_ch`` rows against ``out_ch·kh·kw`` columns (the
        ring of weight blocks or the activation exchange), and the bias all-gather."""
        d = self.domain
        kh, kw = self.kernel
        counts = [batch * (w[1] - w[0]) * (w[3] - w[2]) for w in self.windows]
        cols = [n * kh * kw for n in self.out_sizes]
        chosen = channel_strategy(self.strategy, counts, self.in_ch, cols, False) if d.size > 1 else "weights"
        cost = channel_matmul(
            chosen, counts, d.index, self.in_ch, cols, False, elsize, input_grad, "conv_transpose.matmul"
        )
        h, w = self.out_domain.tile.shape
        cost.peak += batch * self.out_ch * h * w * elsize
        if d.size > 1:
            f, b = window_bytes(d.grid, self.windows, *self.modes, batch * self.in_ch, elsize)
            cost.bytes["conv_transpose.windows"] = (f, b if input_grad else 0)
            if self.bias is not None:
                cost.bytes["conv_transpose.bias"] = gather_bytes(self.out_sizes, 1, elsize)
        return cost

    def extra_repr(self) -> str:
        g = self.out_domain.grid
        return (
            f"{self.in_ch} -> {self.out_ch}, kernel={self.kernel}, stride={self.stride}, "
            f"padding={self.padding}, out_grid=({g.n_lat}, {g.n_lon}), modes={self.modes}, "
            f"shards {self.out_sizes}, {self.strategy}"
        )
