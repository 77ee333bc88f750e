"""Measured per-rank memory and bytes of one real training step, to hold ``plan`` to account.

On every rank of a mesh: the model (real weights), AdamW as the trainer builds it (fp32
moments, ``foreach=False``), this rank's tiles of a random state, target and static field; one
warm-up step creates the optimizer state, then one step — forward, latitude-weighted squared
error, backward, data-axis gradient all-reduce, ``AdamW.step`` — is measured: the allocator
peak (``bench.measure``: parameters, AdamW moments and inputs, plus the highest point that the
step's allocations reach) and the bytes the comm ledger saw this rank send.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from ..distributed.comm import ledger
from ..distributed.mesh import DomainMesh
from ..layers.base import Domain, init_model
from ..models import build_model
from ..sphere import grid_latitudes, latitude_weights
from ..training.loss import weighted_sq_error
from ..training.optim import sync_gradients
from .measure import _allocation_sizes

__all__ = ["measure_train_step"]


def _tiles(domain: Domain, channels: tuple[int, int, int], batch: int, seed: int) -> list[torch.Tensor]:
    """This rank's ``state``, ``static``, ``time``, ``target``, latitude and channel weights."""
    gen = torch.Generator().manual_seed(seed)
    n_state, n_static, n_time = channels
    grid = domain.grid
    state = torch.randn(batch, n_state, grid.n_lat, grid.n_lon, generator=gen)
    target = torch.randn(batch, n_state, grid.n_lat, grid.n_lon, generator=gen)
    static = torch.randn(n_static, grid.n_lat, grid.n_lon, generator=gen)
    k, tile = domain.index, domain.tile
    weights = latitude_weights(grid_latitudes(grid.n_lat)).astype(np.float32)
    rows = torch.from_numpy(weights[tile.lat_start : tile.lat_stop])
    return [
        grid.scatter(state, k).contiguous(),
        grid.scatter(static, k).contiguous(),
        torch.randn(batch, n_time, generator=gen),
        grid.scatter(target, k).contiguous(),
        rows,
        torch.ones(n_state),
    ]


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, mesh: DomainMesh, tiles: list) -> None:
    state, static, time, target, lat_w, ch_w = tiles
    opt.zero_grad(set_to_none=True)
    weighted_sq_error(model(state, static, time), target, lat_w, ch_w).backward()
    sync_gradients(list(model.parameters()), mesh)
    opt.step()


def measure_train_step(
    mesh: DomainMesh,
    cases: list[tuple[str, str, tuple[int, int], tuple[int, int, int], int]],
) -> list[dict[str, Any]]:
    """Per case ``(model, preset, grid, channels, batch)``: this rank's ``peak_bytes`` and
    ``bytes_sent`` of one training step (fp32, CPU)."""
    out = []
    for name, preset, grid, channels, batch in cases:
        domain = Domain.create(mesh, *grid)
        model = init_model(build_model(name, domain, *channels, preset), 0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        tiles = _tiles(domain, tuple(channels), batch, seed=1)
        _step(model, opt, mesh, tiles)  # warm-up: AdamW's moments exist from here on
        opt.zero_grad(set_to_none=True)  # the measured step starts with no gradients
        ledger.reset()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            _step(model, opt, mesh, tiles)
        above = max(itertools.accumulate(size for _, size in _allocation_sizes(prof)), default=0)
        moments = [t for s in opt.state.values() for t in s.values()]
        resident = [*model.parameters(), *moments, *tiles[:4]]
        static_bytes = sum(t.numel() * t.element_size() for t in resident if t.dim() > 0)
        out.append({"peak_bytes": static_bytes + max(0, above), "bytes_sent": ledger.bytes_sent})
    return out
