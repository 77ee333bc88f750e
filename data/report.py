"""``data inspect`` and ``data io-report``: what a store holds, and what each rank reads from it.

``io_report`` opens the store once per rank of the mesh through a ``CountingStore``, reads one
sample (inputs with halo at ``t``, targets at the lead times, tile only) and records the bytes
the store returned, against the bytes a read of the whole sample returns through the same
counting store (what every rank of a tensor-parallel system reads). ``throughput`` times the
tile reader against a plain xarray read of the whole fields followed by slicing.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

import numpy as np
import xarray as xr
from jigsaw_earth.data.batch import VariableSpec
from jigsaw_earth.data.integrity import missing_files, read_values
from jigsaw_earth.data.reader import TileReader
from jigsaw_earth.data.store import StoreView
from jigsaw_earth.data.times import TimeAxis, sample_index

from jigsaw_earth.distributed.halo import Halo
from jigsaw_earth.distributed.mesh import MeshShape
from jigsaw_earth.distributed.tiles import TileGrid

__all__ = ["OVER_READ_WARNING", "inspect_store", "io_report", "planned_fraction", "throughput"]

#: a rank reading more than this multiple of its exact share (tile + halo) gets a warning
OVER_READ_WARNING = 1.3

log = logging.getLogger(__name__)


def inspect_store(path: str, names: dict[str, str] | None = None, nan_scan: str = "sample") -> dict[str, Any]:
    """Variables, levels, grid, latitude order, times, chunking, gaps and NaNs of a store."""
    view = StoreView.open(path, names=names)
    ds = view.dataset
    t = view.times
    axis = TimeAxis.of(t)
    step = axis.step_hours if len(t) > 1 else None
    gaps = axis.gaps if len(t) > 2 else []
    irregular = axis.irregular if len(t) > 2 else []
    variables = []
    for v in view.available():
        da, arr = ds[v], view.array(v)
        entry: dict[str, Any] = {
            "name": v,
            "dims": list(view.dims(v)),
            "shape": list(da.shape),
            "dtype": str(da.dtype),
            "chunks": list(arr.chunks),
            "shards": list(arr.shards) if getattr(arr, "shards", None) else None,
        }
        why = missing_files(view, v)
        if why is not None:  # its values would read as NaN: not a NaN count, a broken store
            raise ValueError(f"store {str(path)!r}: {why}")
        if nan_scan != "none":
            sample = (
                da
                if nan_scan == "full" or "time" not in da.dims
                else da.isel({view.coord_names["time"]: np.unique(np.linspace(0, len(t) - 1, 5).astype(int))})
            )
            entry["nans"] = int(np.isnan(read_values(view, v, sample)).sum())  # a damaged chunk: named
        variables.append(entry)
    lat_raw = np.asarray(ds[view.coord_names["latitude"]].values)
    info = view.group.attrs.get("jigsaw_earth") if view.group is not None else None
    return {
        "path": str(path),
        "variables": variables,
        "levels": None if view.levels is None else [float(x) for x in view.levels],
        "grid": {
            "n_lat": len(view.lat),
            "n_lon": len(view.lon),
            "lat": [float(view.lat[0]), float(view.lat[-1])],
            "lon": [float(view.lon[0]), float(view.lon[-1])],
            "latitude_order": "descending" if lat_raw[0] > lat_raw[-1] else "ascending",
            "dims_order": {v["name"]: v["dims"] for v in variables},
        },
        "time": {
            "start": str(t[0])[:19],
            "end": str(t[-1])[:19],
            "count": len(t),
            "step_hours": step,
            "gaps": [[str(a)[:19], str(b)[:19]] for a, b in gaps],
            "missing_times": axis.missing_times() if len(t) > 2 else 0,
            "irregular": [[str(t[i])[:19], str(t[i + 1])[:19]] for i in irregular],
            "spacing_hours": axis.histogram() if len(t) > 1 else {},
        },
        "nan_scan": nan_scan,
        "complete": None if not isinstance(info, dict) else info.get("complete"),
        "names": {k: v for k, v in view.coord_names.items()},
    }


def _tile_reader(
    path: str, spec: VariableSpec, mesh: MeshShape, k: int, halo: Halo, names: dict[str, str] | None
) -> TileReader:
    view = StoreView.open(path, names=names, count=True)
    return TileReader.for_rank(view, spec, mesh.lat, mesh.lon, k, halo)


def _chunk_cells(sizes: dict[str, int], chunks: dict[str, int], rows: np.ndarray, cols: np.ndarray) -> set:
    """(row chunk, column chunk) pairs touched by storage ``rows`` × ``cols``."""
    rc = np.unique(rows // chunks["latitude"])
    cc = np.unique(cols // chunks["longitude"])
    return {(int(r), int(c)) for r in rc for c in cc}


def _cells(sizes: dict[str, int], chunks: dict[str, int], pairs: set) -> int:
    """Grid cells of the (row chunk, column chunk) ``pairs`` (edge chunks may be ragged)."""
    cl, cc = chunks["latitude"], chunks["longitude"]
    return sum(min(cl, sizes["latitude"] - r * cl) * min(cc, sizes["longitude"] - k * cc) for r, k in pairs)


def planned_fraction(reader: TileReader, lead_steps: int) -> float:
    """Fraction of a whole sample's chunk cells (inputs with halo + ``lead_steps`` targets) that
    this reader's chunks cover: the layout's cost from metadata alone (no data read; shard
    indexes and compression ignored)."""
    view, tile = reader.view, reader.tile
    read = whole = 0.0
    for _, name, levels in reader.fields:
        arr = view.array(name)
        dims = view.dims(name)
        sizes, chunks = dict(zip(dims, arr.shape)), dict(zip(dims, arr.chunks))
        if levels is None:
            n_lev = 1
        else:
            c = chunks["level"]
            n_lev = sum(min(c, sizes["level"] - k * c) for k in np.unique(np.asarray(levels) // c))

        inputs: set = set()
        for _, src, cols in reader._groups:
            ok_r, ok_c = src[src >= 0], cols[cols >= 0]
            inputs |= _chunk_cells(sizes, chunks, view.lat_storage[ok_r], view.lon_storage[ok_c])
        targets = _chunk_cells(
            sizes,
            chunks,
            view.lat_storage[tile.lat_start : tile.lat_stop],
            view.lon_storage[tile.lon_start : tile.lon_stop],
        )
        read += n_lev * (_cells(sizes, chunks, inputs) + lead_steps * _cells(sizes, chunks, targets))
        whole += n_lev * (1 + lead_steps) * sizes["latitude"] * sizes["longitude"]
    return read / whole


def io_report(
    path: str,
    mesh: MeshShape,
    spec: VariableSpec,
    halo: Halo,
    lead_steps: int = 1,
    step_hours: int = 6,
    time_index: int = 0,
    names: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Bytes each rank of ``mesh`` reads from storage for one sample, against the whole sample."""
    full = _tile_reader(path, spec, MeshShape(1, 1, 1), 0, Halo(), names)
    n_times = len(full.view.times)
    if not 0 <= time_index < n_times:
        raise ValueError(
            f"--time-index {time_index} is outside the store's {n_times} times; choose one in "
            f"[0, {n_times - 1}]"
        )
    inits, found = sample_index(
        full.view.times, np.array([time_index]), step_hours, lead_steps, True, f"store {path!r}", "io-report"
    )
    if not len(inits):
        raise ValueError(
            f"time index {time_index} has no {lead_steps} target(s) {step_hours} h later in the "
            f"store's {len(full.view.times)} times; choose another --time-index"
        )
    targets = found[0]
    full.reset_counts()
    full.read_sample(time_index, targets)
    full_bytes = full.bytes_read
    ranks = []
    grid = TileGrid(*full.view.grid_shape, mesh.lat, mesh.lon)
    for k in range(grid.n_tiles):
        reader = _tile_reader(path, spec, mesh, k, halo, names)
        reader.reset_counts()
        reader.read_sample(time_index, targets)
        tile = grid.tile_of(k)
        h, w = tile.shape
        padded = (h + sum(halo.lat)) * (w + sum(halo.lon))
        exact = (padded + lead_steps * h * w) / ((1 + lead_steps) * grid.n_lat * grid.n_lon)
        ranks.append(
            {
                "rank": k,
                "tile": [tile.lat_start, tile.lat_stop, tile.lon_start, tile.lon_stop],
                "bytes_read": reader.bytes_read,
                "requests": reader.requests,
                "fraction": reader.bytes_read / full_bytes,
                "ideal_fraction": exact,
                "planned_fraction": planned_fraction(reader, lead_steps),
            }
        )
    n = mesh.lat * mesh.lon
    halo_frac = max(r["ideal_fraction"] for r in ranks) - 1.0 / n
    return {
        "store": path,
        "mesh": f"{mesh.lat}x{mesh.lon}",
        "halo": [list(halo.lat), list(halo.lon), halo.lat_mode],
        "lead_steps": lead_steps,
        "channels": spec.n_channels,
        "sample_bytes_uncompressed": full.sample_bytes(1 + lead_steps),
        "sample_bytes_read": full_bytes,
        "ranks": ranks,
        "max_fraction": max(r["fraction"] for r in ranks),
        "bound": 1.0 / n + halo_frac + 0.10,
        "warning": _over_read(path, mesh, ranks),
    }


def _over_read(path: str, mesh: MeshShape, ranks: list[dict[str, Any]]) -> str | None:
    """A warning naming the fix when a rank reads more than ``OVER_READ_WARNING`` × its share."""
    worst = max(ranks, key=lambda r: r["fraction"] / r["ideal_fraction"])
    ratio = worst["fraction"] / worst["ideal_fraction"]
    if ratio <= OVER_READ_WARNING:
        return None
    return (
        f"rank {worst['rank']} reads {ratio:.2f}x its tile + halo ({worst['fraction']:.3f} of a sample, "
        f"exact share {worst['ideal_fraction']:.3f}): the store's chunks do not follow the "
        f"{mesh.lat}x{mesh.lon} tiles. Rewrite it tile-aligned: jigsaw-earth data prepare {path} "
        f"--out DST --for-mesh {mesh.lat}x{mesh.lon}"
    )


def throughput(
    path: str,
    mesh: MeshShape,
    spec: VariableSpec,
    halo: Halo,
    samples: int = 20,
    lead_steps: int = 1,
    step_hours: int = 6,
    names: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Samples/s of rank 0's tile reader against xarray (whole fields, then slicing), same times."""
    reader = _tile_reader(path, spec, mesh, 0, halo, names)
    times = reader.view.times
    inits, targets = sample_index(
        times, np.arange(len(times)), step_hours, lead_steps, True, f"store {path!r}", "benchmark"
    )
    pick = np.linspace(0, len(inits) - 1, samples).astype(int)
    idx, tgt = inits[pick], targets[pick]
    reader.read_sample(int(idx[-1]), tgt[-1])  # warm-up: event loop, metadata
    t0 = time.perf_counter()
    for t, ts in zip(idx, tgt):
        reader.read_sample(int(t), ts)
    tile_rate = samples / (time.perf_counter() - t0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = xr.open_zarr(path, chunks=None, consolidated=None)
    rows = np.array([r for pos, src, cols in reader._groups for r in src])
    tile = reader.tile
    ds["time"].values  # noqa: B018  warm-up: coordinates
    t0 = time.perf_counter()
    for t, ts in zip(idx, tgt):
        parts = []
        for v in spec.upper_air:
            parts.append(ds[v].isel(time=[int(t), *ts]).sel(level=list(spec.levels)).values)
        for v in spec.surface:
            parts.append(ds[v].isel(time=[int(t), *ts]).values[:, None])
        whole = np.concatenate(parts, axis=1)
        cols = np.arange(tile.lon_start - halo.lon[0], tile.lon_stop + halo.lon[1]) % whole.shape[-1]
        _x = whole[0][:, np.clip(rows, 0, None)][:, :, cols]
        _y = whole[1:, :, tile.lat_start : tile.lat_stop, tile.lon_start : tile.lon_stop]
    xr_rate = samples / (time.perf_counter() - t0)
    return {
        "store": path,
        "mesh": f"{mesh.lat}x{mesh.lon}",
        "samples": samples,
        "tile_reader_samples_per_s": tile_rate,
        "xarray_full_then_slice_samples_per_s": xr_rate,
        "speedup": tile_rate / xr_rate,
    }
