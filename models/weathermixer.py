"""WeatherMixer: the MLP-Mixer for weather that Jigsaw was published with.

    fields ─ PatchEmbed ─▶ tokens ─ [ x + TokenMixing(LN(x)) ; x + ChannelMLP(LN(x)) ] × depth
           ─ (LN) ─ PatchRecovery ─▶ Δ fields;  next state = state + Δ

Token mixing is an MLP along the (global) token dimension, so its cost grows linearly with
the number of tokens and its weights with the grid; channel mixing is a per-token MLP. Written
once on jigsaw layers: the same code runs on one rank and on any lat × lon mesh.

The Jigsaw paper's arrangement (presets ``paper-c1``, ``paper-1.1b``; its public ``Model.py``)::

    t0 = PatchEmbed(fields);  t = blocks(t0)
    concat:          r = PatchRecovery([LN(t), t0])               (2 × embed_dim channels in)
    linear_residual: next state = Linear(LN([LN(r), state]))      (per grid point, 2·n_state → n_state)

Concatenation is along channels, which every token holds whole, so it needs no communication.
"""

from __future__ import annotations

import torch
from jigsaw_earth.models.common import Forecaster
from jigsaw_earth.models.presets import WeatherMixerConfig
from torch import nn

from jigsaw_earth.layers.base import Domain
from jigsaw_earth.layers.channels import ChannelDims, ModelChannels, prefixed
from jigsaw_earth.layers.dropout import Dropout
from jigsaw_earth.layers.linear import Linear
from jigsaw_earth.layers.mlp import MLP
from jigsaw_earth.layers.norm import LayerNorm
from jigsaw_earth.layers.token_mixing import TokenMixing

__all__ = ["MixerBlock", "WeatherMixer", "hidden_sizes"]


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
        dim = cfg.embed_dim
        self.embed, recover = self.patch_layers(
            dim, cfg.patch, cfg.stride, cfg.lat_mode, 2 * dim if cfg.concat else dim
        )
        tokens = self.embed.out_domain
        token_hidden, channel_hidden = hidden_sizes(cfg, tokens.grid.n_lat * tokens.grid.n_lon)
        self.blocks = nn.ModuleList(
            MixerBlock(tokens, dim, token_hidden, channel_hidden, cfg) for _ in range(cfg.depth)
        )
        self.norm = LayerNorm(tokens, dim) if cfg.final_norm else None
        self.recover = recover  # registered after the blocks: the parameter order of earlier versions
        if cfg.linear_residual:  # per grid point, on channels-last field tiles
            self.norm_recovered = LayerNorm(domain, n_state)
            self.norm_joined = LayerNorm(domain, 2 * n_state)
            self.out = Linear(domain, 2 * n_state, n_state)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        t0 = t = self.embed(x)
        for block in self.blocks:
            t = block(t)
        if self.norm is not None:
            t = self.norm(t)
        y = self.recover(torch.cat([t, t0], dim=-1) if self.cfg.concat else t)
        if not self.cfg.linear_residual:
            return y
        state = x[:, : self.n_state].movedim(1, -1)  # the inputs start with the state
        joined = torch.cat([self.norm_recovered(y.movedim(1, -1)), state], dim=-1)
        return self.out(self.norm_joined(joined)).movedim(-1, 1)

    def channel_dims(self, channels: ModelChannels) -> ChannelDims:
        """Patch embedding and recovery (``Forecaster``), and with ``linear_residual`` its norms
        and linear layer: ``[LN(recovered), state]`` is two blocks of the state's channels. Those
        norms normalise *over* the channels, so with channels added or removed the kept channels'
        forecast starts near the parent's, not at it."""
        dims = super().channel_dims(channels)
        if self.cfg.linear_residual:
            state = channels.state
            joined = (*(f"recovered:{c}" for c in state), *(f"state:{c}" for c in state))
            dims.update(prefixed("norm_recovered", self.norm_recovered.channel_dims(state)))
            dims.update(prefixed("norm_joined", self.norm_joined.channel_dims(joined)))
            dims.update(prefixed("out", self.out.channel_dims(joined, state)))
        return dims


def hidden_sizes(cfg: WeatherMixerConfig, n_tokens: int) -> tuple[int, int]:
    """``(token_hidden, channel_hidden)``: the fractions of the token count and of embed_dim when
    set (rounded down, as the paper's code does), else the absolute sizes."""
    token, channel = cfg.token_hidden, cfg.channel_hidden
    if cfg.token_hidden_fraction is not None:
        token = int(cfg.token_hidden_fraction * n_tokens)
    if cfg.channel_hidden_fraction is not None:
        channel = int(cfg.channel_hidden_fraction * cfg.embed_dim)
    for name, value, of in (("token", token, f"{n_tokens} tokens"), ("channel", channel, f"{cfg.embed_dim}")):
        if value < 1:
            fraction = getattr(cfg, f"{name}_hidden_fraction")
            raise ValueError(
                f"WeatherMixer: {name}_hidden_fraction {fraction} gives a hidden size of {value} of {of}; "
                "use a larger fraction"
            )
    return token, channel
