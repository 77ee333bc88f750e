"""Plain-PyTorch twins of the jigsaw attention layers on token tensors ``(B, H, W, dim)``.

* ``GlobalAttention``: ``nn.Linear`` projections and one ``F.scaled_dot_product_attention``.
* ``LocalAttention``: neighbourhood attention defined simply: K and V padded by the sphere rules
  (longitude periodic; across the pole, or zeros with the missing cells masked out of the
  softmax), the ``(2r+1)²`` neighbours taken by shifted slices, softmax over them, weighted sum.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .dense import Linear
from .pad import sphere_pad

__all__ = ["GlobalAttention", "LocalAttention"]


class _Projections(nn.Module):
    def __init__(self, dim: int, num_heads: int, qkv_bias: bool):
        super().__init__()
        if num_heads < 1 or dim % num_heads:
            raise ValueError(f"dim={dim} must be a positive multiple of num_heads={num_heads}")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.q = Linear(dim, dim, qkv_bias)
        self.k = Linear(dim, dim, False)
        self.v = Linear(dim, dim, qkv_bias)
        self.proj = Linear(dim, dim, True)


class GlobalAttention(_Projections):
    """Multi-head self-attention over all ``H·W`` tokens of each sample."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True):
        super().__init__(dim, num_heads, qkv_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        q, k, v = (
            lin(x).reshape(B, H * W, self.num_heads, self.head_dim).transpose(1, 2)
            for lin in (self.q, self.k, self.v)
        )
        o = F.scaled_dot_product_attention(q, k, v)
        return self.proj(o.transpose(1, 2).reshape(B, H, W, C))


class LocalAttention(_Projections):
    """Attention of each token to the ``(2r+1) × (2r+1)`` cells centred on it (see module doc).

    ``rel_bias`` (optional) is ``(num_heads, (2r+1)²)``, offsets row-major from ``(-r, -r)``."""

    def __init__(
        self,
        grid: tuple[int, int],
        dim: int,
        num_heads: int,
        radius: int,
        lat_mode: str = "pole",
        qkv_bias: bool = True,
        rel_pos_bias: bool = False,
    ):
        super().__init__(dim, num_heads, qkv_bias)
        self.radius, self.lat_mode = radius, lat_mode
        n_off = (2 * radius + 1) ** 2
        self.rel_bias = nn.Parameter(torch.zeros(num_heads, n_off)) if rel_pos_bias else None
        self.register_buffer("valid", None, persistent=False)
        if lat_mode == "zeros":
            rows = torch.arange(grid[0])
            di = torch.arange(-radius, radius + 1).repeat_interleave(2 * radius + 1)
            g = rows.unsqueeze(0) + di.unsqueeze(1)
            self.valid = ((g >= 0) & (g < grid[0])).unsqueeze(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, h, w, C = x.shape
        H, d, r = self.num_heads, self.head_dim, self.radius
        q = self.q(x).permute(0, 3, 1, 2).reshape(B, H, d, h, w)
        kv = torch.cat([self.k(x), self.v(x)], dim=-1).permute(0, 3, 1, 2)
        kv = sphere_pad(kv, (r, r), (r, r), self.lat_mode, "periodic").reshape(
            B, 2, H, d, h + 2 * r, w + 2 * r
        )
        k, v = kv[:, 0], kv[:, 1]
        offsets = [(i, j) for i in range(2 * r + 1) for j in range(2 * r + 1)]
        scores = torch.stack(
            [(q * k[..., i : i + h, j : j + w]).sum(2, dtype=torch.float32) for i, j in offsets], dim=2
        ) * (d**-0.5)  # (B, H, neighbours, h, w)
        if self.rel_bias is not None:
            scores = scores + self.rel_bias.float()[None, :, :, None, None]
        if self.valid is not None:
            scores = scores.masked_fill(~self.valid, float("-inf"))
        p = torch.softmax(scores, dim=2)
        out = sum(p[:, :, n : n + 1] * v[..., i : i + h, j : j + w] for n, (i, j) in enumerate(offsets))
        return self.proj(out.to(v.dtype).reshape(B, C, h, w).permute(0, 2, 3, 1))  # type: ignore[union-attr]
