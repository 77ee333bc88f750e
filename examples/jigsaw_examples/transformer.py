"""A small transformer forecaster: patch embedding → (attention + MLP) blocks → patch recovery.

Built from jigsaw layers only: ``PatchEmbed`` turns the field tile into a token tile, global
attention is exact over every token of the globe on any mesh, and ``PatchRecovery`` turns tokens
back into the field tile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from jigsaw_earth.models import Forecaster
from torch import nn

from jigsaw_earth.layers import MLP, Domain, GlobalAttention, LayerNorm

__all__ = ["Block", "Transformer", "TransformerConfig"]


@dataclass(frozen=True)
class TransformerConfig:
    """embed_dim: token channels; depth: blocks; num_heads: attention heads; patch: patch size."""

    embed_dim: int = 16
    depth: int = 2
    num_heads: int = 2
    patch: int = 4


class Block(nn.Module):
    """Pre-norm block on a token tile ``(B, h, w, dim)``."""

    def __init__(self, tokens: Domain, dim: int, heads: int):
        super().__init__()
        self.norm1, self.attn = LayerNorm(tokens, dim), GlobalAttention(tokens, dim, heads)
        self.norm2, self.mlp = LayerNorm(tokens, dim), MLP(tokens, dim, 2 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Transformer(Forecaster):
    """``forward(state, static, time)`` → next state, through tokens of ``patch × patch`` points."""

    config_cls = TransformerConfig
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": {},
        "small": {"embed_dim": 128, "depth": 6, "num_heads": 4},
    }

    def __init__(self, domain: Domain, n_state: int, n_static: int, n_time: int, cfg: TransformerConfig):
        super().__init__(domain, n_state, n_static, n_time)
        self.embed, recover = self.patch_layers(cfg.embed_dim, cfg.patch, None, "pole")
        tokens = self.embed.out_domain
        self.blocks = nn.ModuleList(Block(tokens, cfg.embed_dim, cfg.num_heads) for _ in range(cfg.depth))
        self.norm = LayerNorm(tokens, cfg.embed_dim)
        self.recover = recover

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        t = self.embed(x)
        for block in self.blocks:
            t = block(t)
        return self.recover(self.norm(t))
