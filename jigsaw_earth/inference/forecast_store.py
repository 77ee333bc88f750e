"""A WeatherBench-2-layout forecast store that all ranks write together, each its own tile.

Layout (WB2 forecast convention): upper-air variables ``(time, prediction_timedelta, level,
latitude, longitude)``, surface variables ``(time, prediction_timedelta, latitude, longitude)``;
``time`` is the initialisation time; latitude as the data (descending, WB2), levels ascending. An
ensemble (``members``) has a member dimension ``number`` (WB2's and ECMWF's name, members 0…M−1)
after the lead (``predict --first-member K``: members K…K+M−1):
``(time, prediction_timedelta, number, [level], latitude, longitude)``.

Chunks (``StoreChunks``, chosen by ``store_chunks``) are aligned in space with every tile boundary
of the mesh (the greatest common divisor of the tile offsets along each axis), so no two ranks ever
write the same chunk and no locking is needed: an even split gives one chunk per tile, an uneven one
(721 rows over 4 ranks) finer chunks. Along the init, lead and member axes a chunk holds several
fields, about ``CHUNK_BYTES``: a batch's inits (one data replica), the members of a rank's ensemble
group, then as many leads as fill it, so one write covers many inits and leads (predict writes a
batch's fields in blocks of whole chunks, ``inference/write_pool.py``). Chunks are uncompressed
float32 (the size ``campaign.check_room`` estimates; model output compresses little, and a codec
would make the writers the limit). The store is written under ``PATH.in-progress`` (one
name per output: ``resume`` reopens it, ``progress.py`` records what is written) and renamed to
``PATH`` by rank 0 only after every rank has finished (``close``), which then removes the progress
folder ``_progress`` from it; ``abort`` removes it. The root attribute
``jigsaw_earth = {"kind": "forecast", "complete": ...}`` marks the store as predict's own, so
``--overwrite`` replaces only such stores (``ownership.check_output``). A bucket URL's store is
written in place, committed by that marker (``bucket_output.py``).
"""

from __future__ import annotations

import logging
import math
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import torch.distributed as dist
import xarray as xr
import zarr

from ..data.objects import is_object_url, zarr_object_store
from ..distributed.tiles import Tile, TileGrid
from ..metrics.engine import MEMBER
from ..metrics.units import CF_ATTRS, UNITS
from ..ownership import MARKER, check_output, in_progress_path, unique_tmp
from .unfinished import PROGRESS

__all__ = ["CHUNK_BYTES", "ForecastLayout", "ForecastWriter", "StoreChunks", "aligned_chunk", "store_chunks"]

log = logging.getLogger(__name__)


COORD_ATTRS = {
    "time": {"standard_name": "forecast_reference_time", "long_name": "initialisation time"},
    "prediction_timedelta": {"standard_name": "forecast_period", "long_name": "lead time"},
    "latitude": {"standard_name": "latitude", "units": "degrees_north"},
    "longitude": {"standard_name": "longitude", "units": "degrees_east"},
    "level": {"standard_name": "air_pressure", "long_name": "pressure level", "units": "hPa"},
    MEMBER: {"standard_name": "realization", "long_name": "ensemble member"},
}


#: about the bytes of one chunk (one object on disk) along the init, lead and member axes
CHUNK_BYTES = 8 << 20


def aligned_chunk(offsets: tuple[int, ...]) -> int:
    """Largest chunk size whose chunk boundaries include every interior tile boundary."""
    interior = offsets[1:-1]
    if not interior:
        return offsets[-1]
    return math.gcd(*interior)


@dataclass(frozen=True)
class ForecastLayout:
    """What the forecast store holds; coordinates are global."""

    init_times: np.ndarray  # datetime64
    leads: np.ndarray  # timedelta64
    upper_air: tuple[str, ...]
    levels: tuple[int, ...]
    surface: tuple[str, ...]
    latitude: np.ndarray
    longitude: np.ndarray
    members: int | None = None  # an ensemble's size (a ``number`` dimension); None: deterministic
    first_member: int = 0  # the ``number`` of the store's first member (``predict --first-member``)

    @property
    def channels(self) -> list[str]:
        """Channel order of the arrays passed to ``ForecastWriter.write`` (as the data batch)."""
        levs = sorted(self.levels)
        return [f"{v}@{lev}" for v in self.upper_air for lev in levs] + list(self.surface)


KIND = "forecast"


@dataclass(frozen=True)
class StoreChunks:
    """Chunk lengths along the init (``time``), lead and member axes; space follows the tiles."""

    inits: int = 1
    leads: int = 1
    members: int = 1


def _divisor_within(n: int, most: int) -> int:
    """The largest divisor of ``n`` that is at most ``most`` (at least 1)."""
    return max(d for d in range(1, max(1, min(n, most)) + 1) if n % d == 0)


def store_chunks(layout: ForecastLayout, grid: TileGrid, batch: int, replicas: int,
                 members_per_rank: int = 1, target: int = CHUNK_BYTES) -> StoreChunks:  # fmt: skip
    """Chunks of about ``target`` bytes that predict's writers fill whole: members a divisor of a
    rank's ``members_per_rank`` (an ensemble group's, contiguous), inits a divisor of the ``batch``
    (one data replica: its batches are consecutive inits; several replicas take every R-th init, so
    one), then leads to fill the rest."""
    c_lat, c_lon = aligned_chunk(grid.lat_offsets), aligned_chunk(grid.lon_offsets)
    field = (len(layout.levels) if layout.upper_air else 1) * c_lat * c_lon * 4  # the largest variable
    budget = max(1, target // field)
    members = _divisor_within(members_per_rank, budget) if layout.members else 1
    inits = _divisor_within(batch, budget // members) if replicas == 1 else 1
    leads = max(1, min(len(layout.leads), budget // (members * inits)))
    return StoreChunks(inits, leads, members)


@contextmanager
def _progress_beside() -> Iterator[None]:
    """The store holds ``_progress`` beside its arrays while in progress: not a Zarr node, not news."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=f"Object at {PROGRESS} is not recognized")
        yield


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


class ForecastWriter:
    """Collective: every rank constructs it, writes its tiles, and calls ``close``. ``resume``: open
    the in-progress store an earlier run left (its layout is the request ``progress.py`` compared)
    instead of starting it; a new one replaces everything in it but ``_progress``. ``chunks``: along
    the init, lead and member axes (default one field a chunk)."""

    def __init__(
        self,
        path: str | Path,
        layout: ForecastLayout,
        grid: TileGrid,
        rank: int = 0,
        *,
        overwrite: bool = False,
        protected: tuple[tuple[str, str | Path | None], ...] = (),
        resume: bool = False,
        chunks: StoreChunks | None = None,
    ):
        self.bucket = is_object_url(str(path))  # written in place: ``bucket_output.py``
        self.path: Any = str(path).rstrip("/") if self.bucket else Path(path)
        self.layout, self.grid, self.rank = layout, grid, rank
        self.chunks = chunks or StoreChunks()
        self.overwrite, self.protected = overwrite, protected
        if not self.bucket:  # a bucket's was checked with its progress (``BucketProgress.check``)
            check_output(self.path, KIND, overwrite=overwrite, protected=protected)
        if (len(layout.latitude), len(layout.longitude)) != (grid.n_lat, grid.n_lon):
            raise ValueError(
                f"layout grid {len(layout.latitude)}x{len(layout.longitude)} does not match the model grid "
                f"{grid.n_lat}x{grid.n_lon}"
            )
        self.tmp = self.path if self.bucket else in_progress_path(self.path)
        root = zarr_object_store(self.path, read_only=False) if self.bucket else self.tmp
        self._root = root
        if rank == 0 and not resume:
            if not self.bucket and self.tmp.exists():  # a start cut short: all but the progress goes
                if not (self.tmp / PROGRESS).is_dir():
                    check_output(self.tmp, KIND, overwrite=True, option="the in-progress store")
                for entry in self.tmp.iterdir():
                    if entry.name != PROGRESS:
                        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            with _progress_beside():
                template = self._template()
                encoding = {name: {"compressors": None} for name in template.data_vars}
                template.to_zarr(root, mode="a", compute=False, zarr_format=3, consolidated=False,
                                 encoding=encoding)  # fmt: skip
        _barrier()
        self._arrays = {name: zarr.open_array(root, path=name, mode="r+") for name in self._variables()}

    @property
    def store(self) -> ForecastWriter:
        """The Zarr store the tiles go to (``formats.FileWriter``'s too): this writer."""
        return self

    def _variables(self) -> list[str]:
        return [*self.layout.upper_air, *self.layout.surface]

    def _template(self) -> xr.Dataset:
        lay, grid = self.layout, self.grid
        c_lat, c_lon = aligned_chunk(grid.lat_offsets), aligned_chunk(grid.lon_offsets)
        n_t, n_l, n_lev = len(lay.init_times), len(lay.leads), len(lay.levels)
        lead = ("time", "prediction_timedelta", *((MEMBER,) if lay.members else ()))
        sizes = (n_t, n_l, *((lay.members,) if lay.members else ()))
        k = self.chunks
        chunks = tuple(min(c, n) for c, n in zip((k.inits, k.leads, k.members), sizes))
        data_vars = {}
        for name in lay.upper_air:
            shape = (*sizes, n_lev, grid.n_lat, grid.n_lon)
            arr = da.full(shape, np.nan, dtype=np.float32, chunks=(*chunks, n_lev, c_lat, c_lon))
            data_vars[name] = ((*lead, "level", "latitude", "longitude"), arr)
        for name in lay.surface:
            shape = (*sizes, grid.n_lat, grid.n_lon)
            arr = da.full(shape, np.nan, dtype=np.float32, chunks=(*chunks, c_lat, c_lon))
            data_vars[name] = ((*lead, "latitude", "longitude"), arr)
        for name, (dims, arr) in data_vars.items():  # CF attributes: units as WB2 writes them
            data_vars[name] = xr.Variable(
                dims, arr, attrs={**CF_ATTRS.get(name, {}), "units": UNITS.get(name, "")}
            )
        coords = {
            "time": ("time", np.asarray(lay.init_times, dtype="datetime64[ns]"), COORD_ATTRS["time"]),
            "prediction_timedelta": (
                "prediction_timedelta",
                np.asarray(lay.leads, dtype="timedelta64[ns]"),
                COORD_ATTRS["prediction_timedelta"],
            ),
            "latitude": ("latitude", np.asarray(lay.latitude, dtype=np.float64), COORD_ATTRS["latitude"]),
            "longitude": ("longitude", np.asarray(lay.longitude, dtype=np.float64), COORD_ATTRS["longitude"]),
        }
        if lay.members:
            numbers = lay.first_member + np.arange(lay.members, dtype=np.int64)
            coords[MEMBER] = (MEMBER, numbers, COORD_ATTRS[MEMBER])
        if lay.upper_air:
            coords["level"] = ("level", np.asarray(sorted(lay.levels), dtype=np.int64), COORD_ATTRS["level"])
        attrs = {MARKER: {"kind": KIND, "complete": False}, "Conventions": "CF-1.8"}
        return xr.Dataset(data_vars, coords=coords, attrs=attrs)

    def write(
        self,
        inits: int | slice,
        leads: int | slice,
        fields: np.ndarray,
        tile: Tile,
        member: int | slice | None = None,
        variables: tuple[str, ...] | None = None,
    ) -> None:
        """Write this rank's tile of a block in physical units. ``fields`` is ``(…, channels, h,
        w)``: one leading axis for each of ``inits``, ``leads`` and ``member`` that is a slice, in
        that order (numpy's indexing rule: ``(channels, h, w)`` for one init and lead). ``member``:
        its number (``first_member`` … ``first_member + M − 1``, or a slice of them) for an ensemble
        store, None otherwise. ``variables``: only these of the layout's (default all). A slice
        covers whole chunks (or ends at the array's end), so concurrent writers never share one."""
        lay = self.layout
        if (member is None) != (not lay.members):
            raise ValueError(
                f"member {member} for a store with {lay.members or 'no'} members: pass the member "
                f"number exactly when the layout has members"
            )
        if isinstance(member, slice):
            member = slice(member.start - lay.first_member, member.stop - lay.first_member)
        elif member is not None:
            member = member - lay.first_member
        at = (inits, leads) if member is None else (inits, leads, member)
        sizes = (len(lay.init_times), len(lay.leads), lay.members)
        lengths = tuple(i.stop - i.start for i in at if isinstance(i, slice))
        channels = lay.channels
        if fields.shape != (*lengths, len(channels), *tile.shape):
            raise ValueError(
                f"forecast tile has shape {fields.shape}, expected {(*lengths, len(channels), *tile.shape)} "
                f"(channels {channels[:3]}...)"
            )
        chunks = (self.chunks.inits, self.chunks.leads, self.chunks.members)
        for index, chunk, size in zip(at, chunks, sizes):
            ragged = isinstance(index, slice) and (index.stop % chunk and index.stop != size)
            if isinstance(index, slice) and (index.start % chunk or ragged):
                raise ValueError(f"block {index} is not whole chunks of {chunk}: writers would share a chunk")
        rows, cols = tile.slices
        n_lev, k = len(lay.levels), 0
        c = (slice(None),) * len(lengths)  # the block's leading axes
        for name in lay.upper_air:
            if variables is None or name in variables:
                self._arrays[name][(*at, slice(None), rows, cols)] = fields[(*c, slice(k, k + n_lev))]
            k += n_lev
        for name in lay.surface:
            if variables is None or name in variables:
                self._arrays[name][(*at, rows, cols)] = fields[(*c, k)]
            k += 1

    def close(self, request: dict[str, Any] | None = None, stop: Any = None) -> Path | str:
        """Collective: wait for every rank, then publish the store (rank 0 renames) with ``request``
        (what was forecast: ``inference/rerun.py``) in its marker. ``stop``: unused (nothing is converted)."""
        _barrier()
        if self.rank == 0:
            group = zarr.open_group(self._root, mode="r+")
            marker: dict[str, Any] = {"kind": KIND, "complete": True}
            if request is not None:
                marker["request"] = request
            group.attrs[MARKER] = marker
            with _progress_beside():  # consolidated metadata is not in the v3 spec (yet): xarray reads it
                warnings.filterwarnings("ignore", message="Consolidated metadata")
                zarr.consolidate_metadata(self._root)
            if self.bucket:  # in place: complete once its marker says so (``bucket_output.py``)
                log.info("wrote forecast store %s", self.path)
                _barrier()
                return self.path
            # the path may have changed since the start: the same rule again, just before replacing
            check_output(self.path, KIND, overwrite=self.overwrite, protected=self.protected)
            if self.path.exists():
                old = unique_tmp(self.path)
                self.path.rename(old)
                self.tmp.rename(self.path)
                shutil.rmtree(old, ignore_errors=True)
            else:
                self.tmp.rename(self.path)
            shutil.rmtree(self.path / PROGRESS, ignore_errors=True)
            log.info("wrote forecast store %s", self.path)
        _barrier()
        return self.path

    def abort(self) -> None:
        """Rank 0 removes the in-progress store (after a failure on any rank); never the target."""
        if self.rank == 0 and not self.bucket:
            shutil.rmtree(self.tmp, ignore_errors=True)
