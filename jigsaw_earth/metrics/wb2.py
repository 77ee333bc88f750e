"""WeatherBench 2 (and 1) deterministic metrics on xarray objects.

Forecasts have dims ``(time = initialisation, prediction_timedelta, [level], latitude,
longitude)``; truth has ``(time, [level], latitude, longitude)``; a climatology has ``(hour,
dayofyear, [level], latitude, longitude)``. Everything goes by coordinate names and values.

* ``mse`` per (init, lead) is the latitude-weighted spatial mean of the squared error;
  ``rmse = sqrt(mse.mean("time"))`` — the square root after the time mean, as WB2 does.
* ``bias`` is the weighted spatial mean error averaged over inits.
* ``acc`` (uncentred): anomalies against the climatology at the valid time's dayofyear and hour;
  ``mean(f′o′) / sqrt(mean(f′²) mean(o′²))`` per (init, lead), averaged over inits.
* WB1 variants: ``wb1_rmse`` (cos-lat weights, mean over time and space together, then sqrt) and
  ``wb1_acc`` (centred ACC against the verification period's time mean).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from ..data.times import hour_dayofyear
from .weights import weights_like

__all__ = [
    "acc",
    "bias",
    "climatology_at_valid_time",
    "climatology_forecast",
    "mse",
    "persistence_forecast",
    "rmse",
    "spatial_mean",
    "truth_at_valid_time",
    "valid_times",
    "wb1_acc",
    "wb1_rmse",
]

SPACE = ("latitude", "longitude")
Data = xr.DataArray | xr.Dataset


def spatial_mean(x: Data, kind: str = "wb2") -> Data:
    """Latitude-weighted mean over latitude and longitude (WB2's ``_spatial_average``, skipna=False)."""
    return x.weighted(weights_like(x, kind)).mean(SPACE, skipna=False)


def valid_times(init: xr.DataArray, lead: xr.DataArray) -> xr.DataArray:
    """``init + lead`` on dims ``(time, prediction_timedelta)``."""
    return init + lead


def _select_times(data: Data, times: xr.DataArray, what: str) -> Data:
    flat = np.unique(times.values.ravel())
    missing = np.setdiff1d(flat, data["time"].values)
    if missing.size:
        raise ValueError(
            f"{what} lacks {missing.size} of the {flat.size} times needed (first {missing[0]}); "
            f"it covers {data['time'].values.min()} … {data['time'].values.max()}: score a period inside it"
        )
    picked = data.sel(time=xr.DataArray(times.values, dims=times.dims))
    return picked.drop_vars("time", errors="ignore").assign_coords({d: times[d] for d in times.dims})


def truth_at_valid_time(truth: Data, forecast: Data) -> Data:
    """Truth at ``forecast``'s valid times, on the forecast's ``(time, prediction_timedelta)``."""
    return _select_times(truth, valid_times(forecast["time"], forecast["prediction_timedelta"]), "truth")


def persistence_forecast(truth: Data, init: xr.DataArray, lead: xr.DataArray) -> Data:
    """The truth at the initialisation time, for every lead."""
    at_init = _select_times(truth, init, "truth")
    return at_init.expand_dims(prediction_timedelta=lead.values).transpose(
        "time", "prediction_timedelta", ...
    )


def climatology_at_valid_time(climatology: Data, init: xr.DataArray, lead: xr.DataArray) -> Data:
    """The climatology at each valid time's ``dayofyear`` (1…366) and ``hour``."""
    valid = valid_times(init, lead)
    hours, days = hour_dayofyear(valid.values)
    doy, hour = valid.copy(data=days), valid.copy(data=hours)
    for name, want in (("dayofyear", doy), ("hour", hour)):
        if name not in climatology.dims:
            raise ValueError(
                f"climatology has no {name!r} dimension (dims {sorted(map(str, climatology.dims))})"
            )
        lacking = np.setdiff1d(np.unique(want.values), climatology[name].values)
        if lacking.size:
            raise ValueError(
                f"climatology has no {name} {lacking.tolist()[:5]} needed by the valid times; "
                f"it has {climatology[name].values.tolist()[:8]}…; use a climatology with those values"
            )
    return climatology.sel(dayofyear=doy, hour=hour).drop_vars(["dayofyear", "hour"], errors="ignore")


def climatology_forecast(climatology: Data, init: xr.DataArray, lead: xr.DataArray) -> Data:
    """The climatology at the valid time, as a forecast."""
    return climatology_at_valid_time(climatology, init, lead).transpose("time", "prediction_timedelta", ...)


def mse(forecast: Data, truth: Data, kind: str = "wb2") -> Data:
    """Weighted spatial mean squared error per (init, lead[, level]); ``truth`` already at valid time."""
    return spatial_mean((forecast - truth) ** 2, kind)


def rmse(forecast: Data, truth: Data) -> Data:
    """WB2 headline RMSE per lead: ``sqrt(mean over inits of mse)``."""
    return np.sqrt(mse(forecast, truth).mean("time", skipna=False))


def bias(forecast: Data, truth: Data) -> Data:
    return spatial_mean(forecast - truth).mean("time", skipna=False)


def acc(forecast: Data, truth: Data, climatology: Data) -> Data:
    """Uncentred ACC per lead; ``truth`` and ``climatology`` already at the valid times."""
    fa, oa = forecast - climatology, truth - climatology
    per_init = spatial_mean(fa * oa) / np.sqrt(spatial_mean(fa**2) * spatial_mean(oa**2))
    return per_init.mean("time", skipna=False)


def wb1_rmse(forecast: Data, truth: Data) -> Data:
    """WB1 RMSE: cos-lat weights, one mean over inits and space together, then the square root."""
    w = weights_like(forecast, "wb1")
    return np.sqrt(((forecast - truth) ** 2 * w).mean(("time", *SPACE)))


def wb1_acc(forecast: Data, truth: Data, truth_period: Data) -> Data:
    """WB1 centred ACC per lead: anomalies against ``truth_period.mean('time')``, each centred by its
    own (unweighted) mean over inits and space, then a cos-lat weighted correlation."""
    w = weights_like(forecast, "wb1")
    clim = truth_period.mean("time")
    fa, oa = forecast - clim, truth - clim
    dims = ("time", *SPACE)
    fa, oa = fa - fa.mean(dims), oa - oa.mean(dims)
    return (w * fa * oa).sum(dims) / np.sqrt((w * fa**2).sum(dims) * (w * oa**2).sum(dims))
