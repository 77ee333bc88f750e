"""Validation: latitude-weighted RMSE in physical units, beside persistence and climatology.

WB2 definitions (``/work/shared/reference/weatherbench.md``): per (init, lead) the MSE is the
latitude-weighted spatial mean of ``(forecast − truth)²`` over the GLOBAL grid; the headline
RMSE is ``sqrt`` of the mean of MSE over initialisation times (sqrt after the time mean).
Persistence is the truth at the init time; climatology is the climatology at the valid time.

Each rank sums weighted squared errors over its tile and its replica's inits; one all-reduce
over every rank gives the global sums, so the figures are the same on every mesh.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..config.schema import TrainConfig
from .data import TrainData

__all__ = ["SHORT_NAMES", "format_table", "short_name", "validate"]

log = logging.getLogger(__name__)
SHORT_NAMES = {
    "geopotential": "z",
    "temperature": "t",
    "u_component_of_wind": "u",
    "v_component_of_wind": "v",
    "specific_humidity": "q",
    "2m_temperature": "t2m",
    "10m_u_component_of_wind": "u10",
    "10m_v_component_of_wind": "v10",
    "mean_sea_level_pressure": "msl",
}
BASELINES = ("model", "persistence", "climatology")


def short_name(channel: str) -> str:
    """``geopotential@500`` → ``z500``; ``2m_temperature`` → ``t2m``."""
    var, _, lev = channel.partition("@")
    return f"{SHORT_NAMES.get(var, var)}{lev}"


@torch.no_grad()
def validate(model: torch.nn.Module, data: TrainData, cfg: TrainConfig, forward: Any) -> dict[str, float]:
    """RMSE per headline variable and lead for the model, persistence and climatology.

    ``forward(state, static, time_features) -> next state`` runs the model (autocast etc.).
    Returns ``{"<var>@<lead>h/<model|persistence|climatology>": rmse}`` plus ``n_inits``.
    """
    v = cfg.validation
    leads = sorted(set(v.lead_hours))
    steps = [lead // data.step_hours for lead in leads]
    chans = [data.channels.index(name) for name in v.variables]
    sums = torch.zeros(len(leads), len(chans), len(BASELINES), dtype=torch.float64)
    count = torch.zeros((), dtype=torch.float64)
    have_clim = torch.ones((), dtype=torch.float64)
    grid_points = data.grid.n_lat * data.grid.n_lon
    w = data.lat_weights.double().view(1, 1, -1, 1)
    was_training = model.training
    model.eval()
    try:
        for batch in data.val_batches(max(steps), v.max_samples, v.batch_size):
            state = batch.inputs
            truth0 = data.denormalise(batch.inputs).double()[:, chans]
            clim_all = data.source.climatology(batch.target_times.reshape(-1))
            for k in range(1, max(steps) + 1):
                state = forward(state, batch.static, data.step_time_features(batch, k - 1)).float()
                if k not in steps:
                    continue
                li = steps.index(k)
                truth = data.denormalise(batch.targets[:, k - 1]).double()[:, chans]
                pred = data.denormalise(state).double()[:, chans]
                sums[li, :, 0] += ((pred - truth).square() * w).sum(dim=(0, 2, 3))
                sums[li, :, 1] += ((truth0 - truth).square() * w).sum(dim=(0, 2, 3))
                if clim_all is None:
                    have_clim.zero_()
                    continue
                clim = (
                    torch.from_numpy(clim_all).double().view(*batch.target_times.shape, *clim_all.shape[1:])
                )
                sums[li, :, 2] += ((clim[:, k - 1, chans] - truth).square() * w).sum(dim=(0, 2, 3))
            if data.mesh.domain.index == 0:  # one count per replica, not one per tile
                count += batch.batch_size
    finally:
        model.train(was_training)
    if dist.is_initialized() and data.mesh.is_distributed:
        dist.all_reduce(sums)
        dist.all_reduce(count)
        dist.all_reduce(have_clim, op=dist.ReduceOp.MIN)
    n_inits = int(count)
    out: dict[str, float] = {"n_inits": float(n_inits)}
    for li, lead in enumerate(leads):
        for ci, name in enumerate(v.variables):
            for bi, base in enumerate(BASELINES):
                if base == "climatology" and not have_clim:
                    continue
                mse = float(sums[li, ci, bi]) / (grid_points * n_inits)
                out[f"{short_name(name)}@{lead}h/{base}"] = math.sqrt(mse)
    return out


def format_table(result: dict[str, float], variables: list[str], leads: list[int]) -> str:
    """A text table: one row per variable and lead, columns model / persistence / climatology."""
    head = f"{'variable':<10} {'lead':>5} {'model':>12} {'persistence':>12} {'climatology':>12}  beats both"
    lines = [head, "-" * len(head)]
    for lead in sorted(set(leads)):
        for name in variables:
            key = f"{short_name(name)}@{lead}h"
            vals = [result.get(f"{key}/{b}", float("nan")) for b in BASELINES]
            beats = all(vals[0] < x for x in vals[1:] if np.isfinite(x))
            cells = " ".join(f"{x:>12.4g}" for x in vals)
            lines.append(f"{short_name(name):<10} {lead:>4}h {cells}  {'yes' if beats else 'NO'}")
    return "\n".join(lines)
