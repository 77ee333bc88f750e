"""Forecast models built from jigsaw layers: ViT, U-Net and WeatherMixer.

Each model is written once as plain PyTorch on jigsaw layers and runs unchanged on one rank or
on any ``lat × lon`` mesh. ``build_model(name, domain, n_state, n_static, n_time, preset,
**overrides)`` returns a ``Forecaster``: ``forward(state (B, n_state, h, w), static (n_static,
h, w), time (B, n_time)) → (B, n_state, h, w)``, all tensors being this rank's tile.
"""

from __future__ import annotations

from typing import Any

from ..layers.base import Domain
from .common import Forecaster, assemble_inputs, position_encoding
from .presets import PRESETS, UNetConfig, ViTConfig, WeatherMixerConfig, make_config

__all__ = [
    "MODELS",
    "PRESETS",
    "Forecaster",
    "UNetConfig",
    "ViTConfig",
    "WeatherMixerConfig",
    "assemble_inputs",
    "build_model",
    "make_config",
    "model_class",
    "position_encoding",
]

MODELS = ("vit", "unet", "weathermixer")


def model_class(name: str) -> type[Forecaster]:
    """The class of model ``name`` (imported lazily: each pulls in its own layers)."""
    if name == "vit":
        from .vit import ViT

        return ViT
    if name == "unet":
        from .unet import UNet

        return UNet
    if name == "weathermixer":
        from .weathermixer import WeatherMixer

        return WeatherMixer
    raise ValueError(f"model {name!r}: use one of {', '.join(MODELS)}")


def build_model(
    name: str,
    domain: Domain,
    n_state: int,
    n_static: int,
    n_time: int,
    preset: str = "tiny",
    **overrides: Any,
) -> Forecaster:
    """Model ``name`` at ``preset`` (``tiny``, ``small``, ``1b``, ``3b``) with config ``overrides``.

    Parameters are initialised by the layers; call ``jigsaw_earth.layers.init_model(model, seed)``
    for a seed-determined, mesh-invariant initialisation.
    """
    cfg = make_config(name, preset, **overrides)
    return model_class(name)(domain, n_state, n_static, n_time, cfg)
