"""ViT, U-Net and WeatherMixer written with torch.nn only, mirroring ``models/*.py``.

Same configs (``models.presets``), same module paths and parameter names as the jigsaw models
(``load_jigsaw`` copies a one-rank jigsaw model in); no mesh, no domain: constructed from the
global grid. ``forward(state (B, n_state, H, W), static (n_static, H, W), time (B, n_time))``.
Coordinate channels and position encodings are computed once, from the same formulas.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch
from torch import nn

from ..layers.base import local_domain
from ..layers.mlp import get_activation
from ..models.common import assemble_inputs, coordinate_channels, position_encoding
from ..models.presets import UNetConfig, ViTConfig, WeatherMixerConfig
from ..models.registry import model_entry
from ..models.weathermixer import hidden_sizes
from .attention import GlobalAttention, LocalAttention
from .conv import Conv2d, Downsample, PatchEmbed, PatchRecovery, Upsample
from .dense import MLP, GroupNorm, LayerNorm, Linear, TokenMixing

__all__ = ["PlainForecaster", "PlainUNet", "PlainViT", "PlainWeatherMixer", "build_twin"]


class PlainForecaster(nn.Module):
    """``state + predict(inputs)`` (or ``predict`` alone without ``residual``), as ``Forecaster``."""

    def __init__(
        self, grid: tuple[int, int], n_state: int, n_static: int, n_time: int, residual: bool, coords: bool
    ):
        super().__init__()
        self.grid, self.n_state, self.residual = tuple(grid), n_state, residual
        self.in_channels = n_state + n_static + n_time + (4 if coords else 0)
        cpu = torch.device("cpu")
        xy = coordinate_channels(local_domain(*grid), torch.float32, cpu) if coords else None
        self.register_buffer("coords", xy, persistent=False)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, state: torch.Tensor, static: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        coords = self.coords.to(state.dtype) if self.coords is not None else None
        delta = self.predict(assemble_inputs(state, static, time, coords))
        return state + delta if self.residual else delta


class TransformerBlock(nn.Module):
    def __init__(self, grid: tuple[int, int], cfg: ViTConfig, local: bool):
        super().__init__()
        dim = cfg.embed_dim
        self.norm1 = LayerNorm(dim)
        if local:
            lat_mode = "pole" if cfg.lat_mode == "pole" else "zeros"
            self.attn: nn.Module = LocalAttention(grid, dim, cfg.num_heads, cfg.local_radius, lat_mode)
        else:
            self.attn = GlobalAttention(dim, cfg.num_heads)
        self.drop = nn.Dropout(cfg.dropout) if cfg.dropout > 0 else None
        self.norm2 = LayerNorm(dim)
        self.mlp = MLP(dim, int(dim * cfg.mlp_ratio), dropout=cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.attn(self.norm1(x))
        if self.drop is not None:
            a = self.drop(a)
        x = x + a
        return x + self.mlp(self.norm2(x))


class PlainViT(PlainForecaster):
    def __init__(
        self, grid: tuple[int, int], n_state: int, n_static: int, n_time: int, cfg: ViTConfig | None = None
    ):
        cfg = cfg or ViTConfig()
        super().__init__(grid, n_state, n_static, n_time, cfg.residual, cfg.coord_channels)
        stride = cfg.stride or cfg.patch
        self.embed = PatchEmbed(
            grid, self.in_channels, cfg.embed_dim, cfg.patch, stride, lat_mode=cfg.lat_mode
        )
        tokens = self.embed.tokens
        pos = position_encoding(
            local_domain(*tokens), cfg.embed_dim, cfg.pos_encoding, torch.float32, torch.device("cpu")
        )
        self.register_buffer("pos", pos, persistent=False)
        every = cfg.local_every
        self.blocks = nn.ModuleList(
            TransformerBlock(tokens, cfg, local=every > 0 and (i + 1) % every == 0) for i in range(cfg.depth)
        )
        self.norm = LayerNorm(cfg.embed_dim)
        overlap = "mean" if stride < cfg.patch else "sum"
        self.recover = PatchRecovery(cfg.embed_dim, n_state, cfg.patch, stride, grid, overlap)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        t = self.embed(x)
        if self.pos is not None:
            t = t + self.pos.to(t.dtype)
        for block in self.blocks:
            t = block(t)
        return self.recover(self.norm(t))


class ConvBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, cfg: UNetConfig):
        super().__init__()
        self.act = get_activation(cfg.activation)
        self.convs = nn.ModuleList(
            Conv2d(in_ch if i == 0 else out_ch, out_ch, cfg.kernel, lat_mode=cfg.lat_mode)
            for i in range(cfg.convs_per_block)
        )
        self.norms = nn.ModuleList(GroupNorm(cfg.groups, out_ch) for _ in range(cfg.convs_per_block))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv, norm in zip(self.convs, self.norms):
            x = self.act(norm(conv(x)))
        return x


class PlainUNet(PlainForecaster):
    def __init__(
        self, grid: tuple[int, int], n_state: int, n_static: int, n_time: int, cfg: UNetConfig | None = None
    ):
        cfg = cfg or UNetConfig()
        super().__init__(grid, n_state, n_static, n_time, cfg.residual, cfg.coord_channels)
        chans = [cfg.base_channels * m for m in cfg.channel_mults]
        grids = [tuple(grid)]
        self.encoder = nn.ModuleList([ConvBlock(self.in_channels, chans[0], cfg)])
        self.down = nn.ModuleList()
        for lo, hi in itertools.pairwise(chans):
            self.down.append(Downsample(lo, hi, mode=cfg.down, lat_mode=cfg.lat_mode))
            grids.append(tuple(-(-n // 2) for n in grids[-1]))
            self.encoder.append(ConvBlock(hi, hi, cfg))
        self.up = nn.ModuleList()
        self.decoder = nn.ModuleList()
        for level in reversed(range(len(chans) - 1)):
            self.up.append(
                Upsample(
                    grids[level + 1],
                    chans[level + 1],
                    chans[level],
                    mode=cfg.up,
                    out_grid=grids[level],
                    lat_mode=cfg.lat_mode,
                )
            )
            self.decoder.append(ConvBlock(2 * chans[level], chans[level], cfg))
        self.head = Conv2d(chans[0], n_state, 1)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        skips = [self.encoder[0](x)]
        for down, block in zip(self.down, self.encoder[1:]):
            skips.append(block(down(skips[-1])))
        y = skips.pop()
        for up, block in zip(self.up, self.decoder):
            y = block(torch.cat([up(y), skips.pop()], dim=1))
        return self.head(y)


class MixerBlock(nn.Module):
    def __init__(self, grid: tuple[int, int], cfg: WeatherMixerConfig):
        super().__init__()
        dim = cfg.embed_dim
        self.norm_tokens = LayerNorm(dim)
        self.token_mixing = TokenMixing(grid, cfg.token_hidden, activation=cfg.activation)
        self.drop = nn.Dropout(cfg.dropout) if cfg.dropout > 0 else None
        self.norm_channels = LayerNorm(dim)
        self.channel_mixing = MLP(dim, cfg.channel_hidden, activation=cfg.activation, dropout=cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed = self.token_mixing(self.norm_tokens(x))
        if self.drop is not None:
            mixed = self.drop(mixed)
        x = x + mixed
        return x + self.channel_mixing(self.norm_channels(x))


class PlainWeatherMixer(PlainForecaster):
    def __init__(
        self,
        grid: tuple[int, int],
        n_state: int,
        n_static: int,
        n_time: int,
        cfg: WeatherMixerConfig | None = None,
    ):
        cfg = cfg or WeatherMixerConfig()
        super().__init__(grid, n_state, n_static, n_time, cfg.residual, cfg.coord_channels)
        self.cfg, self.n_state = cfg, n_state
        dim = cfg.embed_dim
        self.embed = PatchEmbed(grid, self.in_channels, dim, cfg.patch, cfg.stride, lat_mode=cfg.lat_mode)
        tokens = self.embed.tokens
        token_hidden, channel_hidden = hidden_sizes(cfg, tokens[0] * tokens[1])
        cfg_blocks = dataclasses.replace(cfg, token_hidden=token_hidden, channel_hidden=channel_hidden)
        self.blocks = nn.ModuleList(MixerBlock(tokens, cfg_blocks) for _ in range(cfg.depth))
        self.norm = LayerNorm(dim) if cfg.final_norm else None
        overlap = "mean" if any(s < q for s, q in zip(self.embed.stride, self.embed.patch)) else "sum"
        self.recover = PatchRecovery(
            2 * dim if cfg.concat else dim, n_state, self.embed.patch, self.embed.stride, grid, overlap
        )
        if cfg.linear_residual:
            self.norm_recovered = LayerNorm(n_state)
            self.norm_joined = LayerNorm(2 * n_state)
            self.out = Linear(2 * n_state, n_state)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        t0 = t = self.embed(x)
        for block in self.blocks:
            t = block(t)
        if self.norm is not None:
            t = self.norm(t)
        y = self.recover(torch.cat([t, t0], dim=-1) if self.cfg.concat else t)
        if not self.cfg.linear_residual:
            return y
        joined = torch.cat([self.norm_recovered(y.movedim(1, -1)), x[:, : self.n_state].movedim(1, -1)], -1)
        return self.out(self.norm_joined(joined)).movedim(-1, 1)



def build_twin(
    name: str,
    grid: tuple[int, int],
    n_state: int,
    n_static: int,
    n_time: int,
    preset: str = "tiny",
    **overrides,
) -> PlainForecaster:
    """The plain twin of ``build_model(name, ...)`` on the global ``grid`` (same config rules).

    The model registry names each model's twin (``register_model(..., twin=...)``).
    """
    entry = model_entry(name)
    twin = entry.twin_cls()
    if twin is None:
        raise ValueError(f"model {name} has no plain-torch twin; compare it with its serial self instead")
    return twin(grid, n_state, n_static, n_time, entry.config(preset, **overrides))
