"""Grid geometry: WB2 latitude weights, tile read plans with halos, time features."""

from __future__ import annotations

import logging

import numpy as np

from jigsaw_earth.distributed.halo import Halo
from jigsaw_earth.distributed.tiles import Tile, TileGrid

__all__ = ["halo_cols", "halo_rows", "latitude_weights", "tile_latitude_weights", "time_features"]

log = logging.getLogger(__name__)


def latitude_weights(lat: np.ndarray) -> np.ndarray:
    """WB2 area weights for latitudes (degrees, any order), normalised to mean 1.

    Cell edges lie at the midpoints between rows and at ±90° outside the outer rows;
    ``w = sin(upper edge) − sin(lower edge)``, divided by its mean. A pole row gets its
    half-cell weight, not zero.
    """
    lat = np.asarray(lat, dtype=np.float64)
    order = np.argsort(lat)
    s = lat[order]
    edges = np.concatenate([[-90.0], (s[1:] + s[:-1]) / 2, [90.0]])
    w_sorted = np.sin(np.deg2rad(edges[1:])) - np.sin(np.deg2rad(edges[:-1]))
    w = np.empty_like(w_sorted)
    w[order] = w_sorted
    return w / w.mean()


def tile_latitude_weights(lat: np.ndarray, tile: Tile) -> np.ndarray:
    """Rows of ``latitude_weights(lat)`` for a tile (global normalisation, shape ``(h,)``).

    ``lat`` is the global, normalised (descending) latitude; sums over all tiles' rows equal
    the global weights, so a distributed weighted mean equals the serial one.
    """
    return latitude_weights(lat)[tile.lat_start : tile.lat_stop]


def halo_rows(grid: TileGrid, tile: Tile, halo: Halo) -> list[tuple[int, bool]]:
    """(normalised source row or -1, across-the-pole) for each padded row of ``tile``.

    Same definition as ``pad_reference``: beyond a pole 'zeros' (-1), 'replicate' (edge row)
    or 'pole' (row k beyond the pole is row k-1 inside it, at longitude +180°).
    """
    n = grid.n_lat
    out = []
    for g in range(tile.lat_start - halo.lat[0], tile.lat_stop + halo.lat[1]):
        if 0 <= g < n:
            out.append((g, False))
        elif halo.lat_mode == "zeros":
            out.append((-1, False))
        elif halo.lat_mode == "replicate":
            out.append((0 if g < 0 else n - 1, False))
        else:
            out.append((-g - 1 if g < 0 else 2 * n - 1 - g, True))
    return out


def halo_cols(grid: TileGrid, tile: Tile, halo: Halo, across_pole: bool) -> list[int]:
    """Normalised source column (or -1 for zero padding) of each padded column of ``tile``."""
    n = grid.n_lon
    shift = n // 2 if across_pole else 0
    out = []
    for c in range(tile.lon_start - halo.lon[0], tile.lon_stop + halo.lon[1]):
        if halo.lon_mode == "periodic":
            out.append((c + shift) % n)
        else:
            out.append(c if 0 <= c < n else -1)
    return out


def time_features(times: np.ndarray) -> np.ndarray:
    """``(len(times), 4)`` float32: sin/cos of hour of day and of day of year (UTC)."""
    t = np.asarray(times).astype("datetime64[s]")
    day = t.astype("datetime64[D]")
    hours = (t - day).astype(np.int64) / 3600.0
    year = t.astype("datetime64[Y]")
    doy = (day - year.astype("datetime64[D]")).astype(np.int64) + hours / 24.0
    a = 2 * np.pi * hours / 24.0
    b = 2 * np.pi * doy / 365.25
    return np.stack([np.sin(a), np.cos(a), np.sin(b), np.cos(b)], axis=-1).astype(np.float32)
