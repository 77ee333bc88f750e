"""Score a forecast store against truth (and a climatology) the WeatherBench 2 way.

``normalise`` maps the names other ERA5 sources use (``lat``, ``t2m``, ``lead_time`` …) to WB2's;
``evaluate`` aligns forecast, truth and climatology by coordinate values (within 1e-3°) and returns
one long table row per (region, variable, level, lead, metric), for the forecast and for the
persistence and climatology baselines.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr
from tqdm.auto import tqdm

from ..data.store import ALIASES, SURFACE_VARIABLES, UPPER_AIR_VARIABLES
from .engine import block_size, plan_regions, score_variable
from .grid import ForecastGrid
from .regions import get_regions
from .units import unit_of

__all__ = ["DIM_ALIASES", "VAR_ALIASES", "evaluate", "normalise"]

SPACE = ("latitude", "longitude")

log = logging.getLogger(__name__)

DIM_ALIASES = {
    "lat": "latitude",
    "lon": "longitude",
    "init_time": "time",
    "lead_time": "prediction_timedelta",
    "step": "prediction_timedelta",
    "isobaricInhPa": "level",
    "pressure_level": "level",
    "plev": "level",
}
# Other sources' variable names -> WB2 names, from the data package's one table (upper-air first,
# so ``z`` is geopotential, as in forecast files on pressure levels).
VAR_ALIASES = {
    alias: name
    for name in (*UPPER_AIR_VARIABLES, *SURFACE_VARIABLES)
    for alias in ALIASES.get(name, ())
    if alias not in {"z"} or name == "geopotential"
}


def normalise(ds: xr.Dataset, what: str = "dataset") -> xr.Dataset:
    """WB2 names for dims and variables; a dimension that cannot be mapped is an error."""
    ds = ds.rename({k: v for k, v in DIM_ALIASES.items() if k in ds.dims or k in ds.coords})
    ds = ds.rename({k: v for k, v in VAR_ALIASES.items() if k in ds.data_vars})
    known = {"time", "prediction_timedelta", "level", "latitude", "longitude", "hour", "dayofyear"}
    unknown = sorted(str(d) for d in ds.dims if d not in known)
    if unknown:
        raise ValueError(
            f"{what}: cannot map dimension(s) {unknown}; expected names among {sorted(known)} "
            f"or the aliases {sorted(DIM_ALIASES)}"
        )
    if "level" in ds.coords:
        level = ds["level"].values.astype(np.float64)
        if level.size and level.max() > 2000:  # Pa → hPa
            level = level / 100
        ds = ds.assign_coords(level=np.rint(level).astype(np.int64))
    return ds


def _levels(ref: xr.DataArray, other: xr.DataArray, what: str) -> xr.DataArray:
    """``other`` on the forecast variable's levels (exact hPa values)."""
    if "level" not in ref.dims:
        return other
    if "level" not in other.dims:
        raise ValueError(f"{what} {ref.name} has no 'level' dimension but the forecast has")
    want, have = ref["level"].values, other["level"].values
    missing = np.setdiff1d(want, have)
    if missing.size:
        raise ValueError(
            f"{what} {ref.name} lacks levels {missing.tolist()[:5]} of the forecast (it has "
            f"{have.tolist()}); use a store with those levels or score --variables without them"
        )
    return other.sel(level=want)


def _rows(
    scores: dict[tuple[str, str, str], np.ndarray], fc: xr.DataArray, unit: str
) -> list[dict[str, Any]]:
    """Time means (RMSE = sqrt of the mean MSE) as long-table rows."""
    levels = fc["level"].values if "level" in fc.dims else [None]
    hours = fc["prediction_timedelta"].values / np.timedelta64(1, "h")
    rows = []
    for (model, quantity, region), per_init in scores.items():
        value = per_init.mean(axis=0)  # skipna=False: a NaN init makes the mean NaN
        metric = {"se": "rmse", "e": "bias", "acc": "acc"}[quantity]
        if metric == "rmse":
            value = np.sqrt(value)
        for li, h in enumerate(hours):
            for ki, lev in enumerate(levels):
                v = value[li] if lev is None else value[li, ki]
                rows.append(
                    {
                        "model": model,
                        "metric": metric,
                        "region": region,
                        "variable": str(fc.name),
                        "level": None if lev is None else int(lev),
                        "lead_hours": float(h),
                        "value": float(v),
                        "unit": "1" if metric == "acc" else unit,
                    }
                )
    return rows


def evaluate(
    forecast: xr.Dataset,
    truth: xr.Dataset,
    climatology: xr.Dataset | None = None,
    *,
    variables: Sequence[str] | None = None,
    baselines: bool = True,
    model: str = "forecast",
    regions: Sequence[str] | None = None,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """RMSE, bias (and ACC with a climatology) per region, variable, level and lead, as table rows.

    With ``baselines`` the persistence (and climatology) forecasts are scored on the same inits.
    ``regions``: names from ``REGIONS`` or ``["all"]`` (default: global). Every chunk of the three
    stores is read once (``engine.score_variable``).
    """
    forecast, truth = normalise(forecast, "forecast"), normalise(truth, "truth")
    names = list(variables) if variables else [v for v in forecast.data_vars if v in truth.data_vars]
    lacking = [v for v in names if v not in forecast.data_vars or v not in truth.data_vars]
    if not names or lacking:
        raise ValueError(
            f"variables {lacking or '(none in common)'} are not in both stores; forecast has "
            f"{sorted(map(str, forecast.data_vars))}, truth has {sorted(map(str, truth.data_vars))}"
        )
    for dim in ("time", "prediction_timedelta"):
        if dim not in forecast.dims:
            raise ValueError(f"forecast has no {dim!r} dimension: is it a forecast store (init, lead)?")
    if climatology is not None:
        climatology = normalise(climatology, "climatology")
        lacking = [v for v in names if v not in climatology.data_vars]
        if lacking:
            raise ValueError(
                f"climatology lacks {lacking}; it has {sorted(map(str, climatology.data_vars))}: "
                f"score without --climatology or with --variables that it has"
            )
    forecast = forecast if forecast.indexes["time"].is_monotonic_increasing else forecast.sortby("time")
    truth = truth if truth.indexes["time"].is_monotonic_increasing else truth.sortby("time")
    grid = ForecastGrid.match(forecast, truth)
    plans = plan_regions(get_regions(regions), grid, truth)
    rows: list[dict[str, Any]] = []
    blocks = {n: block_size(forecast[n]) for n in names}
    total = sum(-(-forecast.sizes["time"] // b) for b in blocks.values())
    with tqdm(total=total, desc="score", unit="block", disable=not progress, leave=False) as bar:
        for name in names:
            fc = forecast[name]
            fc = fc.transpose("time", "prediction_timedelta", *[d for d in fc.dims if d == "level"], *SPACE)
            obs = _levels(fc, truth[name], "truth")
            obs = obs.transpose("time", *[d for d in obs.dims if d == "level"], *SPACE)
            clim = None
            if climatology is not None:
                clim = _levels(fc, climatology[name], "climatology")
                clim = clim.transpose("hour", "dayofyear", *[d for d in clim.dims if d == "level"], *SPACE)
            scores = score_variable(fc, obs, clim, grid, plans, baselines=baselines, model=model, bar=bar)
            unit = unit_of(name, fc.attrs, truth[name].attrs)
            rows += _rows(scores, fc, unit)
    log.info(
        "scored %d variables × %d inits × %d leads in %d region(s)",
        len(names), forecast.sizes["time"], forecast.sizes["prediction_timedelta"], len(plans),
    )  # fmt: skip
    return rows
