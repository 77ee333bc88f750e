"""Tile latitude weights and time features (the sphere itself: ``jigsaw_earth.sphere``)."""

from __future__ import annotations

import logging

import numpy as np

from jigsaw_earth.distributed.tiles import Tile
from jigsaw_earth.sphere import latitude_weights

__all__ = ["latitude_weights", "tile_latitude_weights", "time_features"]

log = logging.getLogger(__name__)


def tile_latitude_weights(lat: np.ndarray, tile: Tile) -> np.ndarray:
    """Rows of ``latitude_weights(lat)`` for a tile (global normalisation, shape ``(h,)``).

    ``lat`` is the global, normalised (descending) latitude; sums over all tiles' rows equal
    the global weights, so a distributed weighted mean equals the serial one.
    """
    return latitude_weights(lat)[tile.lat_start : tile.lat_stop]


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
