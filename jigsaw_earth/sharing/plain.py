"""``jigsaw_earth.load_model(DIR)``: a shared model as a plain ``nn.Module`` on one device.

The network is built from the contract on a one-rank domain, its weights read from the
safetensors files, and by default swapped for its plain-PyTorch twin (``twins.plain``: torch's own
``nn.Linear``, ``nn.Conv2d``, … in place of every jigsaw layer; ``twin=False`` keeps the one-rank
jigsaw model, which computes what ``predict`` computes on one rank). ``SharedModel.forward``
takes and returns plain tensors in physical units, in the contract's channel order: it normalises
with the contract's statistics, appends the model's static fields and runs the training's step
(tendency scaling and precision as trained: ``models.run.model_step``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..data.times import time_features
from ..layers.base import local_domain
from ..models import build_model
from ..models.run import model_step
from .contract import statistics_tensors
from .folder import STATIC, ModelFolder

__all__ = ["SharedModel", "load_model"]


class SharedModel(nn.Module):
    """A shared model on one device. ``forward(state (B, C, H, W), time (B, 4), noise=None)`` → the
    state one step later, physical units, channels in ``contract['channels']['outputs']`` order;
    ``time_features(times)`` makes ``time`` from initialisation times; ``forecast`` rolls out."""

    def __init__(self, network: nn.Module, contract: dict[str, Any], static: torch.Tensor):
        super().__init__()
        self.network, self.contract = network, contract
        stats = statistics_tensors(contract)
        self.register_buffer("mean", stats["mean"].view(-1, 1, 1))
        self.register_buffer("std", stats["std"].view(-1, 1, 1))
        self.register_buffer(
            "tendency", torch.tensor(contract["normalisation"]["tendency_std"], dtype=torch.float32)
        )
        self.register_buffer("static", static)
        self.scaled = bool(contract["normalisation"]["tendency_scaling"])
        self.bf16 = contract["precision"] == "bf16"
        self.noise_channels = int(contract["model"].get("noise_channels") or 0)

    @property
    def channels(self) -> list[str]:
        return list(self.contract["channels"]["outputs"])

    @staticmethod
    def time_features(times: Any) -> torch.Tensor:
        """``(B, 4)`` time features (sin/cos of hour and day of year) of datetime64 ``times``."""
        return torch.from_numpy(time_features(np.atleast_1d(np.asarray(times, "datetime64[s]"))))

    def forward(
        self, state: torch.Tensor, time: torch.Tensor, noise: torch.Tensor | None = None
    ) -> torch.Tensor:
        want = (len(self.channels), *self.static.shape[-2:])
        if state.dim() != 4 or tuple(state.shape[1:]) != want:
            raise ValueError(
                f"state {tuple(state.shape)}: give (B, {want[0]}, {want[1]}, {want[2]}), the channels of "
                f"model.channels on the model's grid, latitude north to south, physical units"
            )
        if self.noise_channels and noise is None:
            noise = torch.zeros(state.shape[0], self.noise_channels, *want[1:], device=state.device)
        x = (state - self.mean) / self.std
        y = model_step(self.network, x, self.static, time.to(state.device), bf16=self.bf16,
                       tendency=self.tendency if self.scaled else None, noise=noise)  # fmt: skip
        return y * self.std + self.mean

    @torch.no_grad()
    def forecast(self, state: torch.Tensor, init_times: Any, steps: int) -> torch.Tensor:
        """``(steps, B, C, H, W)``: ``steps`` steps from ``state`` at ``init_times`` (a stochastic
        model with its noise at zero)."""
        hours = int(self.contract["step_hours"])
        times = np.atleast_1d(np.asarray(init_times, "datetime64[h]"))
        out = []
        for k in range(steps):
            state = self(state, self.time_features(times + np.timedelta64(k * hours, "h")))
            out.append(state)
        return torch.stack(out)


def load_model(path: str | Path, device: str | torch.device = "cpu", twin: bool = True) -> SharedModel:
    """The shared model at ``path`` (a folder of ``jigsaw-earth model export``) on ``device``, in
    eval mode: its integrity checked, its weights loaded; ``twin``: torch's own layers in place of
    the jigsaw layers (``False``: the one-rank jigsaw model)."""
    folder = ModelFolder.open(path)
    c = folder.contract
    m, ch, grid = c["model"], c["channels"]["inputs"], c["grid"]
    domain = local_domain(grid["n_lat"], grid["n_lon"])
    overrides = dict(m.get("overrides") or {})
    network = build_model(
        m["name"], domain, len(ch["state"]), len(ch["static"]), len(ch["time"]), m["preset"], **overrides
    )
    folder.load(network)
    if twin:
        from ..twins.derive import plain

        try:
            network = plain(network)
        except ValueError as err:
            raise ValueError(
                f"{err}; or load it as the one-rank jigsaw model: load_model({str(path)!r}, twin=False)"
            ) from None
    n_static = len(ch["static"]) - int(m.get("noise_channels") or 0)
    static = folder.read(STATIC, "static", (0, 0, 0), (n_static, grid["n_lat"], grid["n_lon"]))
    return SharedModel(network, c, static.float()).to(device).eval()
