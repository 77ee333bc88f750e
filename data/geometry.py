"""Tile latitude weights (the sphere itself: ``jigsaw_earth.sphere``; time features: ``times``)."""

from __future__ import annotations

import logging

import numpy as np
from jigsaw_earth.data.times import time_features

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
