"""Normalisation statistics: per variable and level, over a training period, computed with dask.

Stored next to the data, in the store's ``statistics`` group (WB2 names, dims ``(stat, [level])``
with ``stat = mean, std, diff_mean, diff_std``; ``diff_*`` are of 1-step differences, for
residual targets). Static variables get the spatial mean and std. The group's attributes record
the period and the grid, so statistics from another grid are refused.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
import numpy as np
import xarray as xr
from dask.callbacks import Callback
from jigsaw_earth.data.batch import VariableSpec
from jigsaw_earth.data.store import StoreView, open_store
from tqdm.auto import tqdm

__all__ = [
    "STATS",
    "Normalizer",
    "RunningStats",
    "TqdmCallback",
    "compute_statistics",
    "read_statistics",
    "write_statistics",
]

log = logging.getLogger(__name__)
STATS = ("mean", "std", "diff_mean", "diff_std")
GROUP = "statistics"


class TqdmCallback(Callback):
    """A tqdm progress bar over the tasks of a dask computation."""

    def __init__(self, desc: str = "", disable: bool | None = None):
        super().__init__()
        self.desc, self.disable, self.bar = desc, disable, None

    def _start_state(self, dsk: Any, state: Any) -> None:
        total = sum(len(state[k]) for k in ("ready", "waiting", "running", "finished"))
        self.bar = tqdm(total=total, desc=self.desc, unit="task", disable=self.disable, leave=False)

    def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def _finish(self, dsk: Any, state: Any, errored: bool) -> None:
        if self.bar is not None:
            self.bar.close()


def _grid_attrs(ds: xr.Dataset, lat: str = "latitude", lon: str = "longitude") -> dict[str, Any]:
    la, lo = ds[lat].values, ds[lon].values
    return {
        "n_lat": len(la),
        "n_lon": len(lo),
        "lat_range": [float(la.max()), float(la.min())],
        "lon_range": [float(lo.min()), float(lo.max())],
    }


def _time_chunk(ds: xr.Dataset, target_bytes: int = 64 << 20) -> int:
    """Dask time chunk: a multiple of the stored time shard holding about ``target_bytes``."""
    per_time = sum(
        da.dtype.itemsize * da.size // max(da.sizes.get("time", 1), 1)
        for da in ds.data_vars.values()
        if "time" in da.dims
    )
    stored = max(
        [
            da.encoding.get("shards") or da.encoding.get("chunks") or (1,)
            for da in ds.data_vars.values()
            if "time" in da.dims
        ]
        or [(1,)],
        key=lambda c: c[0],
    )[0]
    n = max(1, target_bytes // max(per_time, 1) // stored) * stored
    return int(min(n, ds.sizes["time"]))


def compute_statistics(
    path: str | Path, period: tuple[str, str] | None = None, progress: bool = False
) -> xr.Dataset:
    """Statistics of every data variable of a WB2-named store over ``period`` (inclusive)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meta = xr.open_zarr(open_store(path), chunks=None)
        # whole fields per dask chunk: the store's inner chunks (tile-aligned, small) would make a
        # graph of ~1000 tasks per time (181x360 for a 2x2 mesh: 107 s of graph overhead for 3 times)
        chunks = {d: -1 for d in meta.dims if d != "time"}
        if "time" in meta.dims:
            chunks["time"] = _time_chunk(meta)
        ds = xr.open_zarr(open_store(path), chunks=chunks)
    if period is not None:
        ds = ds.sel(time=slice(*period))
        if ds.sizes.get("time", 0) < 2:
            raise ValueError(
                f"statistics period {period} holds {ds.sizes.get('time', 0)} times of "
                f"{path}; choose a period with at least 2 times"
            )
    out: dict[str, xr.DataArray] = {}
    for name, da in ds.data_vars.items():
        space = [d for d in ("latitude", "longitude") if d in da.dims]
        if "time" in da.dims:
            dims = ["time", *space]
            diff = da.diff("time")
            parts = [da.mean(dims), da.std(dims), diff.mean(dims), diff.std(dims)]
        else:
            parts = [da.mean(space), da.std(space), 0.0 * da.mean(space), 0.0 * da.mean(space)]
        out[str(name)] = xr.concat(parts, dim="stat").assign_coords(stat=list(STATS))
    stats = xr.Dataset(out)
    with TqdmCallback("statistics", disable=not progress):
        stats = dask.compute(stats)[0]
    t = ds["time"].values
    stats.attrs = {"period": [str(t[0])[:19], str(t[-1])[:19]], **_grid_attrs(ds)}
    for name, da in stats.data_vars.items():
        bad = np.argwhere(~np.isfinite(da.values))
        if len(bad):
            raise ValueError(
                f"statistics of {name!r} are not finite (NaNs in the data over "
                f"{stats.attrs['period']}); run `jigsaw-earth data inspect` to find them"
            )
    return stats


def write_statistics(path: str | Path | Any, stats: xr.Dataset) -> None:
    """Write ``stats`` into the store's ``statistics`` group (``path``: a path, URL or zarr store).

    String coordinates (``stat``) are written as variable-length UTF-8, the string type Zarr v3
    specifies, not numpy's fixed-length UTF-32 (which zarr warns about on every read)."""
    text = {k: stats[k].values.astype(object) for k in stats.coords if stats[k].dtype.kind == "U"}
    stats = stats.assign_coords(text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        store = open_store(path, read_only=False) if isinstance(path, str | Path) else path
        stats.to_zarr(store, group=GROUP, mode="w", zarr_format=3, consolidated=False)


def read_statistics(path: str | Path) -> xr.Dataset:
    """The statistics of a store (``path`` is the store, or a separate statistics store)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        store = open_store(path)
        for group in (GROUP, None):
            try:
                ds = xr.open_zarr(store, group=group, chunks=None, consolidated=False)
            except (FileNotFoundError, KeyError, OSError):
                continue
            if "stat" in ds.dims:
                return ds.load()
    raise FileNotFoundError(
        f"no statistics in {str(path)!r}; compute them with `jigsaw-earth data prepare` (or pass "
        f"stats=None to the loader to read unnormalised values)"
    )


@dataclass(frozen=True)
class Normalizer:
    """Per-channel ``mean``/``std`` and 1-step difference ``diff_mean``/``diff_std`` (float32)."""

    channels: tuple[str, ...]
    mean: np.ndarray
    std: np.ndarray
    diff_mean: np.ndarray
    diff_std: np.ndarray
    static_mean: np.ndarray
    static_std: np.ndarray

    @classmethod
    def identity(cls, spec: VariableSpec, n_static: int) -> Normalizer:
        c = spec.n_channels
        return cls(
            tuple(spec.channels),
            np.zeros(c, np.float32),
            np.ones(c, np.float32),
            np.zeros(c, np.float32),
            np.ones(c, np.float32),
            np.zeros(n_static, np.float32),
            np.ones(n_static, np.float32),
        )

    @classmethod
    def from_stats(
        cls, stats: xr.Dataset, spec: VariableSpec, view: StoreView, n_geometry: int
    ) -> Normalizer:
        """Channel statistics in ``spec.channels`` order; checks the grid and names every miss."""
        grid = (stats.attrs.get("n_lat"), stats.attrs.get("n_lon"))
        lat_range = stats.attrs.get("lat_range")
        if (
            lat_range is not None
            and grid == view.grid_shape
            and not np.allclose(sorted(lat_range), sorted([view.lat[0], view.lat[-1]]), atol=1e-6)
        ):
            raise ValueError(
                f"statistics are for latitudes {lat_range} but store {view.path!r} spans "
                f"{[float(view.lat[0]), float(view.lat[-1])]}; recompute them on this store"
            )
        if grid != view.grid_shape:
            raise ValueError(
                f"statistics are for a {grid[0]}x{grid[1]} grid but store {view.path!r} is "
                f"{view.grid_shape[0]}x{view.grid_shape[1]}; recompute them with `jigsaw-earth data "
                f"prepare` on this store"
            )
        rows: list[np.ndarray] = []
        for v in spec.upper_air:
            da = _stat_var(stats, v)
            levels = np.asarray(da["level"].values, dtype=float)
            for lev in spec.levels:
                hit = np.nonzero(np.isclose(levels, lev))[0]
                if not len(hit):
                    raise ValueError(
                        f"statistics have no level {lev} for {v!r} (they have "
                        f"{levels.astype(int).tolist()}); recompute them"
                    )
                rows.append(da.sel(stat=list(STATS)).values[:, hit[0]])
        for v in spec.surface:
            rows.append(_stat_var(stats, v).sel(stat=list(STATS)).values)
        table = np.stack(rows).astype(np.float32)  # (C, 4)
        static = [_stat_var(stats, v).sel(stat=["mean", "std"]).values for v in spec.static]
        smean = np.array([s[0] for s in static] + [0.0] * n_geometry, np.float32)
        sstd = np.array([s[1] if s[1] > 0 else 1.0 for s in static] + [1.0] * n_geometry, np.float32)
        std = np.where(table[:, 1] > 0, table[:, 1], 1.0)
        dstd = np.where(table[:, 3] > 0, table[:, 3], 1.0)
        return cls(tuple(spec.channels), table[:, 0], std, table[:, 2], dstd, smean, sstd)


def _stat_var(stats: xr.Dataset, name: str) -> xr.DataArray:
    if name not in stats:
        raise ValueError(
            f"statistics have no {name!r} (they have {sorted(map(str, stats.data_vars))}); "
            f"recompute them with `jigsaw-earth data prepare` including that variable"
        )
    return stats[name]


class RunningStats:
    """Streaming (float64) version of ``compute_statistics`` for data generated in time blocks."""

    def __init__(self) -> None:
        self.acc: dict[str, dict[str, Any]] = {}

    def update(self, name: str, block: np.ndarray) -> None:
        """Add a ``(T, [L], lat, lon)`` block that follows the previous one in time."""
        x = block.astype(np.float64)
        a = self.acc.setdefault(
            name, {"n": 0, "s": 0.0, "ss": 0.0, "dn": 0, "ds": 0.0, "dss": 0.0, "last": None}
        )
        axes = (0, *range(x.ndim - 2, x.ndim))
        a["n"] += x.shape[0] * x.shape[-1] * x.shape[-2]
        a["s"] = a["s"] + x.sum(axis=axes)
        a["ss"] = a["ss"] + (x * x).sum(axis=axes)
        full = x if a["last"] is None else np.concatenate([a["last"], x])
        d = np.diff(full, axis=0)
        a["dn"] += d.shape[0] * d.shape[-1] * d.shape[-2]
        a["ds"] = a["ds"] + d.sum(axis=axes)
        a["dss"] = a["dss"] + (d * d).sum(axis=axes)
        a["last"] = x[-1:]

    def result(self, levels: np.ndarray | None, static: dict[str, np.ndarray], attrs: dict) -> xr.Dataset:
        out = {}
        for name, a in self.acc.items():
            mean, dmean = a["s"] / a["n"], a["ds"] / a["dn"]
            std = np.sqrt(np.maximum(a["ss"] / a["n"] - mean**2, 0.0))
            dstd = np.sqrt(np.maximum(a["dss"] / a["dn"] - dmean**2, 0.0))
            values = np.stack([np.broadcast_to(v, np.shape(mean)) for v in (mean, std, dmean, dstd)])
            dims = ("stat", "level") if values.ndim == 2 else ("stat",)
            out[name] = xr.DataArray(values, dims=dims)
        for name, field in static.items():
            out[name] = xr.DataArray([field.mean(), field.std(), 0.0, 0.0], dims=("stat",))
        coords = {"stat": list(STATS)}
        if levels is not None:
            coords["level"] = np.asarray(levels)
        return xr.Dataset(out, coords=coords, attrs=attrs)
