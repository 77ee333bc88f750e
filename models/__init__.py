"""Forecast models built from jigsaw layers: ViT, U-Net, WeatherMixer, and yours.

Each model is written once as plain PyTorch on jigsaw layers and runs unchanged on one rank or
on any ``lat × lon`` mesh. ``build_model(name, domain, n_state, n_static, n_time, preset,
**overrides)`` returns a forecaster: ``forward(state (B, n_state, h, w), static (n_static,
h, w), time (B, n_time)) → (B, n_state, h, w)``, all tensors being this rank's tile. ``name`` is
a registered model (``registry.py``: the built-ins, ``register_model``, the entry-point group
``jigsaw_earth.models``) or ``package.module:Class``.
"""

from __future__ import annotations

from jigsaw_earth.models.common import Forecaster, assemble_inputs, position_encoding
from jigsaw_earth.models.presets import PRESETS, UNetConfig, ViTConfig, WeatherMixerConfig
from jigsaw_earth.models.registry import (
    build_model,
    make_config,
    model_entry,
    model_from_config,
    model_names,
    register_model,
)
from torch import nn

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
    "model_entry",
    "model_from_config",
    "model_names",
    "position_encoding",
    "register_model",
]

MODELS = model_names()  # the registered models (built-ins, then installed entry points)


def model_class(name: str) -> type[nn.Module]:
    """The class of model ``name`` (registered or ``package.module:Class``; imported lazily)."""
    return model_entry(name).cls()
