"""WeatherMixer: the MLP-Mixer for weather that Jigsaw was published with.

    fields ─ PatchEmbed ─▶ tokens ─ [ x + TokenMixing(LN(x)) ; x + ChannelMLP(LN(x)) ] × depth
           ─ (LN) ─ PatchRecovery ─▶ Δ fields;  next state = state + Δ

Token mixing is an MLP along the (global) token dimension, so its cost grows linearly with
the number of tokens and its weights with the grid; channel mixing is a per-token MLP. Written
once on jigsaw layers: the same code runs on one rank and on any lat × lon mesh.
"""

from __future__ import annotations

import torch
from torch import nn

from ..layers.base import Domain
from ..layers.dropout import Dropout
from ..layers.mlp import MLP
from ..layers.norm import LayerNorm
from ..layers.token_mixing import TokenMixing
from .common import Forecaster
from .presets import WeatherMixerConfig

__all__ = ["MixerBlock", "WeatherMixer"]


class MixerBlock(nn.Module):
    """One mixer block on a token tile ``(B, h, w, dim)``: token mixing, then channel mixing."""

    def __init__(
        self, domain: Domain, dim: int, token_hidden: int, channel_hidden: int, cfg: WeatherMixerConfig
    ):
        super().__init__()
        self.dim = dim  # channels the token mixing carries (read by the communication summary)
        self.norm_tokens = LayerNorm(domain, dim)
        self.token_mixing = TokenMixing(domain, token_hidden, activation=cfg.activation, channels=dim)
        self.drop = Dropout(domain, cfg.dropout, layout="tokens") if cfg.dropout > 0 else None
        self.norm_channels = LayerNorm(domain, dim)
        self.channel_mixing = MLP(domain, dim, channel_hidden, activation=cfg.activation, dropout=cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed = self.token_mixing(self.norm_tokens(x))
        if self.drop is not None:
            mixed = self.drop(mixed)
        x = x + mixed
        return x + self.channel_mixing(self.norm_channels(x))


class WeatherMixer(Forecaster):
    """``forward(state (B, n_state, h, w), static (n_static, h, w), time (B, n_time))`` → next state."""

    def __init__(
        self, domain: Domain, n_state: int, n_static: int, n_time: int, cfg: WeatherMixerConfig | None = None
    ):
        cfg = cfg or WeatherMixerConfig()
        super().__init__(domain, n_state, n_static, n_time, cfg.residual, cfg.coord_channels)
        self.cfg = cfg
        self.embed, recover = self.patch_layers(cfg.embed_dim, cfg.patch, cfg.stride, cfg.lat_mode)
        tokens = self.embed.out_domain
        self.blocks = nn.ModuleList(
            MixerBlock(tokens, cfg.embed_dim, cfg.token_hidden, cfg.channel_hidden, cfg)
            for _ in range(cfg.depth)
        )
        self.norm = LayerNorm(tokens, cfg.embed_dim) if cfg.final_norm else None
        self.recover = recover  # registered last: the parameter order of earlier versions

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        t = self.embed(x)
        for block in self.blocks:
            t = block(t)
        return self.recover(self.norm(t) if self.norm is not None else t)
