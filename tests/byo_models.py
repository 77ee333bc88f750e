"""Models defined outside jigsaw-earth for the bring-your-own-model tests: one right, one wrong.

``TileMeanNet`` subtracts a ``torch.mean`` over the field inside ``Centre``: on one rank that is
the global mean, on a mesh each rank's tile mean — the bug ``validate --model`` must name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jigsaw_earth.models import Forecaster
from torch import nn

from jigsaw_earth.layers import Conv2d, Domain

__all__ = ["Centre", "TileMeanNet", "TileMeanNetConfig"]


@dataclass(frozen=True)
class TileMeanNetConfig:
    """channels: hidden channels."""

    channels: int = 8


class Centre(nn.Module):
    """``x - mean(x)`` over the field, wrongly with a plain torch mean (over this rank's tile only)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(dim=(-2, -1), keepdim=True)


class TileMeanNet(Forecaster):
    """conv → Centre → conv: correct on one rank, wrong on any mesh."""

    config_cls = TileMeanNetConfig

    def __init__(self, domain: Domain, n_state: int, n_static: int, n_time: int, cfg: TileMeanNetConfig):
        super().__init__(domain, n_state, n_static, n_time)
        self.embed = Conv2d(domain, self.in_channels, cfg.channels, 3, lat_mode="pole")
        self.centre = Centre()
        self.out = Conv2d(domain, cfg.channels, n_state, 3, lat_mode="pole")

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.centre(torch.nn.functional.gelu(self.embed(x))))
