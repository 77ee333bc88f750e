"""The sphere, defined once: grid latitudes, latitude weights, the pole rule and coordinate channels.

A leaf module (numpy only, imports nothing of jigsaw_earth), so every layer may use it: the halo
exchange (``distributed.halo``), the tile reader (``data``), the models, the loss, the metrics and
the benchmarks.

* Grids are equiangular with latitude descending. Row ``i`` of ``n_lat`` grid points lies at
  ``90 − 180·i/(n_lat − 1)`` degrees (both poles on the grid, as ERA5's 721 rows); cell centres of
  ``n_lat`` equal cells lie at ``90 − 180·(i + ½)/n_lat`` (WB1's 32 rows, token grids). Column
  ``j`` of ``n_lon`` lies at ``360·j/n_lon`` (grid points) or ``360·(j + ½)/n_lon`` (cell centres).
* Latitude weights: WB2's (``weatherbench2.metrics.get_lat_weights``: cell edges at the midpoints
  between rows and at ±90° outside the outer rows, ``w = sin(upper edge) − sin(lower edge)``,
  divided by its mean; a pole row gets a half cell, not zero) and WB1's (``cos(lat)`` over its mean).
* The pole rule: beyond a pole, row ``k`` of the halo is row ``k − 1`` inside it, read at
  longitude +180° (``lat_mode="pole"``); ``"replicate"`` repeats the edge row, ``"zeros"`` pads.
* Coordinate channels: sin/cos of latitude and of longitude, in that order.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "COORDINATE_CHANNELS",
    "N_COORD_CHANNELS",
    "col_sources",
    "column_longitudes",
    "coordinate_channels",
    "cos_latitude_weights",
    "grid_latitudes",
    "grid_longitudes",
    "latitude_weights",
    "row_latitudes",
    "row_source",
    "row_sources",
]

COORDINATE_CHANNELS = ("sin_latitude", "cos_latitude", "sin_longitude", "cos_longitude")
N_COORD_CHANNELS = len(COORDINATE_CHANNELS)


def row_latitudes(n_lat: int, rows: np.ndarray | None = None, centred: bool = False) -> np.ndarray:
    """Latitude in radians (float64) of ``rows`` (default: all) of an ``n_lat``-row grid.

    ``centred=False``: grid points, both poles on the grid; ``centred=True``: cell centres."""
    r = np.arange(n_lat, dtype=np.float64) if rows is None else np.asarray(rows, dtype=np.float64)
    if centred:
        return 0.5 * math.pi - math.pi * (r + 0.5) / n_lat
    return 0.5 * math.pi - math.pi * r / max(n_lat - 1, 1)


def column_longitudes(n_lon: int, cols: np.ndarray | None = None, centred: bool = False) -> np.ndarray:
    """Longitude in radians (float64) of ``cols`` (default: all) of an ``n_lon``-column grid."""
    c = np.arange(n_lon, dtype=np.float64) if cols is None else np.asarray(cols, dtype=np.float64)
    return 2.0 * math.pi * ((c + 0.5) if centred else c) / n_lon


def grid_latitudes(n_lat: int, centred: bool = False) -> np.ndarray:
    """Latitudes in degrees, descending, of an ``n_lat``-row grid (grid points or cell centres)."""
    r = np.arange(n_lat, dtype=np.float64)
    if centred:
        return 90.0 - (r + 0.5) * 180.0 / n_lat
    return np.linspace(90.0, -90.0, n_lat)


def grid_longitudes(n_lon: int) -> np.ndarray:
    """Longitudes in degrees, ascending from 0, of an ``n_lon``-column grid."""
    return np.arange(n_lon, dtype=np.float64) * 360.0 / n_lon


def _as_lat(lat: np.ndarray) -> np.ndarray:
    values = np.asarray(lat, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"latitude must be a non-empty 1-D coordinate, got shape {values.shape}")
    if np.any(np.abs(values) > 90) or len(np.unique(values)) != values.size:
        raise ValueError(
            f"latitudes must be distinct values in [-90, 90] degrees, got {values.min()}…{values.max()} "
            f"with {values.size - len(np.unique(values))} duplicates"
        )
    return values


def latitude_weights(lat: np.ndarray) -> np.ndarray:
    """WB2 area weights (float64, mean 1) for latitudes in degrees, in the order given."""
    values = _as_lat(lat)
    order = np.argsort(values)
    s = np.deg2rad(values[order])
    edges = np.concatenate([[-np.pi / 2], (s[1:] + s[:-1]) / 2, [np.pi / 2]])
    w = np.empty_like(s)
    w[order] = np.sin(edges[1:]) - np.sin(edges[:-1])
    return w / w.mean()


def cos_latitude_weights(lat: np.ndarray) -> np.ndarray:
    """WB1 weights: ``cos(lat) / mean(cos(lat))`` (a pole row gets zero)."""
    w = np.cos(np.deg2rad(_as_lat(lat)))
    return w / w.mean()


def row_source(g: int, n_lat: int, lat_mode: str) -> tuple[int, bool]:
    """(source row or -1 for zero padding, across-the-pole) of row ``g`` of a padded grid.

    Rows inside ``[0, n_lat)`` are themselves; beyond a pole, the pole rule of ``lat_mode``."""
    if 0 <= g < n_lat:
        return g, False
    if lat_mode == "zeros":
        return -1, False
    if lat_mode == "replicate":
        return (0 if g < 0 else n_lat - 1), False
    return (-g - 1 if g < 0 else 2 * n_lat - 1 - g), True


def row_sources(n_lat: int, lo: int, hi: int, lat_mode: str) -> list[tuple[int, bool]]:
    """``row_source`` of each padded row in ``[lo, hi)``."""
    return [row_source(g, n_lat, lat_mode) for g in range(lo, hi)]


def col_sources(n_lon: int, lo: int, hi: int, lon_mode: str, across_pole: bool = False) -> list[int]:
    """Source column (or -1 for zero padding) of each padded column in ``[lo, hi)``.

    ``lon_mode="periodic"`` wraps around; rows read across a pole are shifted by 180°."""
    shift = n_lon // 2 if across_pole else 0
    if lon_mode == "periodic":
        return [(c + shift) % n_lon for c in range(lo, hi)]
    return [c if 0 <= c < n_lon else -1 for c in range(lo, hi)]


def coordinate_channels(lat: Any, lon: Any) -> Any:
    """``(4, h, w)``: sin/cos of latitude ``(h,)`` and of longitude ``(w,)``, in radians.

    Numpy arrays give a float64 array; torch tensors a tensor of their dtype and device (computed
    with torch's own sin/cos), so models and the reader share this one definition."""
    h, w = len(lat), len(lon)
    if hasattr(lat, "new_empty"):  # a torch tensor (this module does not import torch)
        out = lat.new_empty((N_COORD_CHANNELS, h, w))
        parts = (lat.sin(), lat.cos(), lon.sin(), lon.cos())
    else:
        lat, lon = np.asarray(lat, dtype=np.float64), np.asarray(lon, dtype=np.float64)
        out = np.empty((N_COORD_CHANNELS, h, w))
        parts = (np.sin(lat), np.cos(lat), np.sin(lon), np.cos(lon))
    out[0], out[1] = parts[0][:, None], parts[1][:, None]
    out[2], out[3] = parts[2][None, :], parts[3][None, :]
    return out
