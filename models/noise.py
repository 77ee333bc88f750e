"""Noise channels of a stochastic model: a pure function of where and for whom they are drawn.

A model with ``model.noise_channels = K > 0`` is built with ``n_static + K`` static channels and
receives, at every forecast step, ``K`` channels of standard-normal noise appended to its static
fields (``step.model_step(..., noise=...)``). No architecture changes: every built-in model and
every user model on ``models.common.Forecaster`` / ``assemble_inputs`` becomes stochastic by
config; members of an ensemble differ only by their noise.

The value at one point is ``normal_at(index, seed, f"noise/member{m}/step{k}")`` with

    index = ((sample · K + channel) · n_lat + lat) · n_lon + lon        (global lat, lon)

so it depends only on ``(seed, member m, the sample's global index, rollout step k, channel,
lat, lon)``: the same on every mesh, every tile split and every batching of members.

How the two callers choose the arguments:

* **training** (``loop.Trainer``): ``seed = run.seed``; ``sample_index`` the sample's position
  in the run's stream of samples, ``(s − 1) · training.batch_size + row`` for global batch row
  ``row`` of optimizer step ``s`` (``train_sample_index``): fresh noise every step and epoch;
  ``step = k`` the 0-based rollout step (the step that produces lead ``(k + 1) · step_hours``);
  ``member`` the global member number ``0 … training.members − 1``.
* **predict** (``ensscore``'s ``predict --members N``): ``seed`` = the run's ``run.seed`` (or a
  seed the user gives), ``sample_index = forecast_sample_index(init_times)`` (the init time in
  whole hours since 1970-01-01, so a forecast does not depend on which other inits are run or
  how they are batched), ``step = k`` the 0-based lead step of the rollout exactly as in training,
  ``member`` = ``0 … N − 1``. Call ``member_noise`` once per member and step, and pass the
  result to ``model_step(..., noise=...)``; a member keeps its own noise stream through the
  rollout because ``step`` advances with the lead.

``field_normal`` draws the same kind of field for any other stream key: ``predict --perturb``'s
initial-condition perturbations use keys of their own (``inference/perturb.py``), so they never
repeat a model's noise.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from jigsaw_earth.distributed.tiles import Tile
from jigsaw_earth.layers.base import normal_at

__all__ = ["field_normal", "forecast_sample_index", "member_noise", "noise_key", "train_sample_index"]


def noise_key(member: int, step: int) -> str:
    """The counter-RNG stream of one member at one rollout step."""
    if member < 0 or step < 0:
        raise ValueError(f"noise member={member} and step={step} must be >= 0")
    return f"noise/member{int(member)}/step{int(step)}"


def train_sample_index(opt_step: int, global_batch: int, rows: Sequence[int] | np.ndarray) -> torch.Tensor:
    """Global sample indices ``(s − 1) · B + row`` of global batch ``rows`` at optimizer step ``s``
    (1-based); ``rows`` are this replica's rows of the global batch."""
    if opt_step < 1:
        raise ValueError(f"optimizer step {opt_step} is 1-based; the first step is 1")
    return (opt_step - 1) * global_batch + torch.as_tensor(np.asarray(rows), dtype=torch.int64)


def forecast_sample_index(init_times: np.ndarray) -> torch.Tensor:
    """Sample indices of forecasts: each init time in whole hours since 1970-01-01 (``(B,)`` int64)."""
    hours = np.asarray(init_times).astype("datetime64[h]").astype(np.int64)
    return torch.from_numpy(hours.copy())


def member_noise(
    shape: Sequence[int],
    *,
    seed: int,
    member: int,
    sample_index: torch.Tensor | int,
    step: int,
    tile: Tile,
    grid: tuple[int, int],
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """This rank's tile ``(B, K, h, w)`` of member ``member``'s standard-normal noise (float32).

    ``shape`` is ``(B, K, h, w)`` with ``(h, w) == tile.shape``; ``sample_index`` is ``(B,)`` global
    sample indices, or an int: the first of ``B`` consecutive ones; ``grid`` is ``(n_lat, n_lon)``.
    """
    return field_normal(shape, seed=seed, key=noise_key(member, step), sample_index=sample_index, tile=tile,
                        grid=grid, device=device)  # fmt: skip


def field_normal(
    shape: Sequence[int],
    *,
    seed: int,
    key: str,
    sample_index: torch.Tensor | int,
    tile: Tile,
    grid: tuple[int, int],
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """This rank's tile ``(B, K, h, w)`` of the standard-normal fields of stream ``key``: the value at
    global point ``(lat, lon)`` of channel ``k`` of sample ``s`` is ``normal_at(index, seed, key)`` with
    the module's ``index`` (the same on every mesh). Arguments as ``member_noise``'s."""
    b, k, h, w = (int(s) for s in shape)
    if (h, w) != tile.shape:
        raise ValueError(
            f"noise tile {h}x{w} is not this rank's {tile.shape[0]}x{tile.shape[1]} tile of the "
            f"{grid[0]}x{grid[1]} grid; pass the batch's tile shape"
        )
    if isinstance(sample_index, int):
        samples = torch.arange(sample_index, sample_index + b, dtype=torch.int64, device=device)
    else:
        samples = sample_index.to(device=device, dtype=torch.int64).reshape(-1)
        if samples.numel() != b:
            raise ValueError(
                f"{samples.numel()} sample indices for a noise batch of {b}; give one per sample"
            )
    n_lat, n_lon = grid

    def ar(start: int, n: int, dim: int) -> torch.Tensor:
        view = [1, 1, 1, 1]
        view[dim] = n
        return torch.arange(start, start + n, device=device, dtype=torch.int64).view(view)

    index = ((samples.view(-1, 1, 1, 1) * k + ar(0, k, 1)) * n_lat + ar(tile.lat_start, h, 2)) * n_lon
    index = index + ar(tile.lon_start, w, 3)
    return normal_at(index, seed, key)
