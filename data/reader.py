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

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
from zarr.core.sync import sync

from jigsaw_earth.distributed.halo import Halo
from jigsaw_earth.distributed.tiles import Tile, TileGrid

from .batch import STATIC_GEOMETRY, VariableSpec
from .geometry import halo_cols, halo_rows
from .store import StoreView

__all__ = ["TileReader", "contiguous_runs"]

log = logging.getLogger(__name__)
KNOWN_DIMS = ("time", "level", "latitude", "longitude")


def contiguous_runs(sorted_values: np.ndarray, chunk: int = 1) -> list[tuple[int, int]]:
    """Positions ``[i, j)`` of runs of consecutive integers in a sorted array.

    Runs that touch the same storage chunk (of size ``chunk``) are merged: reading the span
    between them costs no extra chunk, and one read is cheaper than two of the same chunk.
    """
    if len(sorted_values) == 0:
        return []
    breaks = np.nonzero(np.diff(sorted_values) != 1)[0] + 1
    edges = [0, *breaks.tolist(), len(sorted_values)]
    runs = list(itertools.pairwise(edges))
    merged = [runs[0]]
    for i, j in runs[1:]:
        if sorted_values[i] // chunk <= sorted_values[merged[-1][1] - 1] // chunk:
            merged[-1] = (merged[-1][0], j)
        else:
            merged.append((i, j))
    return merged


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
            view.array(name)  # open the array's metadata now, not during the first sample
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
    def _plan(self, name: str, times: np.ndarray | None, levels: np.ndarray | None,
              rows: np.ndarray, cols: np.ndarray) -> tuple[list, Callable[[list], np.ndarray]]:
        """Zarr reads for normalised ``rows``/``cols`` (-1 = zeros), and how to assemble them.

        Returns ``(requests, assemble)``: ``requests`` are ``(store name, selection)`` pairs;
        ``assemble(results)`` gives ``(T?, L?, len(rows), len(cols))`` float32.
        """
        view = self.view
        all_dims = view.dims(name)
        dims = [d for d in all_dims if not (d == "time" and times is None)]
        ok_r, ok_c = rows >= 0, cols >= 0
        s_rows = np.unique(view.lat_storage[rows[ok_r]])
        s_cols = np.unique(view.lon_storage[cols[ok_c]])
        lead = [len(times)] if times is not None else []
        lead += [len(levels)] if levels is not None else []
        order = [d for d in ("time", "level", "latitude", "longitude") if d in dims]
        perm = [dims.index(d) for d in order]
        requests, places = [], []
        chunks = dict(zip(all_dims, view.array(name).chunks))
        for i0, i1 in contiguous_runs(s_rows, chunks["latitude"]):
            for j0, j1 in contiguous_runs(s_cols, chunks["longitude"]):
                picks = {"time": times if times is not None else 0, "level": levels,
                         "latitude": slice(int(s_rows[i0]), int(s_rows[i1 - 1]) + 1),
                         "longitude": slice(int(s_cols[j0]), int(s_cols[j1 - 1]) + 1)}
                requests.append((name, tuple(picks.get(d, 0) for d in all_dims)))
                places.append((i0, i1, j0, j1))

        def assemble(results: list) -> np.ndarray:
            if not places:
                return np.zeros((*lead, len(rows), len(cols)), dtype=np.float32)
            dense = np.zeros((*lead, len(s_rows), len(s_cols)), dtype=np.float32)
            for (i0, i1, j0, j1), block in zip(places, results):
                block = np.transpose(np.asarray(block), perm)  # spans merged runs' gaps too
                block = block.take(s_rows[i0:i1] - s_rows[i0], axis=-2)
                block = block.take(s_cols[j0:j1] - s_cols[j0], axis=-1)
                dense[..., i0:i1, j0:j1] = self._decode(name, block)
            # zero-padded rows/cols (-1) may point anywhere valid: they are zeroed below
            r_pos = np.searchsorted(s_rows, view.lat_storage[np.where(ok_r, rows, 0)])
            c_pos = np.searchsorted(s_cols, view.lon_storage[np.where(ok_c, cols, 0)])
            r_pos, c_pos = np.minimum(r_pos, len(s_rows) - 1), np.minimum(c_pos, len(s_cols) - 1)
            out = dense[..., r_pos, :][..., c_pos]
            out[..., ~ok_r, :] = 0.0
            out[..., ~ok_c] = 0.0
            return out

        return requests, assemble

    def _fetch(self, requests: list, times: np.ndarray | None) -> list:
        """Run all zarr reads concurrently (one event-loop round trip for a whole sample)."""

        arrays = {name: self.view.array(name)._async_array for name, _ in requests}

        async def one(name: str, sel: tuple) -> Any:
            try:
                return await arrays[name].oindex.getitem(sel)
            except Exception as err:
                raise ValueError(self._unreadable(name, times, err)) from err

        async def every() -> list:
            return list(await asyncio.gather(*(one(n, s) for n, s in requests)))

        return sync(every())

    def _read(self, name: str, times: np.ndarray | None, levels: np.ndarray | None,
              rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        requests, assemble = self._plan(name, times, levels, rows, cols)
        return assemble(self._fetch(requests, times))

    def _decode(self, name: str, raw: np.ndarray) -> np.ndarray:
        scale, offset, fill = self.view.encoding(name)
        out = raw.astype(np.float32)
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
    def _padded_plan(self, name: str, times: np.ndarray | None, levels: np.ndarray | None):
        lead = ([len(times)] if times is not None else []) + ([len(levels)] if levels is not None else [])
        parts = [(pos, *self._plan(name, times, levels, src, cols)) for pos, src, cols in self._groups]
        requests = [r for _, reqs, _ in parts for r in reqs]

        def assemble(results: list) -> np.ndarray:
            out = np.zeros((*lead, *self.padded_shape), dtype=np.float32)
            k = 0
            for pos, reqs, fn in parts:
                out[..., pos, :] = fn(results[k : k + len(reqs)])
                k += len(reqs)
            return out

        return requests, assemble

    def _read_padded(self, name: str, times: np.ndarray | None, levels: np.ndarray | None) -> np.ndarray:
        requests, assemble = self._padded_plan(name, times, levels)
        return assemble(self._fetch(requests, times))

    def read_sample(self, t: int, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``read_inputs(t)`` and ``read_targets(ts)`` with all reads issued concurrently."""
        t_in, ts = np.array([t]), np.asarray(ts)
        tile = self.tile
        rows, cols = np.arange(tile.lat_start, tile.lat_stop), np.arange(tile.lon_start, tile.lon_stop)
        plans = []
        for _, name, levels in self.fields:
            plans.append((name, t_in, levels, *self._padded_plan(name, t_in, levels)))
            if len(ts):
                plans.append((name, ts, levels, *self._plan(name, ts, levels, rows, cols)))
        results = self._fetch([r for *_, reqs, _ in plans for r in reqs], np.concatenate([t_in, ts]))
        inputs, targets, k = [], [], 0
        for name, times, levels, reqs, assemble in plans:
            x = assemble(results[k : k + len(reqs)])
            k += len(reqs)
            self._check_nan(name, x, times)
            x = x if levels is not None else x[:, None]
            (inputs if times is t_in else targets).append(x)
        tgt = np.concatenate(targets, axis=1) if targets else np.zeros((0, self.spec.n_channels, *tile.shape),
                                                                         np.float32)
        return np.concatenate(inputs, axis=1)[0], tgt

    def read_inputs(self, t: int) -> np.ndarray:
        """``(C, H, W)`` at time index ``t``, with the halo."""
        return self.read_sample(t, np.array([], dtype=np.int64))[0]

    def read_targets(self, ts: np.ndarray) -> np.ndarray:
        """``(len(ts), C, h, w)`` at time indices ``ts``, the tile only (no halo)."""
        t = self.tile
        rows, cols = np.arange(t.lat_start, t.lat_stop), np.arange(t.lon_start, t.lon_stop)
        plans = [(name, levels, *self._plan(name, np.asarray(ts), levels, rows, cols))
                 for _, name, levels in self.fields]
        results = self._fetch([r for *_, reqs, _ in plans for r in reqs], np.asarray(ts))
        parts, k = [], 0
        for name, levels, reqs, assemble in plans:
            x = assemble(results[k : k + len(reqs)])
            k += len(reqs)
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
