"""Small fixtures for the training tests: an in-memory data set and a per-pixel MLP forecaster.

Both are tiny so that a 20-step run on four gloo ranks takes seconds. The MLP is built from the
distributed ``Linear`` (weights sharded over the domain), so gradients go through the
distributed matmul exactly as in the real models.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jigsaw_earth.data.samples import MemorySource, TrainData
from torch import nn

from jigsaw_earth.config import parse_config
from jigsaw_earth.config.schema import TrainConfig
from jigsaw_earth.distributed.mesh import DomainMesh
from jigsaw_earth.distributed.tiles import TileGrid
from jigsaw_earth.layers import Domain, Linear

CHANNELS = ["geopotential@500", "temperature@850", "2m_temperature"]
N_LAT, N_LON, N_TIMES = 8, 12, 80


def tiny_fields(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``fields (T, 3, H, W)`` in physical-like units, ``static``, ``times``, ``lat``, ``clim``."""
    rng = np.random.default_rng(seed)
    lat = np.linspace(80, -80, N_LAT)
    lon = np.arange(N_LON) * 360 / N_LON
    times = np.datetime64("2020-01-01T00", "h") + np.arange(N_TIMES) * 6
    t = np.arange(N_TIMES)[:, None, None]
    la, lo = np.deg2rad(lat)[None, :, None], np.deg2rad(lon)[None, None, :]
    wave = np.cos(la) * np.sin(3 * lo - 0.3 * t)
    base = [(54000.0, 800.0), (275.0, 10.0), (285.0, 12.0)]
    mean = np.stack([m + 0.5 * s * np.cos(2 * la) + 0 * t * lo for m, s in base], axis=1)
    fields = mean + np.stack([s * wave for _, s in base], axis=1)
    fields = fields + rng.normal(0, 0.1, fields.shape) * np.array([s for _, s in base])[None, :, None, None]
    static = np.stack([np.cos(la[0]) * np.ones_like(lo[0]), np.sin(lo[0]) * np.ones_like(la[0])])
    return fields.astype(np.float32), static.astype(np.float32), times, lat, mean.astype(np.float32)


class PixelMLP(nn.Module):
    """``state + MLP([state, static, time])`` per grid point, on the distributed ``Linear``."""

    def __init__(self, domain: Domain, n_state: int, n_static: int, n_time: int, hidden: int = 16):
        super().__init__()
        self.fc1 = Linear(domain, n_state + n_static + n_time, hidden)
        self.fc2 = Linear(domain, hidden, n_state)

    def forward(self, state: torch.Tensor, static: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        b, _, h, w = state.shape
        x = torch.cat(
            [state, static.expand(b, -1, -1, -1), time[:, :, None, None].expand(-1, -1, h, w)], dim=1
        )
        y = self.fc2(torch.nn.functional.gelu(self.fc1(x.permute(0, 2, 3, 1))))
        return state + y.permute(0, 3, 1, 2)


def tiny_config(run_dir: str, mesh: tuple[int, ...], **sections: dict[str, Any]) -> TrainConfig:
    """``mesh``: (data, lat, lon) or (data, lat, lon, ensemble)."""
    raw: dict[str, Any] = {
        "run": {"dir": run_dir, "seed": 3, "name": "test"},
        "mesh": dict(zip(("data", "lat", "lon", "ensemble"), mesh)),
        "data": {
            "store": "memory",
            "upper_air": ["geopotential", "temperature"],
            "levels": [500, 850],
            "surface": ["2m_temperature"],
            "train_period": ["2020-01-01", "2020-01-15"],
            "val_period": ["2020-01-16", "2020-01-20T18"],
        },
        "optim": {"lr": 3e-3, "warmup_steps": 2, "grad_clip": 0.5},
        "training": {"steps": 20, "batch_size": 4},
        "validation": {"lead_hours": [6, 12], "max_samples": 4},
        "checkpoint": {"every": 0, "resume": "never"},
        "logging": {"progress": False, "wandb": {"mode": "disabled"}},
    }
    for key, value in sections.items():
        raw.setdefault(key, {}).update(value)
    return parse_config(raw)


def tiny_data(cfg: TrainConfig, mesh: DomainMesh) -> TrainData:
    fields, static, times, lat, clim = tiny_fields()
    keep = [i for i, name in enumerate(CHANNELS)]
    fields = fields[:, keep]
    grid = TileGrid(N_LAT, N_LON, mesh.shape.lat, mesh.shape.lon)
    source = MemorySource(
        fields,
        static,
        times,
        lat,
        CHANNELS,
        ["cos_lat", "sin_lon"],
        grid.tile_of(mesh.domain.index),
        clim=clim,
    )
    flat = fields.transpose(1, 0, 2, 3).reshape(len(CHANNELS), -1)
    return TrainData(
        source,
        mesh,
        grid,
        mean=flat.mean(1),
        std=flat.std(1),
        global_batch=cfg.training.batch_size,
        seed=cfg.run.seed,
        step_hours=cfg.data.step_hours,
        train_period=cfg.data.train_period,
        val_period=cfg.data.val_period,
        rollout_steps=cfg.training.rollout_steps,
    )


def tiny_model(data: TrainData, mesh: DomainMesh) -> PixelMLP:
    domain = Domain.create(mesh, data.grid.n_lat, data.grid.n_lon)
    return PixelMLP(domain, len(data.channels), data.n_static, 4)


# A tiny config as YAML would hold it ("RUN" and "STORE" are for the caller to fill).
TINY_YAML: dict[str, Any] = {
    "run": {"dir": "RUN", "seed": 1, "name": "bad-inputs"},
    "mesh": {"data": 1, "lat": 1, "lon": 1},
    "data": {
        "store": "STORE",
        "train_period": ["2020-01-01", "2020-01-31T18"],
        "val_period": ["2020-02-01", "2020-02-10"],
        "upper_air": ["geopotential", "temperature"],
        "levels": [500, 850],
        "surface": ["2m_temperature"],
    },
    "model": {"name": "weathermixer", "preset": "tiny"},
    "optim": {"lr": 2.0e-3, "warmup_steps": 1},
    "training": {"steps": 4, "batch_size": 2},
    "validation": {"lead_hours": [6], "max_samples": 2, "batch_size": 2},
    "checkpoint": {"every": 2, "keep": 2, "resume": "auto"},
    "logging": {"every": 1, "progress": False, "wandb": {"mode": "disabled"}},
}


def mixer_config(root: Path, steps: int, val_end: str) -> dict[str, Any]:
    """A tiny WeatherMixer (patch 2) trained ``steps`` steps on one rank on the synthetic two-level
    store ``root/data.zarr`` (training 2020-01-01 to 01-10, validation from 01-11 to ``val_end``),
    run folder ``root/run``, a checkpoint at the end only, no progress bar, no wandb."""
    return {
        "run": {"dir": str(root / "run"), "seed": 1},
        "mesh": {"data": 1, "lat": 1, "lon": 1},
        "data": {
            "store": str(root / "data.zarr"),
            "upper_air": ["geopotential", "temperature"],
            "levels": [500, 850],
            "surface": ["2m_temperature"],
            "train_period": ["2020-01-01", "2020-01-10"],
            "val_period": ["2020-01-11", val_end],
        },
        "model": {"name": "weathermixer", "preset": "tiny", "overrides": {"patch": 2}},
        "optim": {"warmup_steps": 1},
        "training": {"steps": steps, "batch_size": 2},
        "validation": {"lead_hours": [6], "max_samples": 2, "variables": ["geopotential@500"]},
        "checkpoint": {"every": 0, "resume": "auto"},
        "logging": {"progress": False, "wandb": {"mode": "disabled"}},
    }


def merge_sections(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``base`` with each section of ``change`` merged into it (a non-mapping replaces)."""
    out = copy.deepcopy(base)
    for section, values in change.items():
        if isinstance(values, dict) and isinstance(out.get(section), dict):
            out[section].update(values)
        else:
            out[section] = values
    return out


def rank_env(rank: int, world: int, port: int, **extra: str) -> dict[str, str]:
    """The environment of one of ``world`` training processes started by hand, as srun/torchrun would."""
    return {
        **os.environ,
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
        **extra,
    }
