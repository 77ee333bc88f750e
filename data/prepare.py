"""``data prepare``: any WB2-layout Zarr store or folder of netCDF files → the training layout.

The output uses WB2 names, dims ``(time, [level], latitude, longitude)``, latitude descending,
levels ascending in hPa, float32, and the tile-friendly chunking of ``ChunkLayout`` (Zarr v3
shards); statistics go into its ``statistics`` group. The copy is one dask computation (a
progress bar over its tasks); it is written to ``DST.tmp-<pid>`` and renamed when complete.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import dask
import numpy as np
import xarray as xr

from .stats import TqdmCallback, compute_statistics, write_statistics
from .store import SURFACE_VARIABLES, UPPER_AIR_VARIABLES, StoreView, open_store
from .writer import ChunkLayout, atomic_store, mark_complete

__all__ = ["open_source", "prepare_store"]

log = logging.getLogger(__name__)
STATIC = ("land_sea_mask", "geopotential_at_surface")


def open_source(src: str | Path, names: dict[str, str] | None = None) -> StoreView:
    """A Zarr store (path or URL) or a folder / glob of netCDF files, lazily with dask."""
    text = str(src)
    local = Path(text)
    nc: list[Any] = []
    if "://" not in text:
        if local.is_dir() and not any((local / m).exists() for m in ("zarr.json", ".zgroup")):
            nc = sorted([*local.glob("*.nc"), *local.glob("*.nc4")])
            if not nc:
                raise FileNotFoundError(f"{text} is neither a Zarr store nor a folder of *.nc files")
        elif any(c in text for c in "*?["):
            nc = sorted(Path().glob(text)) if not local.is_absolute() else sorted(
                Path(local.anchor).glob(str(local.relative_to(local.anchor))))
        elif not local.exists():
            raise FileNotFoundError(f"source {text!r} does not exist; give a Zarr store or netCDF folder")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if nc:
            ds = xr.open_mfdataset(nc, combine="by_coords", chunks={}, engine="netcdf4")
            return StoreView.from_dataset(ds, text, names=names)
        ds = xr.open_zarr(open_store(text), chunks={}, consolidated=None)
    return StoreView.from_dataset(ds, text, names=names)


def _canonical(view: StoreView, name: str, canonical: str, levels: list[int] | None) -> xr.DataArray:
    da = view.dataset[name]
    rename = {v: k for k, v in view.coord_names.items() if v in da.dims and v != k}
    da = da.rename(rename)
    if "level" in da.dims:
        da = da.assign_coords(level=np.rint(view.levels).astype(np.int64))
        if levels is not None:
            missing = [lev for lev in levels if lev not in da["level"].values]
            if missing:
                raise ValueError(f"levels {missing} of {canonical!r} are not in {view.path!r}; it has "
                                 f"{da['level'].values.tolist()}")
            da = da.sel(level=list(levels))
        da = da.sortby("level")
    da = da.isel(latitude=view.lat_storage, longitude=view.lon_storage)
    order = [d for d in ("time", "level", "latitude", "longitude") if d in da.dims]
    extra = [d for d in da.dims if d not in order]
    if extra:
        raise ValueError(f"variable {name!r} has dimensions {extra} besides time/level/lat/lon; "
                         f"select one value first")
    return da.transpose(*order).astype(np.float32).rename(canonical)


def prepare_store(src: str | Path, dst: str | Path, *, upper_air: list[str] | None = None,
                  levels: list[int] | None = None, surface: list[str] | None = None,
                  period: tuple[str, str] | None = None, step_hours: int | None = None,
                  stats_period: tuple[str, str] | None = None, names: dict[str, str] | None = None,
                  layout: ChunkLayout | None = None, overwrite: bool = False,
                  progress: bool = True) -> dict[str, Any]:
    """Copy ``src`` into the training layout at ``dst`` (local), with statistics."""
    view = open_source(src, names)
    layout = layout or ChunkLayout(time_shard=1)
    has_level = "level" in view.coord_names

    def present(candidates: tuple[str, ...], upper: bool) -> list[str]:
        out = []
        for v in candidates:
            try:
                view.resolve(v, upper_air=upper)
                out.append(v)
            except ValueError:
                pass
        return out

    ua = list(upper_air) if upper_air is not None else (
        present(UPPER_AIR_VARIABLES, True) if has_level else [])
    sf = list(surface) if surface is not None else [v for v in present(SURFACE_VARIABLES, False)
                                                      if v not in STATIC]
    st = [v for v in STATIC if v in present(STATIC, False)]
    if not ua and not sf:
        raise ValueError(f"found no known variable in {view.path!r} (it has {view.describe_variables()}); "
                         f"map them with --name CANONICAL=STORE_NAME")
    fields = {v: _canonical(view, view.resolve(v, True), v, levels) for v in ua}
    fields.update({v: _canonical(view, view.resolve(v, False), v, None) for v in sf})
    for v in st:
        da = _canonical(view, view.resolve(v, False), v, None)
        fields[v] = da.isel(time=0, drop=True) if "time" in da.dims else da
    ds = xr.Dataset(fields)
    if period is not None:
        ds = ds.sel(time=slice(*period))
    if step_hours:
        ds = ds.sel(time=ds["time"].values[::max(1, int(np.timedelta64(step_hours, "h") / _step(ds)))])
    if ds.sizes.get("time", 0) < 2:
        raise ValueError(f"period {period} of {view.path!r} holds {ds.sizes.get('time', 0)} times; "
                         f"it needs at least 2")
    encoding, chunks = {}, {}
    for v, da in ds.data_vars.items():
        if "time" not in da.dims:
            encoding[v] = {"chunks": da.shape}
            continue
        c, s = layout.shapes(da.sizes["time"], da.sizes.get("level"), da.sizes["latitude"],
                             da.sizes["longitude"])
        encoding[v] = {"chunks": c, **({"shards": s} if s else {})}
        if not layout.compress:
            encoding[v]["compressors"] = None
        chunks[v] = s or c
    for v, sizes in chunks.items():
        dims = ds[v].dims
        ds[v] = ds[v].chunk({d: max(n, 1) * (8 if d == "time" else 1) for d, n in zip(dims, sizes)})
    ds["time"].encoding = {"units": "hours since 1970-01-01", "calendar": "proleptic_gregorian",
                           "dtype": "int64"}
    with atomic_store(dst, overwrite) as tmp:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            job = ds.to_zarr(tmp, zarr_format=3, encoding=encoding, compute=False, consolidated=False)
            with TqdmCallback(f"prepare {Path(dst).name}", disable=not progress):
                dask.compute(job)
        stats = compute_statistics(tmp, period=stats_period, progress=progress)
        write_statistics(tmp, stats)
        mark_complete(tmp, source=str(src), layout=layout.describe())
    return {"store": str(dst), "variables": [*ua, *sf, *st], "times": int(ds.sizes["time"]),
            "grid": [int(ds.sizes["latitude"]), int(ds.sizes["longitude"])]}


def _step(ds: xr.Dataset) -> np.timedelta64:
    t = ds["time"].values
    return np.timedelta64(np.median(np.diff(t)).astype("timedelta64[s]"))
