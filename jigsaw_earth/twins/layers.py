"""The plain form of each jigsaw layer, built from the one-rank layer itself (``PLAIN``).

A plain form reads the layer's geometry (its paddings, receptive-field windows, token grids,
crop offsets, masks) and computes with what a PyTorch user writes for the whole field where the
layer uses its own code: ``nn.Linear`` for the distributed matmuls; ``nn.Conv2d`` /
``nn.ConvTranspose2d`` after ``sphere_pad`` for the convolutions and the patch embedding
(``F.pad``: circular in longitude; zeros, replicate or the rows across the pole in latitude, as
the layer says), never the serial reference of the halo exchange (``pad_reference``), which
indexes cell by cell; ``F.fold`` for patch recovery, ``nn.LayerNorm`` and ``nn.GroupNorm`` for
the norms, ``F.scaled_dot_product_attention`` for ring attention, ``F.avg_pool2d`` /
``F.max_pool2d`` / ``F.interpolate`` for the resamplers, ``nn.Dropout`` for the mesh-invariant
mask. Formulas no distributed code computes are called, not copied: the activations,
neighbourhood attention's scores on the padded K/V, the bilinear weights. Parameters keep
torch's layouts; ``canonical_to_twin`` / ``canonical_names`` say how a jigsaw tensor maps onto
them (``load.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from .. import layers as J
from ..distributed.halo import LatMode, LonMode, Window
from ..layers.attention import merge_heads, neighbourhood_attention, split_heads
from ..layers.conv_transpose import crop_output
from ..layers.mlp import PairBlock
from ..layers.resample import _Interpolate, _Pool, interpolate_window

__all__ = ["MLP", "PLAIN", "TokenMixing", "sphere_pad", "sphere_window"]

Pair = tuple[int, int]


def sphere_pad(x: torch.Tensor, pad: tuple[Pair, Pair], lat_mode: LatMode, lon_mode: LonMode) -> torch.Tensor:
    """A field ``(B, C, H, W)`` padded by ``((top, bottom), (left, right))`` as a PyTorch user pads
    it: the latitude rows first (``F.pad`` with zeros or ``replicate``; for ``pole`` the rows
    across the pole: the ones inside it, flipped and turned half a circle), then longitude with
    ``F.pad(mode="circular")`` (or zeros)."""
    (top, bottom), (left, right) = pad
    if top or bottom:
        if lat_mode == "pole":
            half, n_lat = x.shape[-1] // 2, x.shape[-2]
            above = x[..., :top, :].flip(-2).roll(half, -1)
            below = x[..., n_lat - bottom :, :].flip(-2).roll(half, -1)
            x = torch.cat([above, x, below], dim=-2)
        else:
            x = F.pad(x, (0, 0, top, bottom), mode="constant" if lat_mode == "zeros" else "replicate")
    if left or right:
        x = F.pad(x, (left, right, 0, 0), mode="circular" if lon_mode == "periodic" else "constant")
    return x


def sphere_window(x: torch.Tensor, window: Window, lat_mode: LatMode, lon_mode: LonMode) -> torch.Tensor:
    """``window = (lat_lo, lat_hi, lon_lo, lon_hi)`` of the field padded by ``sphere_pad`` (a view
    of it, or of ``x`` when the window lies inside the grid)."""
    n_lat, n_lon = x.shape[-2:]
    lat_lo, lat_hi, lon_lo, lon_hi = window
    top, bottom, left, right = (
        max(0, -lat_lo),
        max(0, lat_hi - n_lat),
        max(0, -lon_lo),
        max(0, lon_hi - n_lon),
    )
    y = sphere_pad(x, ((top, bottom), (left, right)), lat_mode, lon_mode)
    return y[..., lat_lo + top : lat_hi + top, lon_lo + left : lon_hi + left]


class Linear(nn.Linear):
    """``nn.Linear`` (jigsaw keeps the weight as ``(in, out)``, the transpose)."""

    def __init__(self, layer: J.Linear | PairBlock):
        super().__init__(layer.in_features, layer.out_features, layer.bias is not None)

    def canonical_to_twin(self, name: str, t: torch.Tensor) -> torch.Tensor:
        return t.t() if name == "weight" else t


class MLP(nn.Module):
    """``fc2(dropout(act(fc1(x))))`` with ``nn.Linear`` layers (tensor parallelism splits them)."""

    def __init__(self, layer: J.MLP):
        super().__init__()
        self.act, self.fc1, self.fc2 = layer.act, Linear(layer.fc1), Linear(layer.fc2)
        self.drop = nn.Dropout(layer.drop.p) if layer.drop is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc1(x))
        return self.fc2(self.drop(h) if self.drop is not None else h)


class TokenMixing(nn.Module):
    """``nn.Linear`` layers along the ``H·W`` tokens of ``(B, H, W, C)``: jigsaw's ``w1 (hidden, H,
    W)``, ``b1``, ``w2 (H, W, hidden)`` and ``b2 (H, W)`` flattened."""

    canonical_names: ClassVar = {"fc1.weight": "w1", "fc1.bias": "b1", "fc2.weight": "w2", "fc2.bias": "b2"}

    def __init__(self, layer: J.TokenMixing):
        super().__init__()
        self.act = layer.act
        self.fc1 = nn.Linear(layer.n_tokens, layer.hidden_tokens)
        self.fc2 = nn.Linear(layer.hidden_tokens, layer.n_tokens)

    def canonical_to_twin(self, name: str, t: torch.Tensor) -> torch.Tensor:
        twin = {v: k for k, v in self.canonical_names.items()}[name]
        return t.reshape(self.get_parameter(twin).shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        y = self.fc2(self.act(self.fc1(x.reshape(B, H * W, C).transpose(1, 2))))
        return y.transpose(1, 2).reshape(B, H, W, C)


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` over the channels (the last dim, or dim 1 of a field)."""

    def __init__(self, layer: J.LayerNorm):
        super().__init__(layer.channels, layer.eps, layer.weight is not None)
        self.channels_first = layer.channels_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.channels_first:
            return super().forward(x)
        return super().forward(x.movedim(1, -1)).movedim(-1, 1)


def _group_norm(layer: J.GroupNorm) -> nn.GroupNorm:
    return nn.GroupNorm(layer.num_groups, layer.channels, layer.eps, layer.weight is not None)


class Conv2d(nn.Conv2d):
    """``nn.Conv2d`` (no padding of its own) after ``sphere_pad`` by the layer's padding; for
    ``PatchEmbed`` (weight ``(C·p·p, D)`` in jigsaw) the tokens come out channels-last."""

    def __init__(self, layer: J.Conv2d | J.PatchEmbed):
        embed = isinstance(layer, J.PatchEmbed)
        kernel, dilation = (layer.patch, 1) if embed else (layer.kernel, layer.dilation)
        out_ch = layer.embed_dim if embed else layer.out_ch
        super().__init__(layer.in_ch, out_ch, kernel, layer.stride, 0, dilation, bias=layer.bias is not None)
        self.pad, self.modes, self.channels_last = layer.padding, layer.modes, embed

    def canonical_to_twin(self, name: str, t: torch.Tensor) -> torch.Tensor:
        return t.t().reshape(self.weight.shape) if self.channels_last and name == "weight" else t

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(sphere_pad(x, self.pad, *self.modes))
        return y.permute(0, 2, 3, 1) if self.channels_last else y


class ConvTranspose2d(nn.ConvTranspose2d):
    """``nn.ConvTranspose2d`` on the input points that reach the output (the field itself when the
    output is torch's size, else ``sphere_window``), cropped to the output."""

    def __init__(self, layer: J.ConvTranspose2d):
        super().__init__(layer.in_ch, layer.out_ch, layer.kernel, layer.stride, bias=layer.bias is not None)
        self.window, self.modes, self.offset = layer.windows[0], layer.modes, layer.offset
        self.out = layer.out_domain.tile.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.window != (0, x.shape[-2], 0, x.shape[-1]):
            x = sphere_window(x, self.window, *self.modes)
        z = super().forward(x)
        (top, left), (h, w) = self.offset, self.out
        if top + h <= z.shape[-2] and left + w <= z.shape[-1]:
            return z[..., top : top + h, left : left + w]
        return crop_output(z, self.offset, self.out)  # zeros where the output reaches past z


class PatchRecovery(nn.Linear):
    """``nn.Linear`` per token, ``F.fold`` onto the patches' canvas, the grid cropped out of it
    (``overlap="mean"``: times the layer's inverse coverage)."""

    def __init__(self, layer: J.PatchRecovery):
        super().__init__(layer.embed_dim, layer.weight.shape[1], layer.bias is not None)
        self.patch, self.stride, self.window = layer.patch, layer.stride, layer.windows[0]
        self.out = layer.out_domain.tile.shape
        self.register_buffer("inv_count", getattr(layer, "inv_count", None), persistent=False)

    canonical_to_twin = Linear.canonical_to_twin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, h, w, D = x.shape
        lat0, lat1, lon0, lon1 = self.window
        cols = super().forward(x.reshape(B, h * w, D)).transpose(1, 2)
        y = F.fold(cols, (lat1 - lat0, lon1 - lon0), self.patch, stride=self.stride)
        y = y[..., -lat0 : -lat0 + self.out[0], -lon0 : -lon0 + self.out[1]]
        return y if self.inv_count is None else y * self.inv_count.to(y.dtype)


class Pool(nn.Module):
    """``F.avg_pool2d`` / ``F.max_pool2d`` with ``ceil_mode``."""

    def __init__(self, layer: _Pool):
        super().__init__()
        self.factor, self.pool = layer.factor, F.avg_pool2d if layer.mode == "avgpool" else F.max_pool2d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x, self.factor, self.factor, ceil_mode=True)


class Interpolate(nn.Module):
    """``F.interpolate(mode="nearest")``; bilinear on the sphere: the layer's weights on the
    ``sphere_window`` of the field."""

    def __init__(self, layer: _Interpolate):
        super().__init__()
        self.mode, self.modes, self.window = layer.mode, layer.modes, layer.windows[0]
        self.out = layer.out_domain.tile.shape
        for name, t in layer.named_buffers():
            self.register_buffer(name, t, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "nearest":
            return F.interpolate(x, size=self.out, mode="nearest")
        y = sphere_window(x, self.window, *self.modes)
        return interpolate_window(y, "bilinear", (self.idx0, self.idx1), (self.lam0, self.lam1))


class GlobalAttention(nn.Module):
    """``nn.Linear`` projections around one ``F.scaled_dot_product_attention`` over all tokens."""

    def __init__(self, layer: J.GlobalAttention | J.LocalAttention):
        super().__init__()
        self.num_heads = layer.num_heads
        self.q, self.k, self.v, self.proj = (Linear(getattr(layer, n)) for n in ("q", "k", "v", "proj"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (split_heads(lin(x), self.num_heads) for lin in (self.q, self.k, self.v))
        return self.proj(merge_heads(F.scaled_dot_product_attention(q, k, v), x))


class LocalAttention(GlobalAttention):
    """Neighbourhood attention on K/V padded by ``sphere_pad``, between ``nn.Linear`` projections."""

    def __init__(self, layer: J.LocalAttention):
        super().__init__(layer)
        self.radius, self.halo = layer.radius, layer.halo
        self.rel_bias = nn.Parameter(torch.empty_like(layer.rel_bias)) if layer.rel_bias is not None else None
        self.register_buffer("valid", layer.valid, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kv = torch.cat([self.k(x), self.v(x)], dim=-1).permute(0, 3, 1, 2)
        kv = sphere_pad(kv, (self.halo.lat, self.halo.lon), self.halo.lat_mode, self.halo.lon_mode)
        out = neighbourhood_attention(self.q(x), kv, self.num_heads, self.radius, self.rel_bias, self.valid)
        return self.proj(out)


PLAIN: dict[type[nn.Module], Callable[..., nn.Module]] = {
    J.Linear: Linear,
    J.MLP: MLP,
    J.TokenMixing: TokenMixing,
    J.LayerNorm: LayerNorm,
    J.GroupNorm: _group_norm,
    J.InstanceNorm: _group_norm,
    J.Conv2d: Conv2d,
    J.PatchEmbed: Conv2d,
    J.ConvTranspose2d: ConvTranspose2d,
    J.PatchRecovery: PatchRecovery,
    _Pool: Pool,
    _Interpolate: Interpolate,
    J.GlobalAttention: GlobalAttention,
    J.LocalAttention: LocalAttention,
    J.Dropout: lambda layer: nn.Dropout(layer.p),
}
"""``{jigsaw layer class: its plain form's constructor, called with the one-rank layer}``."""
