"""Read one rank's tile (plus halo) of a sample straight from the store.

A padded tile is described row by row and column by column in *normalised* coordinates
(``geometry.halo_rows`` / ``halo_cols``, the definition of ``pad_reference``). Rows are grouped by
whether they lie across a pole (their columns are shifted by 180°); for each group the distinct
storage rows and columns are split into contiguous runs and each run × run block is read with
one orthogonal zarr read. So a tile reads only the chunks overlapping its own rows and columns,
its halo strips, and (across a pole) the few rows near the pole at the opposite longitudes;
never the whole field. Results are reassembled by index, then checked for NaNs.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import numpy as np

from jigsaw_earth.distributed.halo import Halo
from jigsaw_earth.distributed.tiles import Tile, TileGrid

from .batch import STATIC_GEOMETRY, VariableSpec
from .geometry import halo_cols, halo_rows
from .store import StoreView

__all__ = ["TileReader", "contiguous_runs"]

log = logging.getLogger(__name__)
KNOWN_DIMS = ("time", "level", "latitude", "longitude")


def contiguous_runs(sorted_values: np.ndarray) -> list[tuple[int, int]]:
    """Positions ``[i, j)`` of maximal runs of consecutive integers in a sorted array."""
    if len(sorted_values) == 0:
        return []
    breaks = np.nonzero(np.diff(sorted_values) != 1)[0] + 1
    edges = [0, *breaks.tolist(), len(sorted_values)]
    return list(itertools.pairwise(edges))


class TileReader:
    """Reads the fields of ``spec`` for one tile of the normalised grid (lat descending).

    ``read_inputs(t)`` → ``(C, H, W)`` with the halo; ``read_targets(ts)`` → ``(len(ts), C, h, w)``;
    ``read_static()`` → ``(C_static, H, W)``. Values are physical (not normalised), float32.
    """

    def __init__(self, view: StoreView, spec: VariableSpec, grid: TileGrid, tile: Tile, halo: Halo):
        if (grid.n_lat, grid.n_lon) != view.grid_shape:
            raise ValueError(
                f"tile grid {grid.n_lat}x{grid.n_lon} does not match store {view.path!r} grid "
                f"{view.grid_shape[0]}x{view.grid_shape[1]}"
            )
        halo.check(grid)
        self.view, self.spec, self.grid, self.tile, self.halo = view, spec, grid, tile, halo
        self.fields: list[tuple[str, str, np.ndarray | None]] = []  # (canonical, store, levels)
        for v in spec.upper_air:
            name = view.resolve(v, upper_air=True)
            self.fields.append((v, name, view.level_indices(v, spec.levels)))
        for v in spec.surface:
            self.fields.append((v, view.resolve(v, upper_air=False), None))
        for _, name, _ in self.fields:
            self._check_dims(name)
        rows = halo_rows(grid, tile, halo)
        self._groups = []  # (padded row positions, source rows, source cols) per pole flag
        for flip in sorted({f for _, f in rows}):
            pos = np.array([p for p, (_, f) in enumerate(rows) if f == flip])
            src = np.array([rows[p][0] for p in pos])
            self._groups.append((pos, src, np.array(halo_cols(grid, tile, halo, flip))))
        self.padded_shape = (tile.shape[0] + sum(halo.lat), tile.shape[1] + sum(halo.lon))

    @classmethod
    def for_rank(cls, view: StoreView, spec: VariableSpec, mesh_lat: int, mesh_lon: int,
                 domain_index: int, halo: Halo) -> TileReader:
        grid = TileGrid(*view.grid_shape, mesh_lat, mesh_lon)
        return cls(view, spec, grid, grid.tile_of(domain_index), halo)

    def _check_dims(self, name: str) -> None:
        extra = [d for d in self.view.dims(name) if d not in KNOWN_DIMS]
        if extra:
            raise ValueError(
                f"variable {name!r} of {self.view.path!r} has dimensions {extra} besides "
                f"time/level/latitude/longitude; select one value of them before reading"
            )

    # ---- low-level block read -------------------------------------------------------------
    def _read(self, name: str, times: np.ndarray | None, levels: np.ndarray | None,
              rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """``(T?, L?, len(rows), len(cols))`` for normalised rows/cols (-1 = zeros)."""
        view = self.view
        dims = [d for d in view.dims(name) if not (d == "time" and times is None)]
        arr = view.array(name)
        ok_r, ok_c = rows >= 0, cols >= 0
        s_rows = np.unique(view.lat_storage[rows[ok_r]])
        s_cols = np.unique(view.lon_storage[cols[ok_c]])
        lead = [len(times)] if times is not None else []
        lead += [len(levels)] if levels is not None else []
        dense = np.zeros((*lead, len(s_rows), len(s_cols)), dtype=np.float32)
        for i0, i1 in contiguous_runs(s_rows):
            for j0, j1 in contiguous_runs(s_cols):
                picks = {"time": times if times is not None else 0, "level": levels,
                         "latitude": slice(int(s_rows[i0]), int(s_rows[i1 - 1]) + 1),
                         "longitude": slice(int(s_cols[j0]), int(s_cols[j1 - 1]) + 1)}
                sel = tuple(picks.get(d, 0) for d in view.dims(name))
                try:
                    block = np.asarray(arr.oindex[sel])
                except Exception as err:
                    raise ValueError(self._unreadable(name, times, err)) from err
                order = [d for d in ("time", "level", "latitude", "longitude") if d in dims]
                block = np.transpose(block, [dims.index(d) for d in order])
                dense[..., i0:i1, j0:j1] = self._decode(name, block)
        r_pos = np.searchsorted(s_rows, view.lat_storage[np.where(ok_r, rows, 0)])
        c_pos = np.searchsorted(s_cols, view.lon_storage[np.where(ok_c, cols, 0)])
        if len(s_rows) == 0 or len(s_cols) == 0:
            return np.zeros((*lead, len(rows), len(cols)), dtype=np.float32)
        out = dense[..., r_pos, :][..., c_pos]
        out[..., ~ok_r, :] = 0.0
        out[..., ~ok_c] = 0.0
        return out

    def _decode(self, name: str, raw: np.ndarray) -> np.ndarray:
        scale, offset = self.view.encoding(name)
        enc = self.view.dataset[name].encoding
        out = raw.astype(np.float32)
        fill = enc.get("_FillValue")
        if fill is not None and not (isinstance(fill, float) and np.isnan(fill)):
            out[raw == fill] = np.nan
        if scale != 1.0 or offset != 0.0:
            out = out * np.float32(scale) + np.float32(offset)
        return out

    def _unreadable(self, name: str, times: np.ndarray | None, err: Exception) -> str:
        when = "" if times is None else f" at {[str(self.view.times[t]) for t in times]}"
        return (f"could not read variable {name!r}{when} from {self.view.path!r}: "
                f"{type(err).__name__}: {err}. A chunk is damaged or unreadable; re-create the store "
                f"(`jigsaw-earth data prepare`) or re-download it")

    def _check_nan(self, name: str, data: np.ndarray, times: np.ndarray | None) -> None:
        if np.isnan(data).any():
            bad = np.isnan(data.reshape(data.shape[0], -1)).any(axis=1) if times is not None else []
            when = [str(self.view.times[t]) for t, b in zip(times, bad) if b] if times is not None else []
            raise ValueError(
                f"variable {name!r} has {int(np.isnan(data).sum())} NaN values in tile "
                f"{self.tile} of {self.view.path!r}{' at ' + ', '.join(when[:5]) if when else ''}; "
                f"fill them in the source or choose a period without them "
                f"(`jigsaw-earth data inspect PATH` lists NaNs)"
            )

    # ---- public reads ---------------------------------------------------------------------
    def _read_padded(self, name: str, times: np.ndarray | None, levels: np.ndarray | None) -> np.ndarray:
        lead = ([len(times)] if times is not None else []) + ([len(levels)] if levels is not None else [])
        out = np.zeros((*lead, *self.padded_shape), dtype=np.float32)
        for pos, src, cols in self._groups:
            out[..., pos, :] = self._read(name, times, levels, src, cols)
        return out

    def read_inputs(self, t: int) -> np.ndarray:
        """``(C, H, W)`` at time index ``t``, with the halo."""
        parts = []
        for _, name, levels in self.fields:
            x = self._read_padded(name, np.array([t]), levels)[0]
            self._check_nan(name, x[None], np.array([t]))
            parts.append(x if levels is not None else x[None])
        return np.concatenate(parts, axis=0)

    def read_targets(self, ts: np.ndarray) -> np.ndarray:
        """``(len(ts), C, h, w)`` at time indices ``ts``, the tile only (no halo)."""
        t = self.tile
        rows, cols = np.arange(t.lat_start, t.lat_stop), np.arange(t.lon_start, t.lon_stop)
        parts = []
        for _, name, levels in self.fields:
            x = self._read(name, np.asarray(ts), levels, rows, cols)
            self._check_nan(name, x, np.asarray(ts))
            parts.append(x if levels is not None else x[:, None])
        return np.concatenate(parts, axis=1)

    def read_static(self) -> tuple[np.ndarray, list[str]]:
        """``(C_static, H, W)`` static fields with the halo, and their names."""
        parts, names = [], []
        for v in self.spec.static:
            name = self.view.resolve(v, upper_air=False)
            has_time = "time" in self.view.dims(name)
            x = self._read_padded(name, np.array([0]) if has_time else None, None)
            x = x[0] if has_time else x
            self._check_nan(name, x[None], None)
            parts.append(x)
            names.append(v)
        lat = np.deg2rad(self.view.lat)[:, None] * np.ones((1, len(self.view.lon)))
        lon = np.ones((len(self.view.lat), 1)) * np.deg2rad(self.view.lon)[None, :]
        geo = np.stack([np.cos(lat), np.sin(lat), np.cos(lon), np.sin(lon)]).astype(np.float32)
        padded = np.zeros((4, *self.padded_shape), dtype=np.float32)
        for pos, src, cols in self._groups:
            block = geo[:, np.maximum(src, 0)][:, :, np.maximum(cols, 0)]
            block[:, src < 0] = 0.0
            block[..., cols < 0] = 0.0
            padded[:, pos] = block
        return np.concatenate([*(p[None] for p in parts), padded]), [*names, *STATIC_GEOMETRY]

    def sample_bytes(self, n_times: int) -> int:
        """Uncompressed float32 bytes of ``n_times`` global fields of all channels."""
        return 4 * self.spec.n_channels * n_times * self.grid.n_lat * self.grid.n_lon

    def describe(self) -> dict[str, Any]:
        return {"tile": vars(self.tile) if hasattr(self.tile, "__dict__") else str(self.tile),
                "halo": str(self.halo), "channels": self.spec.channels}
