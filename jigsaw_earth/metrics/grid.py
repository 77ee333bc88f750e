"""Matching truth and climatology grids to a forecast's, and the forecast's latitude weights.

WB2 accepts coordinates that differ by up to 1e-3°; longitudes compare modulo 360°. A forecast
that covers part of the truth's global grid (cropped in latitude or longitude) is scored as a
region: its rows get the *global* grid's latitude weights, renormalised over the rows present, as
WB2 scores a region; they are not recomputed from the cropped rows as if those covered the globe.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import xarray as xr

from .weights import latitude_weights

__all__ = ["GRID_TOLERANCE", "ForecastGrid", "covers_globe", "match_coordinate", "read_rows_cols"]

log = logging.getLogger(__name__)

GRID_TOLERANCE = 1e-3  # degrees, as WB2


def match_coordinate(
    want: np.ndarray, have: np.ndarray, dim: str, what: str, tol: float = GRID_TOLERANCE
) -> np.ndarray:
    """Index into ``have`` of each value of ``want`` within ``tol`` (longitude modulo 360°)."""
    want, have = np.asarray(want, np.float64), np.asarray(have, np.float64)
    diff = want[:, None] - have[None, :]
    if dim == "longitude":
        diff = (diff + 180.0) % 360.0 - 180.0
    diff = np.abs(diff)
    idx = diff.argmin(axis=1)
    off = diff[np.arange(want.size), idx]
    bad = np.nonzero(off > tol)[0]
    if bad.size:
        raise ValueError(
            f"{what} lacks {dim} values {want[bad][:5].tolist()} of the forecast grid within {tol:g}° "
            f"({bad.size} of {want.size} missing; it has {have.min():g}…{have.max():g}, {have.size} "
            f"values); regrid it to the forecast's {dim}"
        )
    return idx


def covers_globe(lat: np.ndarray, tol: float = GRID_TOLERANCE) -> bool:
    """Whether the cells around ``lat`` (edges halfway between rows) reach both poles."""
    s = np.sort(np.asarray(lat, np.float64))
    if s.size < 2:
        return False
    top, bottom = s[-1] + (s[-1] - s[-2]) / 2, s[0] - (s[1] - s[0]) / 2
    return top >= 90 - tol and bottom <= -90 + tol


@dataclass(frozen=True)
class ForecastGrid:
    """The forecast's rows and columns in the truth's grid, and their global latitude weights."""

    lat: np.ndarray
    lon: np.ndarray
    truth_rows: np.ndarray
    truth_cols: np.ndarray
    weights: np.ndarray  # global WB2 weights at the forecast's rows (mean 1 over the global grid)
    cropped: bool

    @classmethod
    def match(cls, forecast: xr.Dataset, truth: xr.Dataset) -> ForecastGrid:
        lat, lon = forecast["latitude"].values, forecast["longitude"].values
        t_lat, t_lon = truth["latitude"].values, truth["longitude"].values
        rows = match_coordinate(lat, t_lat, "latitude", "truth")
        cols = match_coordinate(lon, t_lon, "longitude", "truth")
        if not covers_globe(t_lat):
            raise ValueError(
                f"truth covers latitude {t_lat.min():g}…{t_lat.max():g} only, not the globe: WB2's "
                f"latitude weights are the global grid's; score against a global truth store (a "
                f"forecast on part of it is then scored as a region)"
            )
        cropped = len(np.unique(rows)) < t_lat.size or len(np.unique(cols)) < t_lon.size
        if cropped:
            log.info(
                "forecast covers latitude %g…%g, longitude %g…%g of the truth's %dx%d grid: scored as "
                "a region ('domain') with the global grid's latitude weights",
                lat.min(), lat.max(), lon.min(), lon.max(), t_lat.size, t_lon.size,
            )  # fmt: skip
        global_lat = t_lat.astype(np.float64)
        global_lat[rows] = lat  # the forecast's own values at its rows (they may differ by 1e-3°)
        weights = latitude_weights(global_lat)[rows]
        return cls(lat, lon, rows, cols, weights, cropped)


def _indexer(idx: np.ndarray) -> tuple[slice | np.ndarray, np.ndarray | None]:
    """A sorted read (a slice when contiguous) and the permutation back to ``idx``'s order."""
    order = np.argsort(idx, kind="stable")
    s = idx[order]
    read: slice | np.ndarray = s
    if s.size and np.array_equal(s, np.arange(s[0], s[0] + s.size)):
        read = slice(int(s[0]), int(s[0]) + s.size)
    back = None if np.array_equal(order, np.arange(order.size)) else np.argsort(order)
    return read, back


def read_rows_cols(da: xr.DataArray, rows: np.ndarray, cols: np.ndarray) -> tuple[xr.DataArray, callable]:
    """``da`` restricted (lazily) to ``rows`` × ``cols`` and a function that puts a read array
    (latitude, longitude last) into their order."""
    r_read, r_back = _indexer(rows)
    c_read, c_back = _indexer(cols)
    sub = da.isel(latitude=r_read, longitude=c_read)

    def reorder(a: np.ndarray) -> np.ndarray:
        if r_back is not None:
            a = a.take(r_back, axis=-2)
        if c_back is not None:
            a = a.take(c_back, axis=-1)
        return a

    return sub, reorder
