"""Models defined outside jigsaw-earth for the bring-your-own-model tests, each wrong in one way.

``TileMeanNet`` subtracts a ``torch.mean`` over the field inside ``Centre``: on one rank that is
the global mean, on a mesh each rank's tile mean — the bug ``validate --model`` must name.
``InlineMean`` and ``InlineRoll`` write the tile-local op inline in ``predict`` (no module holds
it); ``RandomInit`` draws a bare parameter from the global generator (a new model every build);
``ParamInForward``, ``WrongSignature`` and ``WrongShape`` break the model contract.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jigsaw_earth.models import Forecaster
from torch import nn

from jigsaw_earth.layers import Conv2d, Domain, LayerNorm

__all__ = [
    "Centre",
    "InlineMean",
    "InlineRoll",
    "ParamInForward",
    "RandomInit",
    "TileMeanNet",
    "TileMeanNetConfig",
    "WrongShape",
    "WrongSignature",
]


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


class _Base(Forecaster):
    """conv → (the case's middle) → LayerNorm → conv, without a config class."""

    def __init__(self, domain: Domain, n_state: int, n_static: int, n_time: int, cfg: None):
        super().__init__(domain, n_state, n_static, n_time)
        self.embed = Conv2d(domain, self.in_channels, 8, 3, lat_mode="pole")
        self.norm = LayerNorm(domain, 8, channels_first=True)
        self.out = Conv2d(domain, 8, n_state, 3, lat_mode="pole")


class RandomInit(_Base):
    """A bare ``nn.Parameter`` drawn from the global generator: a new value every construction."""

    def __init__(self, domain: Domain, n_state: int, n_static: int, n_time: int, cfg: None):
        super().__init__(domain, n_state, n_static, n_time, cfg)
        self.bias2 = nn.Parameter(torch.randn(n_state, 1, 1) * 0.01)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(self.embed(x))) + self.bias2


class InlineMean(_Base):
    """A ``torch.mean`` over the field written inline in ``predict``, before the jigsaw LayerNorm."""

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        h = h - torch.mean(h, dim=(-2, -1), keepdim=True)
        return self.out(self.norm(h))


class InlineRoll(_Base):
    """A ``torch.roll`` along longitude written inline in ``predict``: wraps around the tile."""

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.roll(self.embed(x), 1, dims=-1)
        return self.out(self.norm(h))


class ParamInForward(_Base):
    """Creates a parameter the first time ``predict`` runs: never seen by the optimizer."""

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        if not hasattr(self, "late"):
            self.late = nn.Parameter(torch.zeros(1, device=x.device))
        return self.out(self.norm(self.embed(x))) + self.late


class WrongSignature(nn.Module):
    """``forward(x)`` instead of ``forward(state, static, time)``."""

    def __init__(self, domain: Domain, n_state: int, n_static: int, n_time: int, cfg: None):
        super().__init__()
        self.out = Conv2d(domain, n_state, n_state, 3, lat_mode="pole")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x)


class WrongShape(_Base):
    """Returns its 8 hidden channels, not ``n_state`` (no residual to hide it)."""

    def __init__(self, domain: Domain, n_state: int, n_static: int, n_time: int, cfg: None):
        super().__init__(domain, n_state, n_static, n_time, cfg)
        self.residual = False

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.embed(x))
