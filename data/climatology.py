"""WB2-layout climatology stores, and the grid check shared by statistics and climatology."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import xarray as xr
from jigsaw_earth.data.store import StoreView, open_dataset

__all__ = ["check_same_grid", "open_climatology"]

log = logging.getLogger(__name__)


def check_same_grid(view: StoreView, lat: np.ndarray, lon: np.ndarray, what: str) -> None:
    """Refuse ``what`` (statistics, climatology, ...) on another grid than the store's."""
    lat_n, lon_n = np.sort(np.asarray(lat, float))[::-1], np.sort(np.asarray(lon, float))
    if (
        lat_n.shape != view.lat.shape
        or lon_n.shape != view.lon.shape
        or not (np.allclose(lat_n, view.lat, atol=1e-6) and np.allclose(lon_n, view.lon, atol=1e-6))
    ):
        raise ValueError(
            f"{what} has a {len(lat_n)}x{len(lon_n)} grid (latitude {lat_n[0]:.3f}..{lat_n[-1]:.3f}) "
            f"but store {view.path!r} is {len(view.lat)}x{len(view.lon)} (latitude "
            f"{view.lat[0]:.3f}..{view.lat[-1]:.3f}); regrid it or recompute it from this store"
        )


def open_climatology(path: str | Path, view: StoreView) -> xr.Dataset:
    """A WB2-layout climatology (hour, dayofyear, [level], latitude, longitude) on ``view``'s normalised
    grid (latitude descending, longitude ascending), from a local path or a URL."""
    ds = open_dataset(path)
    clim = StoreView.from_dataset(
        ds.assign_coords(time=[np.datetime64("2000-01-01", "ns")]) if "time" not in ds.variables else ds, path
    )
    missing = [d for d in ("hour", "dayofyear") if d not in ds.dims]
    if missing:
        raise ValueError(
            f"climatology {str(path)!r} lacks dimension(s) {missing}; WB2 climatologies "
            f"have (hour, dayofyear, [level], latitude, longitude)"
        )
    check_same_grid(view, clim.lat, clim.lon, f"climatology {str(path)!r}")
    lat_dim, lon_dim = clim.coord_names["latitude"], clim.coord_names["longitude"]
    ds = ds.isel({lat_dim: clim.lat_storage, lon_dim: clim.lon_storage})
    return ds.rename({k: v for k, v in ((lat_dim, "latitude"), (lon_dim, "longitude")) if k != v})
