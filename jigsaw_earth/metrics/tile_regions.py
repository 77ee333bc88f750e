"""WB2 regions on one rank's tile: the weights that make tile sums add up to each region's mean.

``engine.plan_regions`` gives every region's rows, columns and normalised row weights on the global
grid (the same plan ``score`` uses). A tile keeps its rows of those weights (zero outside the region)
and a 0/1 matrix of the column sets; ``share(x)`` is the tile's part of every region's weighted mean,
so the sum of the shares over all tiles is the region's mean — the same number ``score`` computes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import xarray as xr

from ..distributed.tiles import Tile
from .engine import plan_regions
from .grid import ForecastGrid
from .regions import get_regions
from .weights import latitude_weights

__all__ = ["TileRegions"]


@dataclass(frozen=True)
class TileRegions:
    """``rows (h, R)``: each region's weight of this tile's rows; ``cols (w, K)``: the distinct column
    sets; ``col_set (R,)``: which set each region uses. Weights sum to 1 over each region's points."""

    names: tuple[str, ...]
    rows: torch.Tensor
    cols: torch.Tensor
    col_set: torch.Tensor

    @classmethod
    def build(
        cls, lat: np.ndarray, lon: np.ndarray, tile: Tile, regions: Sequence[str] | None
    ) -> TileRegions:
        """Regions (names as ``score --regions``) on the global grid ``lat`` × ``lon``, cut to ``tile``."""
        lat, lon = np.asarray(lat, np.float64), np.asarray(lon, np.float64)
        idx_lat, idx_lon = np.arange(lat.size), np.arange(lon.size)
        grid = ForecastGrid(lat, lon, idx_lat, idx_lon, latitude_weights(lat), False)
        coords = xr.Dataset(coords={"latitude": lat, "longitude": lon})
        plans = plan_regions(get_regions(regions), grid, coords)
        h0, h1, w0, w1 = tile.lat_start, tile.lat_stop, tile.lon_start, tile.lon_stop
        rows = np.zeros((h1 - h0, len(plans)))
        sets: dict[bytes, int] = {}
        col_cols, col_set = [], []
        for r, p in enumerate(plans):
            inside = (p.rows >= h0) & (p.rows < h1)
            rows[p.rows[inside] - h0, r] = p.row_weights[inside]
            mask = np.ones(lon.size, bool) if p.cols is None else np.isin(idx_lon, p.cols)
            key = mask.tobytes()
            if key not in sets:
                sets[key] = len(col_cols)
                col_cols.append(mask[w0:w1].astype(np.float64))
            col_set.append(sets[key])
        return cls(
            tuple(p.name for p in plans),
            torch.from_numpy(rows),
            torch.from_numpy(np.stack(col_cols, axis=1)),
            torch.tensor(col_set, dtype=torch.long),
        )

    def to(self, device: torch.device | str) -> TileRegions:
        """The same regions with their weights on ``device`` (where the shares are taken)."""
        return TileRegions(self.names, self.rows.to(device), self.cols.to(device), self.col_set.to(device))

    def share(self, x: torch.Tensor) -> torch.Tensor:
        """``x (..., h, w)`` float64 → ``(..., R)``: this tile's part of every region's weighted mean."""
        col_sums = x @ self.cols.to(x.device)  # (..., h, K)
        return (col_sums[..., self.col_set.to(x.device)] * self.rows.to(x.device)).sum(-2)
