"""Model sizes: one typed config per model and named presets (``tiny`` … ``3b``, ``paper-*``).

``tiny`` is for tests and the demo (runs in seconds on CPU, any grid ≥ 16 × 16); ``small`` is a
laptop-sized model; ``1b`` and ``3b`` reach the paper's scale (≈1 and ≈3 billion parameters at
the 721 × 1440 ERA5 grid with 69 state channels — WeatherMixer's token mixing grows with the
grid). Parameter counts measured with ``jigsaw-earth model summary`` are in docs/models.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["PRESETS", "UNetConfig", "ViTConfig", "WeatherMixerConfig"]


@dataclass(frozen=True)
class ViTConfig:
    """Vision-transformer forecaster.

    embed_dim: token channels; depth: number of blocks; num_heads: attention heads;
    mlp_ratio: channel-MLP hidden size / embed_dim; patch: patch size (lat = lon);
    stride: patch stride (< patch: overlapping patches through the halo); pos_encoding:
    ``"sincos"`` (token indices), ``"spherical"`` (token lat/lon) or ``"none"``; local_every: every
    k-th block uses neighbourhood attention instead of global (0: all global); local_radius:
    its radius in tokens; lat_mode: what lies beyond a pole for patches and local attention;
    coord_channels: append sin/cos lat/lon to the inputs; residual: predict state + Δ.
    """

    embed_dim: int = 64
    depth: int = 2
    num_heads: int = 4
    mlp_ratio: float = 4.0
    patch: int = 4
    stride: int | None = None
    pos_encoding: str = "spherical"
    local_every: int = 0
    local_radius: int = 1
    lat_mode: str = "pole"
    dropout: float = 0.0
    coord_channels: bool = True
    residual: bool = True


@dataclass(frozen=True)
class UNetConfig:
    """Convolutional U-Net forecaster.

    base_channels: channels at full resolution; channel_mults: multiplier per level (one
    down-sampling between levels); convs_per_block: 3×3 convolutions per block; groups: group
    norm groups (must divide every level's channels); kernel: conv kernel size; down / up:
    resampling modes; lat_mode: pole treatment of the convolutions (``"zeros"``,
    ``"replicate"`` or ``"pole"``; longitude is always periodic); activation: elementwise
    nonlinearity; coord_channels, residual: as for the ViT.
    """

    base_channels: int = 8
    channel_mults: tuple[int, ...] = (1, 2)
    convs_per_block: int = 2
    groups: int = 4
    kernel: int = 3
    down: str = "conv"
    up: str = "transposed"
    lat_mode: str = "pole"
    activation: str = "gelu"
    coord_channels: bool = True
    residual: bool = True


@dataclass(frozen=True)
class WeatherMixerConfig:
    """WeatherMixer (Jigsaw's MLP-Mixer for weather).

    embed_dim: token channels; depth: mixer blocks; channel_hidden: channel-MLP hidden size;
    token_hidden: token-mixing hidden size (its weights scale with the number of tokens, so
    the parameter count depends on the grid); patch / stride: patch embedding, one size or
    ``(lat, lon)`` — the paper's patches are ``(1, 60)``; lat_mode: beyond-pole rule of
    overlapping patches; activation; dropout; final_norm: a channel LayerNorm before patch
    recovery — off by default, because token mixing's output bias adds a per-token constant to
    every channel, which a final channel norm cancels exactly (that bias would then get a zero
    gradient); coord_channels, residual.

    The Jigsaw paper's arrangement (its ``Model.py``): token_hidden_fraction /
    channel_hidden_fraction (its ``spatial_hidden_dim_fraction`` / ``features_hidden_dim_fraction``)
    size the hidden layers from the token count and embed_dim, replacing token_hidden /
    channel_hidden when set; concat: patch recovery reads ``[blocks' output (after final_norm),
    patch embedding's output]`` (2 × embed_dim channels); linear_residual: the output is
    ``Linear(LN([LN(recovered), state]))`` per grid point (2 × n_state → n_state), a learned
    residual — use it with ``residual: false``, as the paper does.
    """

    embed_dim: int = 32
    depth: int = 2
    channel_hidden: int = 64
    token_hidden: int = 32
    patch: int | tuple[int, int] = 4
    stride: int | tuple[int, int] | None = None
    lat_mode: str = "pole"
    activation: str = "gelu"
    dropout: float = 0.0
    final_norm: bool = False
    coord_channels: bool = True
    residual: bool = True
    token_hidden_fraction: float | None = None
    channel_hidden_fraction: float | None = None
    concat: bool = False
    linear_residual: bool = False


_PAPER: dict[str, Any] = dict(
    depth=3, patch=(1, 60), token_hidden_fraction=0.5, channel_hidden_fraction=1.0, final_norm=True,
    concat=True, linear_residual=True, residual=False, coord_channels=False, dropout=0.001,
)  # fmt: skip

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "vit": {
        "tiny": dict(embed_dim=16, depth=2, num_heads=2, mlp_ratio=2.0, patch=4, local_every=2),
        "small": dict(embed_dim=256, depth=8, num_heads=8, patch=4, local_every=2, local_radius=3),
        "1b": dict(embed_dim=2048, depth=20, num_heads=16, patch=8),
        "3b": dict(embed_dim=2560, depth=40, num_heads=20, patch=8),
    },
    "unet": {
        "tiny": dict(base_channels=8, channel_mults=(1, 2), groups=4),
        "small": dict(base_channels=64, channel_mults=(1, 2, 4, 8), groups=16),
        "1b": dict(base_channels=384, channel_mults=(1, 2, 4, 8, 8), convs_per_block=2, groups=32),
        "3b": dict(base_channels=704, channel_mults=(1, 2, 4, 8, 8), convs_per_block=2, groups=32),
    },
    "weathermixer": {
        "tiny": dict(embed_dim=16, depth=2, channel_hidden=32, token_hidden=24, patch=4),
        "small": dict(embed_dim=256, depth=8, channel_hidden=1024, token_hidden=512, patch=8),
        "1b": dict(embed_dim=2048, depth=16, channel_hidden=8192, token_hidden=4096, patch=16),
        "3b": dict(embed_dim=3072, depth=22, channel_hidden=12288, token_hidden=8192, patch=16),
        # the Jigsaw paper's models (DeifiliaTo/Jigsaw_SC cases/C1 and the 1.1 B scaling model of
        # cases/C2): 1 × 60 patches, 3 blocks, token hidden = half the tokens, concat, linear residual
        "paper-c1": dict(embed_dim=4320, **_PAPER),
        "paper-1.1b": dict(embed_dim=4896, **_PAPER),
    },
}
