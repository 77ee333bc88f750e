"""ViT, U-Net and WeatherMixer on the plain-torch twin layers, mirroring ``models/*.py``.

Same configs (``models.presets``), same module paths and parameter names as the jigsaw models
(``load_jigsaw`` copies a one-rank jigsaw model in); no mesh: constructed from the global grid.
``forward(state (B, n_state, H, W), static (n_static, H, W), time (B, n_time))``. Only the
constructors are written here (which layers, in which order): every block's ``forward`` and every
model's ``predict`` *is* the model's own (plain torch over the layers), so a change to a model's
computation reaches its twin; a new layer or module path shows as a ``load_jigsaw`` mismatch.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch
from torch import nn

from ..layers.base import local_domain
from ..layers.mlp import get_activation
from ..models import unet, vit, weathermixer
from ..models.common import assemble_inputs, coordinate_channels
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

    forward = vit.TransformerBlock.forward


class PlainViT(PlainForecaster):
    def __init__(
        self, grid: tuple[int, int], n_state: int, n_static: int, n_time: int, cfg: ViTConfig | None = None
    ):
        cfg = cfg or ViTConfig()
        super().__init__(grid, n_state, n_static, n_time, cfg.residual, cfg.coord_channels)
        self.cfg = cfg
        stride = cfg.stride or cfg.patch
        self.embed = PatchEmbed(
            grid, self.in_channels, cfg.embed_dim, cfg.patch, stride, lat_mode=cfg.lat_mode
        )
        tokens = self.embed.tokens
        self.tokens = local_domain(*tokens)  # the whole token grid, for ViT.predict's position encoding
        every = cfg.local_every
        self.blocks = nn.ModuleList(
            TransformerBlock(tokens, cfg, local=every > 0 and (i + 1) % every == 0) for i in range(cfg.depth)
        )
        self.norm = LayerNorm(cfg.embed_dim)
        overlap = "mean" if stride < cfg.patch else "sum"
        self.recover = PatchRecovery(cfg.embed_dim, n_state, cfg.patch, stride, grid, overlap)

    predict = vit.ViT.predict


class ConvBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, cfg: UNetConfig):
        super().__init__()
        self.act = get_activation(cfg.activation)
        self.convs = nn.ModuleList(
            Conv2d(in_ch if i == 0 else out_ch, out_ch, cfg.kernel, lat_mode=cfg.lat_mode)
            for i in range(cfg.convs_per_block)
        )
        self.norms = nn.ModuleList(GroupNorm(cfg.groups, out_ch) for _ in range(cfg.convs_per_block))

    forward = unet.ConvBlock.forward


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

    predict = unet.UNet.predict


class MixerBlock(nn.Module):
    def __init__(self, grid: tuple[int, int], cfg: WeatherMixerConfig):
        super().__init__()
        dim = cfg.embed_dim
        self.norm_tokens = LayerNorm(dim)
        self.token_mixing = TokenMixing(grid, cfg.token_hidden, activation=cfg.activation)
        self.drop = nn.Dropout(cfg.dropout) if cfg.dropout > 0 else None
        self.norm_channels = LayerNorm(dim)
        self.channel_mixing = MLP(dim, cfg.channel_hidden, activation=cfg.activation, dropout=cfg.dropout)

    forward = weathermixer.MixerBlock.forward


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

    predict = weathermixer.WeatherMixer.predict


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
