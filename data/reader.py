"""Read one rank's tile (plus halo) of a sample straight from the store, at the storage's speed.

A padded tile is described row by row and column by column in *normalised* coordinates
(``sphere.row_sources`` / ``col_sources``, the definition of ``pad_reference``). Rows are grouped by
whether they lie across a pole (their columns are shifted by 180°). For each group the storage
rows and columns become runs (``placement.axis_plan``); each run × run box is read as blocks of
decoded chunks (``chunks.ChunkSource``: a memory map of an uncompressed shard, else fetched and
decoded bytes) and copied once into the caller's output (``placement.place``). So a tile reads only
the chunks overlapping its own rows and columns, its halo strips, and (across a pole) the rows
near the pole at the opposite longitudes; never the whole field. Fields are read in parallel on
``threads`` threads (file reads, decompression and numpy copies release the GIL); each field's
NaN check (which training leaves to its non-finite loss) and optional normalisation run on its own
region right after it is placed.
"""

from __future__ import annotations

import itertools
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
from jigsaw_earth.data.batch import STATIC_GEOMETRY, VariableSpec
from jigsaw_earth.data.chunks import ChunkFormat, ChunkSource
from jigsaw_earth.data.objects import REQUESTS_IN_FLIGHT
from jigsaw_earth.data.placement import (
    AxisPlan,
    DirectRead,
    Preadv,
    axis_plan,
    place,
    preadv_calls,
    recording,
    replay,
)
from jigsaw_earth.data.store import StoreView

from jigsaw_earth.distributed.halo import Halo
from jigsaw_earth.distributed.mesh import cores_per_rank
from jigsaw_earth.distributed.tiles import Tile, TileGrid
from jigsaw_earth.sphere import col_sources, coordinate_channels, row_sources

__all__ = ["Normalisation", "TileReader", "chunk_source", "read_threads"]

log = logging.getLogger(__name__)
KNOWN_DIMS = ("time", "level", "latitude", "longitude")


def chunk_source(view: StoreView) -> ChunkSource:
    """The ``ChunkSource`` of a view's store (one per view: shared shard-index cache, counters)."""
    src = view.__dict__.get("_chunk_source")
    if src is None:
        src = view.__dict__["_chunk_source"] = ChunkSource(view.store, url=str(view.path))
    return src


def read_threads(setting: int | str, remote: bool = False) -> int:
    """The threads a reader runs for ``data.read_threads``: ``auto`` = the cores this rank has
    (``mesh.cores_per_rank``: its CPU affinity shared by the ranks of its host), a number at most
    that: more threads than cores only contend (4 ranks on 2 cores read 1.3x raw with 1 thread
    each, up to 2x with 2: docs/data.md). From a bucket (``remote``) the threads mostly wait for
    the link: ``auto`` = ``objects.REQUESTS_IN_FLIGHT``, a number as given."""
    if remote:
        return REQUESTS_IN_FLIGHT if setting == "auto" else max(1, int(setting))
    cores = cores_per_rank()
    return cores if setting == "auto" else max(1, min(int(setting), cores))


@dataclass(frozen=True)
class Normalisation:
    """Per-channel ``(x - mean) / std`` applied as each field is read (float32, as numpy would)."""

    mean: np.ndarray  # (C,) float32
    std: np.ndarray  # (C,) float32


@dataclass
class _Remembered:
    """A field's read made only of direct reads (``_read_field``): the storage objects' time
    coordinate then, their reads, shard indexes and spans, and the calls per output buffer."""

    t_object: int
    reads: dict[tuple[int, ...], list[DirectRead]]
    indexes: dict[tuple[int, ...], np.ndarray]
    spans: dict[tuple[int, ...], list[tuple[int, int]]]
    by_buffer: dict[int, dict[tuple[int, ...], list[Preadv]]] = field(default_factory=dict)

    BUFFERS = 8  # outputs remembered (training's ring of batch buffers; fresh ones come and go)

    def calls(self, out: np.ndarray) -> dict[tuple[int, ...], list[Preadv]]:
        """The replay's calls into ``out`` (its layout is part of the key this was found by)."""
        address = out.__array_interface__["data"][0]
        calls = self.by_buffer.get(address)
        if calls is None:
            calls = {c: preadv_calls(rs, out) for c, rs in self.reads.items()}
            if len(self.by_buffer) >= self.BUFFERS:
                self.by_buffer.clear()
            self.by_buffer[address] = calls
        return calls


@dataclass(frozen=True)
class _Field:
    canonical: str
    store_name: str
    levels: np.ndarray | None  # storage level indices, in channel order
    channels: slice  # its channels in the sample

    @cached_property
    def level_plan(self) -> AxisPlan:
        return axis_plan(np.zeros(1, np.int64) if self.levels is None else self.levels)


class TileReader:
    """Reads the fields of ``spec`` for one tile of the normalised grid (lat descending).

    ``read_inputs(t)`` → ``(C, H, W)`` with the halo; ``read_targets(ts)`` → ``(len(ts), C, h, w)``;
    ``read_static()`` → ``(C_static, H, W)``. Values are physical (not normalised) float32 unless a
    ``Normalisation`` is given. ``threads`` reads fields in parallel (1: in the caller's thread;
    ``read_threads`` says how many run).
    """

    def __init__(
        self,
        view: StoreView,
        spec: VariableSpec,
        grid: TileGrid,
        tile: Tile,
        halo: Halo,
        threads: int | str = 1,
    ):
        if (grid.n_lat, grid.n_lon) != view.grid_shape:
            raise ValueError(
                f"tile grid {grid.n_lat}x{grid.n_lon} does not match store {view.path!r} grid "
                f"{view.grid_shape[0]}x{view.grid_shape[1]}"
            )
        halo.check(grid)
        self.view, self.spec, self.grid, self.tile, self.halo = view, spec, grid, tile, halo
        self.source = chunk_source(view)
        self.fields: list[tuple[str, str, np.ndarray | None]] = []  # (canonical, store, levels)
        for v in spec.upper_air:
            self.fields.append((v, view.resolve(v, upper_air=True), view.level_indices(v, spec.levels)))
        for v in spec.surface:
            self.fields.append((v, view.resolve(v, upper_air=False), None))
        self._fields, c = [], 0
        for canonical, name, levels in self.fields:
            self._check_dims(name)
            n = 1 if levels is None else len(levels)
            self._fields.append(_Field(canonical, name, levels, slice(c, c + n)))
            c += n
        self._formats: dict[str, ChunkFormat] = {}
        row_lo, row_hi = tile.lat_start - halo.lat[0], tile.lat_stop + halo.lat[1]
        rows = row_sources(grid.n_lat, row_lo, row_hi, halo.lat_mode)
        col_lo, col_hi = tile.lon_start - halo.lon[0], tile.lon_stop + halo.lon[1]
        self._groups = []  # (padded row positions, source rows, source cols) per pole flag
        for flip in sorted({f for _, f in rows}):
            pos = np.array([p for p, (_, f) in enumerate(rows) if f == flip])
            src = np.array([rows[p][0] for p in pos])
            cols = col_sources(grid.n_lon, col_lo, col_hi, halo.lon_mode, across_pole=flip)
            self._groups.append((pos, src, np.array(cols)))
        self.padded_shape = (tile.shape[0] + sum(halo.lat), tile.shape[1] + sum(halo.lon))
        self._padded_plans = self._plans(self._groups)
        self._tile_plans = self._plans(
            [
                (
                    np.arange(tile.shape[0]),
                    np.arange(tile.lat_start, tile.lat_stop),
                    np.arange(tile.lon_start, tile.lon_stop),
                )
            ]
        )
        self.threads = read_threads(threads, remote=self.source.remote is not None)
        self._pool: ThreadPoolExecutor | None = None
        self._local = threading.local()  # per-thread scratch (placement's chunk gathers)
        self._replays: dict[tuple, _Remembered] = {}  # see ``_read_field``
        for f in self._fields:
            self._format(f.store_name)  # open the array's metadata now, not during the first sample

    @classmethod
    def for_rank(
        cls,
        view: StoreView,
        spec: VariableSpec,
        mesh_lat: int,
        mesh_lon: int,
        domain_index: int,
        halo: Halo,
        threads: int | str = 1,
    ) -> TileReader:
        grid = TileGrid(*view.grid_shape, mesh_lat, mesh_lon)
        return cls(view, spec, grid, grid.tile_of(domain_index), halo, threads)

    # ---- I/O accounting (what ``data io-report`` counts) --------------------------------------
    @property
    def bytes_read(self) -> int:
        return self.source.bytes_read

    @property
    def requests(self) -> int:
        return self.source.requests

    def reset_counts(self) -> None:
        self.source.reset()

    def _check_dims(self, name: str) -> None:
        extra = [d for d in self.view.dims(name) if d not in KNOWN_DIMS]
        if extra:
            raise ValueError(
                f"variable {name!r} of {self.view.path!r} has dimensions {extra} besides "
                f"time/level/latitude/longitude; select one value of them before reading"
            )

    def _format(self, name: str) -> ChunkFormat:
        if name not in self._formats:
            self._formats[name] = ChunkFormat.of(self.view.array(name))
        return self._formats[name]

    def _plans(self, groups: list) -> list[tuple[np.ndarray, AxisPlan, AxisPlan]]:
        """Per row group: (its padded row positions, row plan, column plan) in storage indices."""
        view, out = self.view, []
        for pos, src, cols in groups:
            rows = np.where(src >= 0, view.lat_storage[np.maximum(src, 0)], -1)
            cstore = np.where(cols >= 0, view.lon_storage[np.maximum(cols, 0)], -1)
            out.append((pos, axis_plan(rows, pos), axis_plan(cstore)))
        return out

    # ---- one field ------------------------------------------------------------------------
    def _read_field(self, f: _Field, times: np.ndarray | None, plans: list, out: np.ndarray) -> None:
        """Field ``f`` at storage ``times`` (None: no time axis) into ``out`` ``(T, L, R, C)``
        (``T``, ``L`` = 1 where the field has no time / level axis).

        A read that placed every cell with direct reads is remembered, and the same field read
        again at other times (same plans, same output layout, shards indexed alike) repeats those
        reads from the new times' shards without planning again (``_replayed``)."""
        name = f.store_name
        fmt = self._format(name)
        try:
            if not self._replayed(f, fmt, times, plans, out):
                with recording(out) as rec:
                    self._place_groups(f, fmt, times, plans, out)
                if rec.complete and rec.reads:
                    self._remember(f, fmt, times, plans, out, rec.reads)
            for pos, rows, cols in plans:
                if rows.runs or cols.runs:
                    self._fill(out, pos, rows, cols)
        except (ValueError, OSError) as err:
            raise ValueError(self._unreadable(name, times, err)) from err

    def _place_groups(
        self, f: _Field, fmt: ChunkFormat, times: np.ndarray | None, plans: list, out: np.ndarray
    ) -> None:
        """Place the stored cells of field ``f`` of every row group into ``out`` (see ``_read_field``)."""
        array, dims = self.view.array(f.store_name), self.view.dims(f.store_name)
        axes = {"time": 0, "level": 1, "latitude": 2, "longitude": 3}
        present = [axes[d] for d in dims]
        # the destination with the storage axes in storage order
        dst = out.transpose([*present, *(a for a in range(4) if a not in present)])
        dst = dst[(Ellipsis, *([0] * (4 - len(dims))))] if len(dims) < 4 else dst
        for _, rows, cols in plans:
            if rows.runs and cols.runs:
                by_dim = {
                    "latitude": rows,
                    "longitude": cols,
                    "time": axis_plan(np.zeros(1, np.int64) if times is None else times),
                    "level": f.level_plan,
                }
                self._place(fmt, array, [by_dim[d] for d in dims], dims, dst)

    # ---- remembered direct reads --------------------------------------------------------------
    def _replay_key(
        self, f: _Field, fmt: ChunkFormat, times: np.ndarray | None, plans: list, out: np.ndarray
    ) -> tuple[tuple, int, int]:
        """(key of a read's layout, the time axis of its storage objects or -1, its first object's
        time coordinate): reads with one key differ only by a shift of that coordinate."""
        dims = self.view.dims(f.store_name)
        layout = (f.store_name, f.channels.start, id(plans), out.shape, out.strides)
        if times is None or "time" not in dims:
            return (*layout, None), -1, 0
        axis = dims.index("time")
        per_object, t0 = fmt.object_shape[axis], int(times[0])
        return (*layout, tuple((times - t0).tolist()), t0 % per_object), axis, t0 // per_object

    def _remember(
        self,
        f: _Field,
        fmt: ChunkFormat,
        times: np.ndarray | None,
        plans: list,
        out: np.ndarray,
        reads: list[DirectRead],
    ) -> None:
        key, _, t_object = self._replay_key(f, fmt, times, plans, out)
        by_object: dict[tuple[int, ...], list[DirectRead]] = {}
        for r in reads:
            by_object.setdefault(r.coords, []).append(r)
        indexes = {}
        for coords in by_object:
            found = self.source.shard_file(fmt, coords)
            if found is None:
                return
            indexes[coords] = found[1]
        spans = {c: [(r.pos, r.pos + r.run * len(r.starts)) for r in rs] for c, rs in by_object.items()}
        self._replays[key] = _Remembered(t_object, by_object, indexes, spans)

    def _replayed(
        self, f: _Field, fmt: ChunkFormat, times: np.ndarray | None, plans: list, out: np.ndarray
    ) -> bool:
        """Repeat a remembered read of ``f`` at ``times`` into ``out``; False where there is none or
        a shard it needs is absent or indexed differently (then the read goes the general way)."""
        key, axis, t_object = self._replay_key(f, fmt, times, plans, out)
        remembered = self._replays.get(key)
        if remembered is None:
            return False
        files = {}
        for coords, index in remembered.indexes.items():
            moved = list(coords)
            if axis >= 0:
                moved[axis] += t_object - remembered.t_object
            found = self.source.shard_file(fmt, tuple(moved))
            if found is None or not (found[1] is index or np.array_equal(found[1], index)):
                return False
            files[coords] = found[0]
        calls = remembered.calls(out)
        for coords, file in files.items():
            replay(file, calls[coords])
            self.source.count_direct(file, remembered.spans[coords])
        return True

    def _place(
        self, fmt: ChunkFormat, array: Any, plans: list[AxisPlan], dims: tuple[str, ...], dst: np.ndarray
    ) -> None:
        # latitude / longitude runs are boxes of their own (a wrapped halo is two runs far apart);
        # time and level runs share one box (their chunks hold several of them)
        boxes_per_dim = []
        for d, p in zip(dims, plans):
            if d in ("latitude", "longitude"):
                boxes_per_dim.append([((r.start, r.stop), [r]) for r in p.runs])
            else:
                boxes_per_dim.append([(p.span, p.runs)])
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = np.empty(4 << 20, np.uint8)
        for combo in itertools.product(*boxes_per_dim):
            box = tuple(b for b, _ in combo)
            for block in self.source.blocks(fmt, array, box):
                for runs in itertools.product(*(r for _, r in combo)):
                    place(block, runs, dst, scratch)

    def _fill(self, out: np.ndarray, pos: np.ndarray, rows: AxisPlan, cols: AxisPlan) -> None:
        """Zero padding and repeated rows/columns of one row group (after its cells are placed)."""
        if len(cols.zeros) or cols.repeats:
            block = out[..., pos, :]
            block[..., cols.zeros] = 0.0
            for d, s in cols.repeats:
                block[..., d] = block[..., s]
            out[..., pos, :] = block
        if len(rows.zeros):
            out[..., rows.zeros, :] = 0.0
        for d, s in rows.repeats:
            out[..., d, :] = out[..., s, :]

    def _finish(
        self,
        f: _Field,
        times: np.ndarray | None,
        region: np.ndarray,
        norm: Normalisation | None,
        check_nan: bool = True,
    ) -> None:
        """CF decoding, the NaN check (unless the caller checks later) and the normalisation of one
        field's region, in place."""
        scale, offset, fill = self.view.encoding(f.store_name)
        if fill is not None and not (isinstance(fill, float) and np.isnan(fill)):
            region[region == np.float32(fill)] = np.nan
        if scale != 1.0 or offset != 0.0:
            region *= np.float32(scale)
            region += np.float32(offset)
        if check_nan and region.size and np.isnan(region.max()):  # max propagates NaN: one vectorised pass
            self._check_nan(f.store_name, region, times)
        if norm is not None:  # a level's map at a time: both passes while it is in cache (~20 % faster)
            mean, std = norm.mean[f.channels], norm.std[f.channels]
            for maps in region:
                for m, mu, sigma in zip(maps, mean, std):
                    np.subtract(m, mu, out=m)
                    np.divide(m, sigma, out=m)

    def _unreadable(self, name: str, times: np.ndarray | None, err: Exception) -> str:
        when = "" if times is None else f" at {[str(self.view.times[t]) for t in times]}"
        return (
            f"could not read variable {name!r}{when} from {self.view.path!r}: "
            f"{type(err).__name__}: {err}. A chunk is damaged or unreadable; re-create the store "
            f"(`jigsaw-earth data prepare`) or re-download it"
        )

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
    def _jobs(
        self,
        times: np.ndarray,
        plans: list,
        out: np.ndarray,
        norm: Normalisation | None,
        check_nan: bool = True,
    ) -> list:
        """One job per field: read it at ``times`` into ``out`` ``(T, C, R, W)`` and finish it."""

        def job(f: _Field) -> None:
            region = out[:, f.channels]  # (T, levels or 1, R, W)
            self._read_field(f, times, plans, region)
            self._finish(f, times, region, norm, check_nan)

        return [lambda f=f: job(f) for f in self._fields]

    def _run(self, jobs: list) -> None:
        if self.threads == 1 or len(jobs) == 1:
            for j in jobs:
                j()
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="jigsaw-read")
        for fut in [self._pool.submit(j) for j in jobs]:
            fut.result()

    def read_batch(
        self,
        inits: np.ndarray,
        targets: np.ndarray,
        norm: Normalisation | None = None,
        out: tuple[np.ndarray, np.ndarray] | None = None,
        check_nan: bool = True,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Inputs ``(B, C, H, W)`` at times ``inits`` and targets ``(B, L, C, h, w)`` at
        ``targets`` ``(B, L)``, every field of every sample read in parallel; into ``out`` when
        given (reused buffers skip the page faults of fresh memory: ~10 % of a read here).

        ``check_nan=False`` leaves out the NaN pass (one more pass over every byte read):
        for a caller that finds NaNs another way, as training does from a non-finite loss."""
        inits, targets = np.asarray(inits, np.int64), np.asarray(targets, np.int64).reshape(len(inits), -1)
        c, (h, w) = self.spec.n_channels, self.tile.shape
        shapes = ((len(inits), c, *self.padded_shape), (*targets.shape, c, h, w))
        fits = out is not None and all(a.shape == s and a.dtype == np.float32 for a, s in zip(out, shapes))
        if fits:
            x, y = out
        else:
            x, y = (np.empty(s, np.float32) for s in shapes)
        jobs = []
        for i, t in enumerate(inits):
            jobs += self._jobs(np.array([t]), self._padded_plans, x[i : i + 1], norm, check_nan)
            if targets.shape[1]:
                jobs += self._jobs(targets[i], self._tile_plans, y[i], norm, check_nan)
        self._run(jobs)
        return x, y

    def read_sample(self, t: int, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``read_inputs(t)`` and ``read_targets(ts)``, all fields read in parallel."""
        x, y = self.read_batch(np.array([t]), np.asarray(ts, np.int64)[None])
        return x[0], y[0]

    def read_inputs(self, t: int, norm: Normalisation | None = None) -> np.ndarray:
        """``(C, H, W)`` at time index ``t``, with the halo."""
        return self.read_batch(np.array([t]), np.zeros((1, 0), np.int64), norm)[0][0]

    def read_targets(self, ts: np.ndarray, norm: Normalisation | None = None) -> np.ndarray:
        """``(len(ts), C, h, w)`` at time indices ``ts``, the tile only (no halo)."""
        c, (h, w) = self.spec.n_channels, self.tile.shape
        ts = np.asarray(ts, np.int64)
        y = np.empty((len(ts), c, h, w), np.float32)
        self._run(self._jobs(ts, self._tile_plans, y, norm))
        return y

    def read_static(self) -> tuple[np.ndarray, list[str]]:
        """``(C_static, H, W)`` static fields with the halo, and their names."""
        parts, names = [], []
        for v in self.spec.static:
            name = self.view.resolve(v, upper_air=False)
            has_time = "time" in self.view.dims(name)
            x = np.empty((1, 1, *self.padded_shape), np.float32)
            f = _Field(v, name, None, slice(0, 1))
            self._read_field(f, np.array([0]) if has_time else None, self._padded_plans, x)
            self._finish(f, None, x[0], None)
            parts.append(x[0, 0])
            names.append(v)
        # from the store's own latitudes and longitudes, in STATIC_GEOMETRY's order (cos before sin)
        geo = coordinate_channels(np.deg2rad(self.view.lat), np.deg2rad(self.view.lon))
        geo = geo[[1, 0, 3, 2]].astype(np.float32)
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
        return {
            "tile": vars(self.tile) if hasattr(self.tile, "__dict__") else str(self.tile),
            "halo": str(self.halo),
            "channels": self.spec.channels,
        }
