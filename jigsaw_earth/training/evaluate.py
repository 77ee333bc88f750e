"""Validation: latitude-weighted RMSE in physical units, beside persistence and climatology.

WB2 definitions (``/work/shared/reference/weatherbench.md``): per (init, lead) the MSE is the
latitude-weighted spatial mean of ``(forecast − truth)²`` over the GLOBAL grid; the headline
RMSE is ``sqrt`` of the mean of MSE over initialisation times (sqrt after the time mean).
Persistence is the truth at the init time; climatology is the climatology at the valid time.

Each rank adds its tile's share of the weighted sums for its replica's inits
(``metrics.MetricAccumulator``); reductions over the domain and data axes give the global figures,
so they are the same on every mesh.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from ..config.schema import TrainConfig
from ..data.samples import TrainData
from ..data.variables import VARIABLES
from ..metrics.accumulator import MetricAccumulator

__all__ = ["SHORT_NAMES", "format_table", "short_name", "validate"]

log = logging.getLogger(__name__)
# WB2 name -> the short name used in tables (z, t, t2m, u10, msl, ...), from the table of variables.
SHORT_NAMES = {v.name: v.short for v in VARIABLES}
BASELINES = ("model", "persistence", "climatology")


def short_name(channel: str) -> str:
    """``geopotential@500`` → ``z500``; ``2m_temperature`` → ``t2m``."""
    var, _, lev = channel.partition("@")
    return f"{SHORT_NAMES.get(var, var)}{lev}"


@torch.no_grad()
def validate(
    model: torch.nn.Module, data: TrainData, cfg: TrainConfig, forward: Any, noise: Any = None
) -> dict[str, float]:
    """RMSE per headline variable and lead for the model, persistence and climatology.

    ``forward(state, static, time_features, noise) -> next state`` runs the model (autocast etc.);
    ``noise(batch, k)`` gives a stochastic model's noise channels at rollout step ``k`` (``None``:
    a deterministic model, and ``forward`` is called with three arguments).
    Returns ``{"<var>@<lead>h/<model|persistence|climatology>": rmse}``, the model's ACC as
    ``.../acc`` (when a climatology exists) and ``n_inits``. Sums go through the metrics
    package's ``MetricAccumulator`` (per-sample global weighted means, sqrt after the time mean).
    """
    v = cfg.validation
    leads = sorted(set(v.lead_hours))
    steps = [lead // data.step_hours for lead in leads]
    chans = [data.channels.index(name) for name in v.variables]
    mesh = data.mesh
    dev = mesh.device
    accs = {
        base: MetricAccumulator(
            data.lat_weights,
            (data.grid.n_lat, data.grid.n_lon),
            mesh.domain,
            mesh.axis("data"),
            v.variables,
            device=dev,
        )
        for base in BASELINES
    }
    have_clim = True
    was_training = model.training
    model.eval()
    try:
        for host_batch in data.val_batches(max(steps), v.max_samples, v.batch_size):
            batch = host_batch.to(dev)
            state, preds = batch.inputs, []
            for k in range(1, max(steps) + 1):
                tf = data.step_time_features(batch, k - 1).to(dev)
                eps = None if noise is None else noise(batch, k - 1)
                args = (state, batch.static, tf) if eps is None else (state, batch.static, tf, eps)
                state = forward(*args).float()
                if k in steps:
                    preds.append(data.denormalise(state)[:, chans])
            pick = [k - 1 for k in steps]
            truth = data.denormalise(batch.targets[:, pick])[:, :, chans].double()
            pred = torch.stack(preds, dim=1).double()
            persistence = data.denormalise(batch.inputs)[:, None, chans].double().expand_as(truth)
            clim_all = data.source.climatology(batch.target_times.reshape(-1))
            clim = None
            if clim_all is not None:
                clim = torch.from_numpy(clim_all).to(dev).double()
                clim = clim.view(*batch.target_times.shape, *clim.shape[1:])[:, pick][:, :, chans]
            have_clim = have_clim and clim is not None
            accs["model"].update(pred, truth, clim)
            accs["persistence"].update(persistence, truth)
            if clim is not None:
                accs["climatology"].update(clim, truth)
    finally:
        model.train(was_training)
    results = {base: acc.compute() for base, acc in accs.items() if have_clim or base != "climatology"}
    out: dict[str, float] = {"n_inits": float(results["model"]["count"].item())}
    for li, lead in enumerate(leads):
        for ci, name in enumerate(v.variables):
            key = f"{short_name(name)}@{lead}h"
            for base, res in results.items():
                out[f"{key}/{base}"] = float(res["rmse"][li, ci])
            if "acc" in results["model"]:
                out[f"{key}/acc"] = float(results["model"]["acc"][li, ci])
    return out


def format_table(result: dict[str, float], variables: list[str], leads: list[int]) -> str:
    """A text table: one row per variable and lead, columns model / persistence / climatology.

    The verdict compares the model with the baselines that were scored: a baseline that is NaN
    (no climatology store, say) is named as missing, never counted as beaten.
    """
    head = f"{'variable':<10} {'lead':>5} {'model':>12} {'persistence':>12} {'climatology':>12}  beats"
    lines = [head, "-" * len(head)]
    for lead in sorted(set(leads)):
        for name in variables:
            key = f"{short_name(name)}@{lead}h"
            vals = [result.get(f"{key}/{b}", float("nan")) for b in BASELINES]
            cells = " ".join(f"{x:>12.4g}" for x in vals)
            lines.append(f"{short_name(name):<10} {lead:>4}h {cells}  {_verdict(vals)}")
    return "\n".join(lines)


def _verdict(vals: list[float]) -> str:
    """'both: yes', 'persistence: NO (no climatology)', 'model NaN' ... for (model, *baselines)."""
    model, baselines = vals[0], dict(zip(BASELINES[1:], vals[1:]))
    scored = {b: x for b, x in baselines.items() if np.isfinite(x)}
    missing = [b for b in baselines if b not in scored]
    if not np.isfinite(model):
        return "model NaN"
    if not scored:
        return "n/a (no baseline)"
    beats = all(model < x for x in scored.values())
    label = "both" if not missing else " + ".join(scored)
    note = f" (no {', '.join(missing)})" if missing else ""
    return f"{label}: {'yes' if beats else 'NO'}{note}"
