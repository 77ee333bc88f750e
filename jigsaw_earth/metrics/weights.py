"""Latitude weights as WeatherBench 2 and WeatherBench 1 define them.

WB2 (``weatherbench2.metrics.get_lat_weights``): cell edges at the midpoints between rows and at
±90° outside the outer rows; ``w = sin(upper edge) − sin(lower edge)``, divided by its mean. A
pole row gets a half cell, not zero. WB1 (``compute_weighted_rmse``): ``cos(lat)`` divided by its
mean (a pole row gets zero). Both accept latitudes in any order and return them in that order.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

__all__ = ["cos_latitude_weights", "latitude_weights", "weights_like"]


def _as_lat(lat: np.ndarray | xr.DataArray) -> np.ndarray:
    values = np.asarray(lat, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"latitude must be a non-empty 1-D coordinate, got shape {values.shape}")
    if np.any(np.abs(values) > 90) or len(np.unique(values)) != values.size:
        raise ValueError(
            f"latitudes must be distinct values in [-90, 90] degrees, got {values.min()}…{values.max()} "
            f"with {values.size - len(np.unique(values))} duplicates"
        )
    return values


def latitude_weights(lat: np.ndarray | xr.DataArray) -> np.ndarray:
    """WB2 area weights (mean 1) for latitudes in degrees, in the order given."""
    values = _as_lat(lat)
    order = np.argsort(values)
    s = np.deg2rad(values[order])
    edges = np.concatenate([[-np.pi / 2], (s[1:] + s[:-1]) / 2, [np.pi / 2]])
    w = np.empty_like(s)
    w[order] = np.sin(edges[1:]) - np.sin(edges[:-1])
    return w / w.mean()


def cos_latitude_weights(lat: np.ndarray | xr.DataArray) -> np.ndarray:
    """WB1 weights: ``cos(lat) / mean(cos(lat))``."""
    w = np.cos(np.deg2rad(_as_lat(lat)))
    return w / w.mean()


def weights_like(da: xr.DataArray | xr.Dataset, kind: str = "wb2") -> xr.DataArray:
    """The weights for ``da``'s ``latitude`` coordinate as a DataArray over ``latitude``."""
    if "latitude" not in da.coords:
        raise ValueError(
            f"no 'latitude' coordinate among {sorted(map(str, da.coords))}; normalise the store first"
        )
    fn = {"wb2": latitude_weights, "wb1": cos_latitude_weights}.get(kind)
    if fn is None:
        raise ValueError(f"unknown latitude weighting {kind!r}; use 'wb2' or 'wb1'")
    return xr.DataArray(
        fn(da["latitude"].values), dims=["latitude"], coords={"latitude": da["latitude"].values}
    )
