"""Halo-aware patch embedding and patch recovery between field tiles and token tiles.

Token grid and padding (per dimension, ``n`` points, patch ``p``, stride ``s <= p``)::

    n_tok = ceil((n - p) / s) + 1        (1 when n <= p)
    pad   = (n_tok - 1) * s + p - n       split pad // 2 before, the rest after

so every point is covered and the padding is as even as possible (721 rows, p = 4: 181 tokens,
3 padded rows: 1 above, 2 below). Padded points follow the boundary rules (longitude periodic
or zero, latitude zeros / replicate / across the pole).

``PatchEmbed`` is then a stride-``s`` convolution with kernel ``p`` on the padded field:
``F.conv2d(pad_reference(x, pad), W.T.reshape(D, C, p, p), b, stride=s)``, returned channels-last.
The token grid is split over the mesh independently of the pixel grid, so a rank's receptive
field generally spans several input tiles; ``gather_windows`` fetches exactly it, and the rank
convolves it with the native strided ``F.conv2d`` (``layers.conv.sharded_conv``: weight ring, or
im2col through ``matmul_channels`` for ``strategy="activations"``). The output is the conv's
``(B, D, h, w)`` permuted to channels-last (a view, as the plain strided-conv embedding gives).

``PatchRecovery`` maps each token to ``out_ch × p × p`` values (a linear layer), places the
patches back where the embedding took them, sums overlapping contributions (``s < p``) and crops
the padding: ``F.fold(tokens·W + b, padded size, p, stride=s)[..., pad_before : pad_before + n]``.
Contributions that fall in the padding are dropped (never wrapped or reflected back).
``overlap="mean"`` divides every point by the number of patches covering it, so overlapping
patches are averaged. A rank folds its own tokens onto their footprint window and
``scatter_add_windows`` adds every window cell into the rank that owns it.

Weights are matrices like ``Linear``'s: embedding ``(C*p*p, D)`` with rows ordered ``(c, i, j)``
(``F.unfold``'s order); recovery ``(D, out_ch*p*p)`` with columns ordered ``(c, i, j)``
(``F.fold``'s order); both sharded by columns over the domain ranks, biases likewise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed.collectives import all_gather
from ..distributed.comm import comm_site
from ..distributed.conv_ring import conv_whole
from ..distributed.halo import LatMode, LonMode, gather_windows, scatter_add_windows
from ..distributed.matmul import Strategy, autocast_operands, matmul_channels
from .base import Domain, fill_fan_in_, output_sharded
from .channels import ChannelDim, ChannelDims
from .conv import _pair, check_field, conv_cost, conv_windows, sharded_conv
from .cost import Cost, channel_matmul, window_bytes
from .replicas import Replicating

__all__ = ["PatchEmbed", "PatchRecovery", "patch_layout"]

Pair = tuple[int, int]


def patch_layout(n: int, patch: int, stride: int) -> tuple[int, Pair]:
    """``(n_tok, (pad_before, pad_after))`` for ``n`` points (see the module docstring)."""
    if stride > patch:
        raise ValueError(f"stride {stride} > patch {patch} would skip points; use stride <= patch")
    n_tok = 1 if n <= patch else -(-(n - patch) // stride) + 1
    pad = (n_tok - 1) * stride + patch - n
    return n_tok, (pad // 2, pad - pad // 2)


def _layout(
    grid_shape: Sequence[int], patch: Pair, stride: Pair
) -> tuple[tuple[int, int], tuple[Pair, Pair]]:
    lat, lon = (patch_layout(n, p, s) for n, p, s in zip(grid_shape, patch, stride))
    return (lat[0], lon[0]), (lat[1], lon[1])


class PatchEmbed(Replicating, nn.Module):
    """Field tile ``(B, in_ch, h, w)`` → token tile ``(B, h_tok, w_tok, embed_dim)``."""

    jigsaw_layer = True

    def __init__(
        self,
        domain: Domain,
        in_ch: int,
        embed_dim: int,
        patch: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
        lat_mode: LatMode = "zeros",
        lon_mode: LonMode = "periodic",
        bias: bool = True,
        strategy: Strategy = "auto",
    ):
        super().__init__()
        self.domain, self.in_ch, self.embed_dim = domain, in_ch, embed_dim
        self.patch = _pair(patch, "patch")
        self.stride = _pair(stride if stride is not None else self.patch, "stride")
        n_tok, self.padding = _layout((domain.grid.n_lat, domain.grid.n_lon), self.patch, self.stride)
        self.out_domain = domain.resized(*n_tok)
        self.modes: tuple[LatMode, LonMode] = (lat_mode, lon_mode)
        pad_before = (self.padding[0][0], self.padding[1][0])
        self.windows = conv_windows(self.out_domain.grid, self.patch, self.stride, (1, 1), pad_before)
        self.strategy: Strategy = strategy
        rows = in_ch * self.patch[0] * self.patch[1]
        self.out_sizes, weight, bias_ = output_sharded(domain, (rows, embed_dim), 1, bias)
        self.weight, self.bias = _conv_layout(weight), bias_  # weight before bias: the parameters' order
        self.reset_parameters()

    def reset_parameters(self, seed: int = 0, key: str = "patch_embed") -> None:
        """A ``Conv2d``'s default: uniform in ±1/sqrt(in_ch*p*p)."""
        fill_fan_in_(self.weight, self.bias, seed, key, self.weight.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_field(x, self.domain, self.in_ch, "PatchEmbed")
        # the (C·p·p, D_q) column block is the conv weight block (D_q, C, p, p), rows in (c, i, j):
        # a view, as the parameter is stored in conv layout
        weight = self.weight.T.view(-1, self.in_ch, *self.patch)
        replica = self.replica()
        with comm_site("patch_embed"):
            if replica is not None:  # a forecast: the receptive field, then the whole weight here
                x, full, bias = autocast_operands(x, *replica)
                win = gather_windows(x, self.domain.grid, self.windows, self.domain.axis, *self.modes,
                                     op="gather_windows")  # fmt: skip
                return conv_whole(win, full, bias, self.stride).permute(0, 2, 3, 1)
            y = sharded_conv(
                x, self.domain, self.out_domain, self.windows, self.stride, (1, 1),
                self.modes, weight, self.bias, self.out_sizes, self.strategy,
            )  # fmt: skip
        return y.permute(0, 2, 3, 1)

    def gather_replica(self) -> tuple[torch.Tensor | None, ...]:
        """The whole conv weight ``(embed_dim, in_ch, p, p)`` and bias (``replicas.py``; collective)."""
        axis, sizes = self.domain.axis, self.out_sizes
        with comm_site("patch_embed.replica"):
            weight = all_gather(self.weight.T.contiguous(), axis, 0, sizes).view(-1, self.in_ch, *self.patch)
            return weight, None if self.bias is None else all_gather(self.bias, axis, 0, sizes)

    def replica_numel(self) -> int:
        return self.weight.shape[0] * self.embed_dim + (self.embed_dim if self.bias is not None else 0)

    def channel_dims(
        self, inputs: Sequence[str] | None = None, outputs: Sequence[str] | None = None
    ) -> ChannelDims:
        """The weight's rows, ``(channel, i, j)``: one block of ``p_lat·p_lon`` rows per input channel."""
        if inputs is None:
            return {}
        return {"weight": (ChannelDim(0, tuple(inputs), self.patch[0] * self.patch[1]),)}

    def cost(self, batch: int, elsize: int = 4, input_grad: bool = True) -> Cost:
        return conv_cost(
            "patch_embed", self.domain, self.out_domain, self.windows, self.modes, self.in_ch,
            self.weight.shape[0], self.out_sizes, self.bias is not None, self.strategy, batch,
            elsize, input_grad,
        )  # fmt: skip

    def extra_repr(self) -> str:
        g = self.out_domain.grid
        return (
            f"{self.in_ch} -> {self.embed_dim}, patch={self.patch}, stride={self.stride}, "
            f"padding={self.padding}, tokens=({g.n_lat}, {g.n_lon}), shards {self.out_sizes}"
        )


def _conv_layout(weight: nn.Parameter) -> nn.Parameter:
    """The canonical ``(C·p·p, D_q)`` weight stored as the transpose of a contiguous ``(D_q, C·p·p)``
    (the conv layout), so forward reads the conv weight as a view and backward's dW lands without
    a transposing copy. Shape, shard spec and checkpoints stay canonical."""
    stored = nn.Parameter(torch.empty(weight.shape[::-1], device=weight.device).T)
    stored._jigsaw_spec = weight._jigsaw_spec  # type: ignore[attr-defined]
    return stored


class PatchRecovery(Replicating, nn.Module):
    """Token tile ``(B, h_tok, w_tok, embed_dim)`` → field tile ``(B, out_ch, h, w)`` on ``out_grid``."""

    jigsaw_layer = True

    def __init__(
        self,
        domain_tokens: Domain,
        embed_dim: int,
        out_ch: int,
        patch: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
        out_grid: tuple[int, int] | None = None,
        overlap: Literal["sum", "mean"] = "sum",
        bias: bool = True,
        strategy: Strategy = "auto",
    ):
        super().__init__()
        if out_grid is None:
            raise ValueError("PatchRecovery needs out_grid=(n_lat, n_lon), the field grid to recover")
        if overlap not in ("sum", "mean"):
            raise ValueError(f"overlap {overlap!r}: use 'sum' or 'mean'")
        self.domain, self.embed_dim, self.out_ch, self.overlap = domain_tokens, embed_dim, out_ch, overlap
        self.patch = _pair(patch, "patch")
        self.stride = _pair(stride if stride is not None else self.patch, "stride")
        n_tok, self.padding = _layout(out_grid, self.patch, self.stride)
        g = domain_tokens.grid
        if n_tok != (g.n_lat, g.n_lon):
            raise ValueError(
                f"a {out_grid[0]}x{out_grid[1]} grid with patch {self.patch} and stride {self.stride} has "
                f"{n_tok[0]}x{n_tok[1]} tokens, but domain_tokens has {g.n_lat}x{g.n_lon}; pass the "
                f"grid and patch that the matching PatchEmbed used"
            )
        self.out_domain = domain_tokens.resized(*out_grid)
        (ph, pw), (sh, sw), ((pt, _), (pl, _)) = self.patch, self.stride, self.padding
        self.windows = tuple(
            (
                t.lat_start * sh - pt,
                (t.lat_stop - 1) * sh - pt + ph,
                t.lon_start * sw - pl,
                (t.lon_stop - 1) * sw - pl + pw,
            )
            for t in g.tiles()
        )
        if overlap == "mean":
            tile = self.out_domain.tile
            rows = _coverage(tile.lat_start, tile.lat_stop, n_tok[0], ph, sh, pt)
            cols = _coverage(tile.lon_start, tile.lon_stop, n_tok[1], pw, sw, pl)
            self.register_buffer("inv_count", 1.0 / (rows[:, None] * cols[None, :]), persistent=False)
        self.strategy: Strategy = strategy
        cols_out = out_ch * ph * pw
        self.out_sizes, self.weight, self.bias = output_sharded(domain_tokens, (embed_dim, cols_out), 1, bias)
        self.reset_parameters()

    def reset_parameters(self, seed: int = 0, key: str = "patch_recovery") -> None:
        """``torch.nn.Linear``'s default: uniform in ±1/sqrt(embed_dim)."""
        fill_fan_in_(self.weight, self.bias, seed, key, self.embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = self.domain.tile.shape
        if x.dim() != 4 or tuple(x.shape[1:]) != (h, w, self.embed_dim):
            raise ValueError(
                f"PatchRecovery expects this rank's token tile (B, {h}, {w}, {self.embed_dim}), "
                f"got {tuple(x.shape)}"
            )
        b = x.shape[0]
        (ph, pw), (sh, sw) = self.patch, self.stride
        axis = self.domain.axis
        replica = self.replica()  # a forecast: the whole weight here (replicas.py)
        weight, bias = (self.weight, self.bias) if replica is None else replica
        tokens, weight, bias = autocast_operands(x.reshape(-1, self.embed_dim), weight, bias)
        with comm_site("patch_recovery"):
            if self.domain.size == 1 or replica is not None:  # Linear's own kernel
                cols = tokens @ weight if bias is None else torch.addmm(bias, tokens, weight)
            else:
                cols = matmul_channels(
                    tokens, weight, bias, axis, self.out_sizes,
                    self.domain.counts(b), self.strategy,
                )  # fmt: skip
            cols = cols.reshape(b, h * w, -1).transpose(1, 2)
            canvas = F.fold(cols, ((h - 1) * sh + ph, (w - 1) * sw + pw), self.patch, stride=self.stride)
            y = scatter_add_windows(
                canvas, self.out_domain.grid, self.windows, axis, "zeros", "zeros", op="scatter_add_windows"
            )
        if self.overlap == "mean":
            y = y * self.inv_count.to(y.dtype)
        return y

    def gather_replica(self) -> tuple[torch.Tensor | None, ...]:
        """The whole weight ``(embed_dim, out_ch·p·p)`` and bias (``replicas.py``; collective)."""
        axis, sizes = self.domain.axis, self.out_sizes
        with comm_site("patch_recovery.replica"):
            weight = all_gather(self.weight, axis, 1, sizes)
            return weight, None if self.bias is None else all_gather(self.bias, axis, 0, sizes)

    def replica_numel(self) -> int:
        cols = sum(self.out_sizes)
        return self.embed_dim * cols + (cols if self.bias is not None else 0)

    def channel_dims(
        self, inputs: Sequence[str] | None = None, outputs: Sequence[str] | None = None
    ) -> ChannelDims:
        """The weight's columns and the bias, ``(channel, i, j)``: ``p_lat·p_lon`` per output channel."""
        if outputs is None:
            return {}
        pp = self.patch[0] * self.patch[1]
        dims = {"weight": (ChannelDim(1, tuple(outputs), pp),)}
        if self.bias is not None:
            dims["bias"] = (ChannelDim(0, tuple(outputs), pp),)
        return dims

    def cost(self, batch: int, elsize: int = 4, input_grad: bool = True) -> Cost:
        """The token matmul to ``out_ch·p·p`` columns, then the fold's windows scattered home."""
        d = self.domain
        cost = channel_matmul(
            self.strategy, d.counts(batch), d.index, self.embed_dim, self.out_sizes,
            self.bias is not None, elsize, input_grad, "patch_recovery.matmul",
        )  # fmt: skip
        h, w = d.tile.shape
        (ph, pw), (sh, sw) = self.patch, self.stride
        canvas = batch * self.out_ch * ((h - 1) * sh + ph) * ((w - 1) * sw + pw) * elsize
        cost.peak += canvas
        if d.size > 1:
            win = window_bytes(
                self.out_domain.grid, self.windows, "zeros", "zeros", batch * self.out_ch, elsize
            )
            cost.bytes["patch_recovery.windows"] = win
        return cost

    def extra_repr(self) -> str:
        g = self.out_domain.grid
        return (
            f"{self.embed_dim} -> {self.out_ch}, patch={self.patch}, stride={self.stride}, "
            f"out_grid=({g.n_lat}, {g.n_lon}), overlap={self.overlap}, shards {self.out_sizes}"
        )


def _coverage(r0: int, r1: int, n_tok: int, p: int, s: int, before: int) -> torch.Tensor:
    """Number of patches covering each point of ``[r0, r1)``."""
    count = torch.zeros(r1 - r0, dtype=torch.float64)
    for t in range(n_tok):
        lo, hi = max(t * s - before, r0), min(t * s - before + p, r1)
        if lo < hi:
            count[lo - r0 : hi - r0] += 1
    return count
