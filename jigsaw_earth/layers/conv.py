"""Distributed 2-D convolution on field tiles, exact on any mesh and any uneven split.

Each output tile is computed from exactly its receptive field: for a layer with kernel ``k``,
stride ``s``, dilation ``d`` and padding ``p_before`` (per dimension), output rows ``[o0, o1)``
read input rows ``[o0*s - p_before, (o1-1)*s - p_before + d*(k-1) + 1)``. ``gather_windows``
fetches that window (boundary cells follow ``lat_mode``/``lon_mode`` as in ``pad_reference``;
on one rank a view or one padded copy), and the rank convolves it, unpadded, with the native
``F.conv2d``. The output grid is split with the same uneven rule as every grid, independently of
the input grid, so odd tile sizes and strides need no care.

Weights: the canonical weight is torch's ``(out_ch, in_ch, kh, kw)``. Rank ``q`` holds the
block ``weight[out_q]`` with ``out_q = domain.split(out_ch)`` (and the bias block). Strategy
``"weights"``: the blocks circulate in a ring (``conv_ring``), each transfer overlapped with the
convolution on the block in hand; backward recirculates them for ``dX`` and reduce-scatters
``dW``. Strategy ``"activations"``: im2col (``F.unfold``) rows of ``in_ch·kh·kw`` through
``matmul_channels``' activation exchange (the weight block viewed as column block ``q`` of the
``(in_ch·kh·kw, out_ch)`` matrix, rows ordered ``(c, i, j)``); it moves no weights, so it can
win for small tiles with large weights. ``"auto"`` picks the fewer bytes. On one rank every
strategy is one ``F.conv2d`` on the padded input.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed.comm import comm_site
from ..distributed.conv_ring import conv_ring
from ..distributed.halo import LatMode, LonMode, Window, gather_windows
from ..distributed.matmul import Strategy, autocast_operands, channel_strategy, matmul_channels
from ..distributed.matmul import _check_strategy as check_strategy
from ..distributed.matmul import _training as is_training
from ..distributed.tiles import TileGrid
from .base import Domain, fill_fan_in_, output_sharded
from .channels import ChannelDim, ChannelDims
from .cost import Cost, channel_matmul, window_bytes

__all__ = [
    "Conv2d",
    "Padding",
    "conv_cost",
    "conv_out_size",
    "conv_strategy",
    "conv_windows",
    "resolve_padding",
    "sharded_conv",
]

Pair = tuple[int, int]
Padding = str | int | tuple[int, int] | tuple[Pair, Pair]


def _pair(v: int | Sequence[int], name: str) -> Pair:
    if isinstance(v, int):
        v = (v, v)
    v = tuple(int(a) for a in v)
    if len(v) != 2 or min(v) < 1:
        raise ValueError(f"{name} must be a positive int or a (lat, lon) pair of them, got {v!r}")
    return v  # type: ignore[return-value]


def resolve_padding(padding: Padding, kernel: Pair, dilation: Pair) -> tuple[Pair, Pair]:
    """``((top, bottom), (left, right))`` from ``"same"``, an int, ``(lat, lon)`` or explicit pairs.

    ``"same"`` pads ``d*(k-1)`` per dimension, ``d*(k-1)//2`` before and the rest after, so a
    stride-``s`` layer returns ``ceil(n / s)`` points (``n`` at stride 1).
    """
    if padding == "same":
        return tuple((d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for k, d in zip(kernel, dilation))  # type: ignore[return-value]
    if isinstance(padding, int):
        padding = (padding, padding)
    if isinstance(padding, tuple) and len(padding) == 2:
        out = tuple((p, p) if isinstance(p, int) else tuple(p) for p in padding)
        if all(len(p) == 2 and min(p) >= 0 for p in out):
            return out  # type: ignore[return-value]
    raise ValueError(
        f"padding {padding!r}: use 'same', an int >= 0, (lat, lon) ints or ((top, bottom), (left, right))"
    )


def conv_out_size(n: int, kernel: int, stride: int, dilation: int, pad: Pair) -> int:
    """Output points of a convolution over ``n`` points padded by ``pad`` (torch's formula)."""
    span = n + pad[0] + pad[1] - dilation * (kernel - 1)
    if span < 1:
        raise ValueError(
            f"kernel {kernel} (dilation {dilation}) does not fit in {n} points padded by {pad}; "
            f"use a smaller kernel or more padding"
        )
    return (span - 1) // stride + 1


def conv_windows(
    out_grid: TileGrid, kernel: Pair, stride: Pair, dilation: Pair, pad_before: Pair
) -> tuple[Window, ...]:
    """Input window (receptive field) of every output tile, in domain-axis order."""
    wins = []
    for t in out_grid.tiles():
        lat = _span(t.lat_start, t.lat_stop, kernel[0], stride[0], dilation[0], pad_before[0])
        lon = _span(t.lon_start, t.lon_stop, kernel[1], stride[1], dilation[1], pad_before[1])
        wins.append((*lat, *lon))
    return tuple(wins)


def _span(o0: int, o1: int, k: int, s: int, d: int, p: int) -> Pair:
    return o0 * s - p, (o1 - 1) * s - p + d * (k - 1) + 1


def conv_strategy(
    strategy: Strategy, domain: Domain, counts: Callable[[], Sequence[int]], rows: int,
    out_sizes: Sequence[int], *operands: torch.Tensor | None,
) -> str:  # fmt: skip
    """``"weights"`` (the weight ring on native kernels) or ``"activations"`` (im2col rows through
    ``matmul_channels``); ``"auto"`` picks the fewer bytes by ``channel_bytes``, as the matmul does."""
    check_strategy(strategy)
    if domain.size == 1:
        return "weights"
    if strategy != "auto":
        return strategy
    bias = operands[-1] is not None
    n = counts()  # this rank's output tokens per rank (computed only when choosing)
    return channel_strategy(strategy, n, rows, out_sizes, bias, is_training(*operands))


def sharded_conv(
    x: torch.Tensor,
    domain: Domain,
    out_domain: Domain,
    windows: tuple[Window, ...],
    stride: Pair,
    dilation: Pair,
    modes: tuple[LatMode, LonMode],
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out_sizes: Sequence[int],
    strategy: Strategy,
) -> torch.Tensor:
    """Gather each rank's receptive field and convolve it (no padding) with all output channels.

    ``weight`` is this rank's ``(out_q, in_ch, kh, kw)`` block. Returns this rank's output tile
    ``(B, out_ch, h_out, w_out)``. On one rank: one ``F.conv2d`` on the padded input.
    """
    x, weight, bias = autocast_operands(x, weight, bias)
    win = gather_windows(x, domain.grid, windows, domain.axis, *modes, op="gather_windows")
    rows = math.prod(weight.shape[1:])
    counts = lambda: out_domain.counts(batch=x.shape[0])  # noqa: E731
    chosen = conv_strategy(strategy, domain, counts, rows, out_sizes, win, weight, bias)
    if chosen == "weights":
        return conv_ring(win, weight, bias, domain.axis, out_sizes, stride, dilation)
    # im2col rows of in_ch·kh·kw through the activation-exchange matmul
    kernel = tuple(weight.shape[2:])
    cols = F.unfold(win, kernel, dilation=dilation, stride=stride)  # (B, C*kh*kw, L)
    tokens = cols.transpose(1, 2).reshape(-1, rows)
    w = weight.reshape(weight.shape[0], rows).t()
    y = matmul_channels(tokens, w, bias, domain.axis, out_sizes, counts(), "activations")
    h, w_ = out_domain.tile.shape
    return y.reshape(x.shape[0], h, w_, -1).permute(0, 3, 1, 2)


def conv_cost(
    name: str,
    domain: Domain,
    out_domain: Domain,
    windows: tuple[Window, ...],
    modes: tuple[str, str],
    in_ch: int,
    rows: int,
    out_sizes: Sequence[int],
    bias: bool,
    strategy: Strategy,
    batch: int,
    elsize: int,
    input_grad: bool,
) -> Cost:
    """``sharded_conv``'s step: the receptive-field gather (its backward only when the input
    needs a gradient), then the weight ring or im2col rows of ``rows = in_ch·kh·kw`` through the
    activation exchange, chosen as ``conv_strategy`` chooses."""
    q, counts = domain.index, out_domain.counts(batch)
    chosen = channel_strategy(strategy, counts, rows, out_sizes, bias) if domain.size > 1 else "weights"
    cost = channel_matmul(chosen, counts, q, rows, out_sizes, bias, elsize, input_grad, f"{name}.matmul")
    lat0, lat1, lon0, lon1 = windows[q]
    window = batch * in_ch * (lat1 - lat0) * (lon1 - lon0) * elsize
    if chosen == "weights":  # native kernels on the window, not im2col rows (channel_matmul's)
        out = counts[q] * sum(out_sizes) * elsize
        ring = 2 * (rows + 1) * max(out_sizes) * elsize if domain.size > 1 else 0
        cost.saved = window
        cost.peak = max((2 if domain.size > 1 else 1) * out, out + (window if input_grad else 0)) + ring
    else:
        cost.peak += window
    if domain.size > 1:
        f, b = window_bytes(domain.grid, windows, *modes, batch * in_ch, elsize)
        cost.bytes[f"{name}.windows"] = (f, b if input_grad else 0)
    return cost


def check_field(x: torch.Tensor, domain: Domain, channels: int, layer: str) -> None:
    """Raise a clear error unless ``x`` is this rank's ``(B, channels, h, w)`` tile."""
    tile = domain.tile.shape
    if x.dim() != 4 or x.shape[1] != channels or tuple(x.shape[-2:]) != tile:
        raise ValueError(
            f"{layer} expects this rank's field tile (B, {channels}, {tile[0]}, {tile[1]}) of the "
            f"{domain.grid.n_lat}x{domain.grid.n_lon} grid, got {tuple(x.shape)}"
        )


class Conv2d(nn.Module):
    """``torch.nn.Conv2d`` on a field tile ``(B, in_ch, h, w)`` → ``(B, out_ch, h', w')``.

    Padding follows the sphere: longitude ``lon_mode`` (``"periodic"`` or ``"zeros"``), latitude
    ``lat_mode`` (``"zeros"``, ``"replicate"`` or ``"pole"``). The output grid is
    ``self.out_domain`` (``conv_out_size`` per dimension). Serial definition:
    ``F.conv2d(pad_reference(x, Halo(pad_lat, pad_lon, lat_mode, lon_mode)), weight, bias,
    stride, dilation=dilation)``.
    """

    jigsaw_layer = True

    def __init__(
        self,
        domain: Domain,
        in_ch: int,
        out_ch: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        dilation: int | Sequence[int] = 1,
        padding: Padding = "same",
        lat_mode: LatMode = "zeros",
        lon_mode: LonMode = "periodic",
        bias: bool = True,
        strategy: Strategy = "auto",
    ):
        super().__init__()
        self.domain, self.in_ch, self.out_ch = domain, in_ch, out_ch
        self.kernel = _pair(kernel_size, "kernel_size")
        self.stride = _pair(stride, "stride")
        self.dilation = _pair(dilation, "dilation")
        self.padding = resolve_padding(padding, self.kernel, self.dilation)
        self.modes: tuple[LatMode, LonMode] = (lat_mode, lon_mode)
        self.strategy: Strategy = strategy
        grid = domain.grid
        n_out = [
            conv_out_size(n, *args)
            for n, args in zip(
                (grid.n_lat, grid.n_lon), zip(self.kernel, self.stride, self.dilation, self.padding)
            )
        ]
        self.out_domain = domain.resized(*n_out)
        pad_before = (self.padding[0][0], self.padding[1][0])
        self.windows = conv_windows(self.out_domain.grid, self.kernel, self.stride, self.dilation, pad_before)
        shape = (out_ch, in_ch, *self.kernel)
        self.out_sizes, self.weight, self.bias = output_sharded(domain, shape, 0, bias)
        self.reset_parameters()

    def reset_parameters(self, seed: int = 0, key: str = "conv") -> None:
        """``torch.nn.Conv2d``'s default: uniform in ±1/sqrt(fan_in)."""
        fill_fan_in_(self.weight, self.bias, seed, key, self.in_ch * self.kernel[0] * self.kernel[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_field(x, self.domain, self.in_ch, "Conv2d")
        with comm_site("conv2d"):
            return sharded_conv(
                x, self.domain, self.out_domain, self.windows, self.stride, self.dilation,
                self.modes, self.weight, self.bias, self.out_sizes, self.strategy,
            )  # fmt: skip

    def channel_dims(
        self, inputs: Sequence[str] | None = None, outputs: Sequence[str] | None = None
    ) -> ChannelDims:
        """The weight ``(out_ch, in_ch, kh, kw)`` by output (dim 0) and input (dim 1) channel; the
        bias by output channel (those named)."""
        weight: list[ChannelDim] = []
        dims: ChannelDims = {}
        if outputs is not None:
            weight.append(ChannelDim(0, tuple(outputs)))
            if self.bias is not None:
                dims["bias"] = (ChannelDim(0, tuple(outputs)),)
        if inputs is not None:
            weight.append(ChannelDim(1, tuple(inputs)))
        if weight:
            dims["weight"] = tuple(weight)
        return dims

    def cost(self, batch: int, elsize: int = 4, input_grad: bool = True) -> Cost:
        rows = self.in_ch * self.kernel[0] * self.kernel[1]
        cost = conv_cost(
            "conv", self.domain, self.out_domain, self.windows, self.modes, self.in_ch, rows,
            self.out_sizes, self.bias is not None, self.strategy, batch, elsize, input_grad,
        )  # fmt: skip
        lat0, lat1, lon0, lon1 = self.windows[self.domain.index]
        # the backend's copy of the window in its own layout (oneDNN on CPU)
        cost.peak += batch * self.in_ch * (lat1 - lat0) * (lon1 - lon0) * elsize
        return cost

    def extra_repr(self) -> str:
        return (
            f"{self.in_ch} -> {self.out_ch}, kernel={self.kernel}, stride={self.stride}, "
            f"dilation={self.dilation}, padding={self.padding}, modes={self.modes}, "
            f"shards {self.out_sizes}, {self.strategy}"
        )
