"""A small convolutional forecaster: (3×3 conv → group norm → GELU) × depth, then a 1×1 conv.

Every layer is a jigsaw layer, so the same code runs on one rank and on any ``lat × lon`` mesh;
the one parameter that cannot be split — a per-channel output gain — is replicated
(``sharded_parameter(shape, None)``) and its gradient summed over the domain by the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from jigsaw_earth.models import Forecaster
from torch import nn

from jigsaw_earth.layers import ChannelDim, Conv2d, Domain, GroupNorm, ModelChannels
from jigsaw_earth.layers.base import fill_uniform_, sharded_parameter
from jigsaw_earth.layers.channels import ChannelDims
from jigsaw_earth.layers.cost import Cost

__all__ = ["ChannelGain", "ConvNet", "ConvNetConfig"]


@dataclass(frozen=True)
class ConvNetConfig:
    """channels: hidden channels; depth: conv blocks; groups: group-norm groups; lat_mode: the
    convolutions' rule beyond the poles ("zeros", "replicate" or "pole")."""

    channels: int = 16
    depth: int = 2
    groups: int = 4
    lat_mode: str = "pole"


class ChannelGain(nn.Module):
    """``x * g[c]``: one gain per channel, held whole by every rank (replicated)."""

    jigsaw_layer = True  # init_model calls reset_parameters(seed=..., key=module path)

    def __init__(self, domain: Domain, channels: int):
        super().__init__()
        self.domain = domain
        self.weight = sharded_parameter((channels,), None)  # too small to split: replicated

    def reset_parameters(self, seed: int, key: str) -> None:
        fill_uniform_(self.weight, seed, f"{key}.weight", 0.9, 1.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight.view(1, -1, 1, 1)

    def cost(self, batch: int, elsize: int = 4, input_grad: bool = True) -> Cost:
        """What ``plan`` prices: no messages; one multiply per point (two more backward); keeps ``x``."""
        h, w = self.domain.tile.shape
        n = batch * self.weight.numel() * h * w
        return Cost(flops=(n, 2 * n if input_grad else n), saved=n * elsize, peak=n * elsize)


class ConvNet(Forecaster):
    """``forward(state, static, time)`` → next state; ``predict`` maps the input field to Δ."""

    config_cls = ConvNetConfig
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": {},
        "small": {"channels": 64, "depth": 4, "groups": 8},
    }
    input_layer = "convs.0"  # reads the inputs' channels
    output_layer = "out"  # writes the state's channels

    def __init__(self, domain: Domain, n_state: int, n_static: int, n_time: int, cfg: ConvNetConfig):
        super().__init__(domain, n_state, n_static, n_time)
        c = cfg.channels
        self.convs = nn.ModuleList(
            Conv2d(domain, self.in_channels if i == 0 else c, c, 3, lat_mode=cfg.lat_mode)
            for i in range(cfg.depth)
        )
        self.norms = nn.ModuleList(GroupNorm(domain, cfg.groups, c) for _ in range(cfg.depth))
        self.out = Conv2d(domain, c, n_state, 1)
        self.gain = ChannelGain(domain, n_state)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        for conv, norm in zip(self.convs, self.norms, strict=True):
            x = nn.functional.gelu(norm(conv(x)))
        return self.gain(self.out(x))

    def channel_dims(self, channels: ModelChannels) -> ChannelDims:
        """The fine-tuning hook: ``input_layer`` and ``output_layer`` (``Forecaster``), and the gain,
        one entry per state channel (an added channel keeps its fresh gain: ``out``'s zero weights
        to it already make its Δ zero)."""
        dims = super().channel_dims(channels)
        dims["gain.weight"] = (ChannelDim(0, channels.state, zero_new=False),)
        return dims
