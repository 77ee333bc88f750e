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

from jigsaw_earth.distributed.halo import Halo
from jigsaw_earth.distributed.mesh import MeshShape
from jigsaw_earth.distributed.tiles import TileGrid

from .batch import VariableSpec
from .reader import TileReader
from .sampler import find_gaps, native_step
from .store import StoreView

__all__ = ["inspect_store", "io_report", "throughput"]

log = logging.getLogger(__name__)


def inspect_store(path: str, names: dict[str, str] | None = None, nan_scan: str = "sample") -> dict[str, Any]:
    """Variables, levels, grid, latitude order, times, chunking, gaps and NaNs of a store."""
    view = StoreView.open(path, names=names)
    ds = view.dataset
    t = view.times
    step = native_step(t) if len(t) > 1 else None
    gaps = find_gaps(t) if len(t) > 2 else []
    variables = []
    for v in view.available():
        da, arr = ds[v], view.array(v)
        entry: dict[str, Any] = {"name": v, "dims": list(view.dims(v)), "shape": list(da.shape),
                                 "dtype": str(da.dtype), "chunks": list(arr.chunks),
                                 "shards": list(arr.shards) if getattr(arr, "shards", None) else None}
        if nan_scan != "none":
            sample = da if nan_scan == "full" or "time" not in da.dims else da.isel(
                {view.coord_names["time"]: np.unique(np.linspace(0, len(t) - 1, 5).astype(int))})
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    entry["nans"] = int(np.isnan(np.asarray(sample.values, dtype=np.float64)).sum())
                except (ValueError, RuntimeError, OSError) as err:  # a damaged or truncated chunk
                    reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
                    raise ValueError(
                        f"store {str(path)!r}: variable {v!r} cannot be read ({reason}); a chunk is "
                        f"damaged or truncated — re-write the store (data prepare / data synth --overwrite) "
                        f"or restore it from a copy"
                    ) from None
        variables.append(entry)
    lat_raw = np.asarray(ds[view.coord_names["latitude"]].values)
    info = view.group.attrs.get("jigsaw_earth") if view.group is not None else None
    return {
        "path": str(path),
        "variables": variables,
        "levels": None if view.levels is None else [float(x) for x in view.levels],
        "grid": {"n_lat": len(view.lat), "n_lon": len(view.lon),
                 "lat": [float(view.lat[0]), float(view.lat[-1])],
                 "lon": [float(view.lon[0]), float(view.lon[-1])],
                 "latitude_order": "descending" if lat_raw[0] > lat_raw[-1] else "ascending",
                 "dims_order": {v["name"]: v["dims"] for v in variables}},
        "time": {"start": str(t[0])[:19], "end": str(t[-1])[:19], "count": len(t),
                 "step_hours": None if step is None else float(step / np.timedelta64(1, "h")),
                 "gaps": [[str(a)[:19], str(b)[:19]] for a, b in gaps]},
        "nan_scan": nan_scan,
        "complete": None if not isinstance(info, dict) else info.get("complete"),
        "names": {k: v for k, v in view.coord_names.items()},
    }


def _tile_reader(path: str, spec: VariableSpec, mesh: MeshShape, k: int, halo: Halo,
                 names: dict[str, str] | None) -> TileReader:
    view = StoreView.open(path, names=names, count=True)
    return TileReader.for_rank(view, spec, mesh.lat, mesh.lon, k, halo)


def io_report(path: str, mesh: MeshShape, spec: VariableSpec, halo: Halo, lead_steps: int = 1,
              step_hours: int = 6, time_index: int = 0,
              names: dict[str, str] | None = None) -> dict[str, Any]:
    """Bytes each rank of ``mesh`` reads from storage for one sample, against the whole sample."""
    full = _tile_reader(path, spec, MeshShape(1, 1, 1), 0, Halo(), names)
    stride = int(np.timedelta64(step_hours, "h") / native_step(full.view.times))
    targets = time_index + stride * np.arange(1, lead_steps + 1)
    if targets[-1] >= len(full.view.times):
        raise ValueError(f"time index {time_index} + {lead_steps} lead steps runs past the store's "
                         f"{len(full.view.times)} times; choose an earlier --time-index")
    store = full.view.store
    store.reset()
    full.read_sample(time_index, targets)
    full_bytes = store.bytes_read
    ranks = []
    grid = TileGrid(*full.view.grid_shape, mesh.lat, mesh.lon)
    for k in range(grid.n_tiles):
        reader = _tile_reader(path, spec, mesh, k, halo, names)
        reader.view.store.reset()
        reader.read_sample(time_index, targets)
        tile = grid.tile_of(k)
        h, w = tile.shape
        padded = (h + sum(halo.lat)) * (w + sum(halo.lon))
        exact = (padded + lead_steps * h * w) / ((1 + lead_steps) * grid.n_lat * grid.n_lon)
        ranks.append({"rank": k, "tile": [tile.lat_start, tile.lat_stop, tile.lon_start, tile.lon_stop],
                      "bytes_read": reader.view.store.bytes_read, "requests": reader.view.store.requests,
                      "fraction": reader.view.store.bytes_read / full_bytes, "ideal_fraction": exact})
    n = mesh.lat * mesh.lon
    halo_frac = max(r["ideal_fraction"] for r in ranks) - 1.0 / n
    return {"store": path, "mesh": f"{mesh.lat}x{mesh.lon}", "halo": [list(halo.lat), list(halo.lon),
                                                                      halo.lat_mode],
            "lead_steps": lead_steps, "channels": spec.n_channels,
            "sample_bytes_uncompressed": full.sample_bytes(1 + lead_steps), "sample_bytes_read": full_bytes,
            "ranks": ranks, "max_fraction": max(r["fraction"] for r in ranks),
            "bound": 1.0 / n + halo_frac + 0.10}


def throughput(path: str, mesh: MeshShape, spec: VariableSpec, halo: Halo, samples: int = 20,
               lead_steps: int = 1, step_hours: int = 6,
               names: dict[str, str] | None = None) -> dict[str, Any]:
    """Samples/s of rank 0's tile reader against xarray (whole fields, then slicing), same times."""
    reader = _tile_reader(path, spec, mesh, 0, halo, names)
    times = reader.view.times
    stride = int(np.timedelta64(step_hours, "h") / native_step(times))
    idx = np.linspace(0, len(times) - 1 - stride * lead_steps, samples).astype(int)
    lead = stride * np.arange(1, lead_steps + 1)
    reader.read_sample(int(idx[-1]), idx[-1] + lead)  # warm-up: event loop, metadata
    t0 = time.perf_counter()
    for t in idx:
        reader.read_sample(int(t), t + lead)
    tile_rate = samples / (time.perf_counter() - t0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = xr.open_zarr(path, chunks=None, consolidated=None)
    rows = np.array([r for pos, src, cols in reader._groups for r in src])
    tile = reader.tile
    ds["time"].values  # noqa: B018  warm-up: coordinates
    t0 = time.perf_counter()
    for t in idx:
        parts = []
        for v in spec.upper_air:
            parts.append(ds[v].isel(time=[int(t), *(t + lead)]).sel(level=list(spec.levels)).values)
        for v in spec.surface:
            parts.append(ds[v].isel(time=[int(t), *(t + lead)]).values[:, None])
        whole = np.concatenate(parts, axis=1)
        cols = np.arange(tile.lon_start - halo.lon[0], tile.lon_stop + halo.lon[1]) % whole.shape[-1]
        _x = whole[0][:, np.clip(rows, 0, None)][:, :, cols]
        _y = whole[1:, :, tile.lat_start : tile.lat_stop, tile.lon_start : tile.lon_stop]
    xr_rate = samples / (time.perf_counter() - t0)
    return {"store": path, "mesh": f"{mesh.lat}x{mesh.lon}", "samples": samples,
            "tile_reader_samples_per_s": tile_rate, "xarray_full_then_slice_samples_per_s": xr_rate,
            "speedup": tile_rate / xr_rate}
