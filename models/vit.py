"""Vision-transformer forecaster on jigsaw layers.

    fields ─ PatchEmbed (halo-aware, optionally overlapping) ─▶ tokens + position encoding
           ─ [ x + Attention(LN(x)) ; x + MLP(LN(x)) ] × depth ─ LN ─ PatchRecovery ─▶ Δ fields

Attention is global (exact softmax over every token of the globe) or, every ``local_every``-th
block, neighbourhood attention of radius ``local_radius`` tokens (periodic in longitude, across
the pole). The position encoding is computed from each token's *global* position, so it is
the same on every mesh. Written once; the same code runs on one rank and on any mesh.
"""

from __future__ import annotations

import torch
from jigsaw_earth.models.common import Forecaster, check_position_encoding, position_encoding
from jigsaw_earth.models.presets import ViTConfig
from torch import nn

from jigsaw_earth.layers.attention import GlobalAttention, LocalAttention
from jigsaw_earth.layers.base import Domain
from jigsaw_earth.layers.dropout import Dropout
from jigsaw_earth.layers.mlp import MLP
from jigsaw_earth.layers.norm import LayerNorm

__all__ = ["TransformerBlock", "ViT"]


class TransformerBlock(nn.Module):
    """Pre-norm transformer block on a token tile ``(B, h, w, dim)``."""

    def __init__(self, domain: Domain, cfg: ViTConfig, local: bool):
        super().__init__()
        dim = cfg.embed_dim
        self.norm1 = LayerNorm(domain, dim)
        if local:
            lat_mode = "pole" if cfg.lat_mode == "pole" else "zeros"
            self.attn: nn.Module = LocalAttention(domain, dim, cfg.num_heads, cfg.local_radius, lat_mode)
        else:
            self.attn = GlobalAttention(domain, dim, cfg.num_heads)
        self.drop = Dropout(domain, cfg.dropout, layout="tokens") if cfg.dropout > 0 else None
        self.norm2 = LayerNorm(domain, dim)
        self.mlp = MLP(domain, dim, int(dim * cfg.mlp_ratio), dropout=cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.attn(self.norm1(x))
        if self.drop is not None:
            a = self.drop(a)
        x = x + a
        return x + self.mlp(self.norm2(x))


class ViT(Forecaster):
    """``forward(state (B, n_state, h, w), static (n_static, h, w), time (B, n_time))`` → next state."""

    def __init__(
        self, domain: Domain, n_state: int, n_static: int, n_time: int, cfg: ViTConfig | None = None
    ):
        cfg = cfg or ViTConfig()
        super().__init__(domain, n_state, n_static, n_time, cfg.residual, cfg.coord_channels)
        self.cfg = cfg
        self.embed, recover = self.patch_layers(cfg.embed_dim, cfg.patch, cfg.stride, cfg.lat_mode)
        self.tokens = self.embed.out_domain
        check_position_encoding(cfg.pos_encoding, cfg.embed_dim)
        every = cfg.local_every
        self.blocks = nn.ModuleList(
            TransformerBlock(self.tokens, cfg, local=every > 0 and (i + 1) % every == 0)
            for i in range(cfg.depth)
        )
        self.norm = LayerNorm(self.tokens, cfg.embed_dim)
        self.recover = recover  # registered last: the parameter order of earlier versions

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        t = self.embed(x)
        pos = position_encoding(self.tokens, self.cfg.embed_dim, self.cfg.pos_encoding, t.dtype, t.device)
        if pos is not None:
            t = t + pos
        for block in self.blocks:
            t = block(t)
        return self.recover(self.norm(t))
