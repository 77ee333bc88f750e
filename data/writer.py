"""Writing stores in the training layout: chunk/shard layout, atomic output, completion marker.

A store is written to ``DST.tmp-<random token>`` and renamed to ``DST`` only when complete; the root
group's ``jigsaw_earth`` attribute records ``complete: true`` (written last). A crash mid-way
therefore leaves only a ``.tmp-`` folder that no reader accepts.

Layout: every variable is ``(time, [level], latitude, longitude)`` with latitude descending,
levels ascending (WB2). Inner chunks are ``(1, all levels, lat_chunk, lon_chunk)``; Zarr v3
shards group ``time_shard`` times and ``lat_shard × lon_shard`` cells into one object.
"""

from __future__ import annotations

import logging
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BloscCodec, ZstdCodec

from jigsaw_earth.argtypes import parse_grid
from jigsaw_earth.distributed.mesh import MeshShape
from jigsaw_earth.distributed.tiles import TileGrid
from jigsaw_earth.ownership import MARKER, check_output, unique_tmp

__all__ = ["COMPRESSIONS", "ChunkLayout", "atomic_store", "create_variable", "mark_complete", "write_coords"]

log = logging.getLogger(__name__)
EPOCH = np.datetime64("1970-01-01T00:00:00", "s")
#: chunk compression of written stores: none (memory-mapped reads), zstd level 1, blosc lz4 + byte shuffle
COMPRESSIONS = {
    "none": lambda: [],
    "zstd": lambda: [ZstdCodec(level=1)],
    "lz4": lambda: [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle", typesize=4)],
}


def _chunk_for_tiles(n: int, tile_sizes: list[int], per_tile: int) -> int:
    """Chunk length along an axis split into ``tile_sizes`` (see ``for_mesh``): the length from
    half to 1.5 times the target whose chunk edges hit the most tile edges, then the closest."""
    size = max(tile_sizes)
    target = min(size, max(4, -(-size // per_tile)))
    edges = np.cumsum(tile_sizes)[:-1]
    candidates = range(min(size, max(4, target // 2)), min(size, target + target // 2) + 1)
    return min(candidates, key=lambda c: (int(np.count_nonzero(edges % c)), abs(c - target)))


@dataclass(frozen=True)
class ChunkLayout:
    """Chunk and shard sizes; 0 means the whole axis."""

    lat_chunk: int = 0
    lon_chunk: int = 0
    lat_shard: int = 0
    lon_shard: int = 0
    time_shard: int = 1
    compression: str = "zstd"  # one of COMPRESSIONS

    @classmethod
    def parse(cls, chunk: str | None, shard: str | None, time_shard: int = 1) -> ChunkLayout:
        def pair(text: str | None, what: str) -> tuple[int, int]:  # 0: the whole axis
            return parse_grid(text, what, example="8x16", minimum=0) if text else (0, 0)

        return cls(*pair(chunk, "--chunk"), *pair(shard, "--shard"), time_shard=time_shard)

    def __post_init__(self) -> None:
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"--compression {self.compression!r}: choose one of {', '.join(COMPRESSIONS)}")

    def compressors(self) -> list[Any]:
        """The zarr v3 bytes→bytes codecs of ``compression`` (read costs in docs/data.md)."""
        return COMPRESSIONS[self.compression]()

    @classmethod
    def for_mesh(
        cls, n_lat: int, n_lon: int, mesh: MeshShape, per_tile: int = 16, time_shard: int = 1
    ) -> ChunkLayout:
        """Tile-following, for what training reads (a tile, no halo: the layers exchange halos):
        chunks as wide as a tile (longitude 1/1, else 1/2 or 1/4 of a tile where that puts chunk
        edges on every tile edge) and ~1/``per_tile`` of a tile high (at least 4 rows unless the
        tile is smaller), shards one tile. A shard's chunks then lie in the file in the tile's own
        row order, so a rank's read is one contiguous run per level and time: docs/data.md measured
        it within 1.2× of a raw read, where 1/16 × 1/16 chunks (short rows in Morton order) took 2.2×.
        Among chunk heights from half to 1.5 times the target, one whose edges fall on the tile
        edges wins where one exists (721 rows in 2 tiles: 19); otherwise a ragged chunk at a tile's
        edge is read partly by two tiles (at most one chunk row per edge). Instant.
        """
        grid = TileGrid(n_lat, n_lon, mesh.lat, mesh.lon)
        c_lat = _chunk_for_tiles(n_lat, grid.lat_sizes, per_tile)
        c_lon = next(
            (
                c
                for c in (_chunk_for_tiles(n_lon, grid.lon_sizes, k) for k in (1, 2, 4))
                if not (np.cumsum(grid.lon_sizes)[:-1] % c).any()
            ),
            _chunk_for_tiles(n_lon, grid.lon_sizes, 4),
        )
        s_lat, s_lon = max(grid.lat_sizes), max(grid.lon_sizes)
        return cls(
            c_lat,
            c_lon,
            max(c_lat, round(s_lat / c_lat) * c_lat),
            max(c_lon, round(s_lon / c_lon) * c_lon),
            time_shard,
        )

    def shapes(
        self, n_time: int, n_level: int | None, n_lat: int, n_lon: int
    ) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
        """(chunks, shards or None) for a variable of that size."""
        c_lat, c_lon = self.lat_chunk or n_lat, self.lon_chunk or n_lon
        s_lat = max(c_lat, (self.lat_shard or n_lat) // c_lat * c_lat)
        s_lon = max(c_lon, (self.lon_shard or n_lon) // c_lon * c_lon)
        t_shard = max(1, min(self.time_shard, n_time))
        lev = () if n_level is None else (n_level,)
        chunks = (1, *lev, min(c_lat, n_lat), min(c_lon, n_lon))
        shards = (t_shard, *lev, min(s_lat, n_lat), min(s_lon, n_lon))
        if shards == chunks:
            return chunks, None
        # a shard must be a whole number of chunks
        shards = tuple(s if s % c == 0 else (s // c) * c or c for s, c in zip(shards, chunks))
        return chunks, shards

    def describe(self) -> dict[str, Any]:
        return asdict(self)


@contextmanager
def atomic_store(
    dst: str | Path,
    overwrite: bool = False,
    *,
    kind: str = "store",
    protected: tuple[tuple[str, str | Path | None], ...] = (),
) -> Iterator[Path]:
    """Yield a temporary path next to ``dst``; rename it to ``dst`` on success, delete on error.

    ``dst`` is checked first (``outputs.check_output``): an existing one is replaced only if it is
    empty or a ``kind`` store of jigsaw-earth, never one of ``protected``.
    """
    check_output(dst, kind, overwrite=overwrite, protected=protected)
    dst = Path(dst)
    tmp = unique_tmp(dst)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if dst.exists():
        check_output(dst, kind, overwrite=overwrite, protected=protected)  # again, just before replacing
        old = unique_tmp(dst, "replaced-" + tmp.name.rsplit("-", 1)[-1])
        dst.rename(old)
        tmp.rename(dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(dst)
    log.info("wrote %s", dst)


def write_coords(
    group: Any, times: np.ndarray, levels: np.ndarray | None, lat: np.ndarray, lon: np.ndarray
) -> None:
    """Coordinate arrays that xarray decodes (time as hours since 1970 with CF units)."""
    hours = ((np.asarray(times).astype("datetime64[s]") - EPOCH) // np.timedelta64(1, "h")).astype(np.int64)
    group.create_array(
        "time",
        data=hours,
        chunks=(max(1, len(hours)),),
        dimension_names=["time"],
        attributes={
            "units": "hours since 1970-01-01",
            "calendar": "proleptic_gregorian",
            "standard_name": "time",
        },
    )
    if levels is not None:
        group.create_array(
            "level",
            data=np.asarray(levels, dtype=np.int64),
            dimension_names=["level"],
            attributes={"units": "hPa", "long_name": "pressure level"},
        )
    group.create_array(
        "latitude",
        data=np.asarray(lat, dtype=np.float64),
        dimension_names=["latitude"],
        attributes={"units": "degrees_north"},
    )
    group.create_array(
        "longitude",
        data=np.asarray(lon, dtype=np.float64),
        dimension_names=["longitude"],
        attributes={"units": "degrees_east"},
    )


def create_variable(
    group: Any,
    name: str,
    shape: tuple[int, ...],
    dims: list[str],
    layout: ChunkLayout,
    attrs: dict[str, Any] | None = None,
) -> Any:
    """An empty float32 variable with the layout's chunks and shards (NaN fill)."""
    if "time" in dims:
        n_level = shape[1] if "level" in dims else None
        chunks, shards = layout.shapes(shape[0], n_level, shape[-2], shape[-1])
    else:
        chunks, shards = tuple(shape), None
    return group.create_array(
        name,
        shape=shape,
        dtype="float32",
        chunks=chunks,
        shards=shards,
        fill_value=np.nan,
        dimension_names=dims,
        attributes=attrs or {},
        compressors=layout.compressors() or None,
    )


def mark_complete(path: Path, kind: str = "store", **info: Any) -> None:
    """Record kind, completeness (and provenance) in the root attributes: the last thing written."""
    group = zarr.open_group(path, mode="r+")
    group.attrs[MARKER] = {"kind": kind, "complete": True, **info}
    with warnings.catch_warnings():  # consolidated metadata is not in the v3 spec (yet): xarray reads it
        warnings.filterwarnings("ignore", message="Consolidated metadata")
        zarr.consolidate_metadata(path)  # xarray opens it without listing every array
