"""Score a forecast store against truth (and a climatology) the WeatherBench 2 way.

``normalise`` maps the names other ERA5 sources use (``lat``, ``t2m``, ``lead_time`` …) to WB2's;
``evaluate`` aligns forecast, truth and climatology by coordinate values and returns one long
table row per (variable, level, lead, metric), for the forecast and for the persistence and
climatology baselines.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from ..data.store import ALIASES, SURFACE_VARIABLES, UPPER_AIR_VARIABLES
from . import wb2

__all__ = ["DIM_ALIASES", "VAR_ALIASES", "evaluate", "normalise"]

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


def _align(ref: xr.Dataset, other: xr.Dataset, what: str) -> xr.Dataset:
    """``other`` on ``ref``'s latitude, longitude and level values (exact match required)."""
    for dim in ("latitude", "longitude", "level"):
        if dim not in ref.dims:
            continue
        if dim not in other.dims:
            raise ValueError(f"{what} has no {dim!r} dimension but the forecast has")
        want, have = ref[dim].values, other[dim].values
        missing = np.setdiff1d(want, have)
        if missing.size:
            raise ValueError(
                f"{what} lacks {dim} values {missing.tolist()[:5]} of the forecast grid "
                f"({have.min()}…{have.max()}, {have.size} values); regrid it to the forecast's {dim}"
            )
        other = other.sel({dim: want})
    return other


def _rows(metric: str, model: str, result: xr.Dataset) -> list[dict[str, Any]]:
    rows = []
    for var in result.data_vars:
        da = result[var].compute()
        levels = da["level"].values if "level" in da.dims else [None]
        for lev in levels:
            sub = da.sel(level=lev) if lev is not None else da
            for lead in sub["prediction_timedelta"].values:
                value = float(sub.sel(prediction_timedelta=lead))
                hours = float(np.asarray(lead, "timedelta64[s]").astype(np.int64)) / 3600
                rows.append(
                    {
                        "model": model,
                        "metric": metric,
                        "variable": str(var),
                        "level": None if lev is None else int(lev),
                        "lead_hours": hours,
                        "value": value,
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
) -> list[dict[str, Any]]:
    """RMSE, bias (and ACC with a climatology) per variable, level and lead, as table rows.

    With ``baselines`` the persistence (and climatology) forecasts are scored on the same inits.
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
    fc = forecast[names]
    obs = wb2.truth_at_valid_time(_align(fc, truth[names], "truth"), fc)
    init, lead = fc["time"], fc["prediction_timedelta"]
    candidates: dict[str, xr.Dataset] = {model: fc}
    clim = None
    if climatology is not None:
        clim_ds = _align(fc, normalise(climatology, "climatology")[names], "climatology")
        clim = wb2.climatology_at_valid_time(clim_ds, init, lead)
    if baselines:
        candidates["persistence"] = wb2.persistence_forecast(_align(fc, truth[names], "truth"), init, lead)
        if clim is not None:
            candidates["climatology"] = clim.transpose(*obs.dims)
    rows: list[dict[str, Any]] = []
    for label, f in candidates.items():
        rows += _rows("rmse", label, wb2.rmse(f, obs))
        rows += _rows("bias", label, wb2.bias(f, obs))
        if clim is not None and label != "climatology":  # ACC of the climatology is undefined (0/0)
            rows += _rows("acc", label, wb2.acc(f, obs, clim))
    log.info("scored %d variables × %d inits × %d leads", len(names), init.size, lead.size)
    return rows
