"""``data prepare``: any WB2-layout Zarr store, or netCDF or GRIB files (``grib.py``) → the training layout.

The output uses WB2 names, dims ``(time, [level], latitude, longitude)``, latitude descending,
levels ascending in hPa, float32, and the tile-friendly chunking of ``ChunkLayout`` (Zarr v3
shards); statistics go into its ``statistics`` group. The source is read once, a block of times
at a time, into a local path or a bucket URL (``prepare_write``: bounded memory, statistics on the
way, resumable, committed by a marker written last).

Before anything is written a local source is scanned for NaNs (one read of every selected value,
``nans="refuse"``, the default): a source holding any is refused with the count per variable, how
many times hold them and the first one. A source in a bucket is checked block by block as it is
read instead (one pass over the link): the first block holding NaNs stops the prepare and nothing is
kept. ``nans="fill"`` replaces them by the variable's mean (per level) over its finite values (a scan
first, wherever the source is), and says so per variable; ``nans="keep"`` skips the scan and copies
NaNs as they are (training then stops at the first step that reads one)."""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import dask
import numpy as np
import xarray as xr
from jigsaw_earth.data.grib import GRIB_SUFFIXES, GribMessages, is_grib
from jigsaw_earth.data.objects import is_object_url
from jigsaw_earth.data.prepare_write import Target, write_blocks
from jigsaw_earth.data.stats import TqdmCallback
from jigsaw_earth.data.store import (
    ACCUMULATED,
    ACCUMULATION_ATTR,
    STATIC_VARIABLES,
    SURFACE_VARIABLES,
    UPPER_AIR_VARIABLES,
    StoreView,
    canonical_dataset,
    open_store,
)
from jigsaw_earth.data.times import TimeAxis, resample_plan
from jigsaw_earth.data.writer import ChunkLayout

from jigsaw_earth.ownership import check_output

__all__ = ["NAN_POLICIES", "TimeOptions", "nan_report", "netcdf_files", "open_source", "prepare_store"]

NAN_POLICIES = ("refuse", "fill", "keep")

log = logging.getLogger(__name__)
STATIC = STATIC_VARIABLES


def netcdf_files(text: str) -> list[Path]:
    """The netCDF and GRIB files a source names (a file, a folder of them, a glob); [] for a Zarr store."""
    local = Path(text)
    if local.is_dir() and not any((local / m).exists() for m in ("zarr.json", ".zgroup")):
        patterns = ("*.nc", "*.nc4", *(f"*{s}" for s in GRIB_SUFFIXES))
        files = sorted(f for pattern in patterns for f in local.glob(pattern))
        if not files:
            raise FileNotFoundError(f"{text} is neither a Zarr store nor a folder of *.nc / *.grib files")
        return files
    if any(c in text for c in "*?["):
        return (
            sorted(Path().glob(text))
            if not local.is_absolute()
            else sorted(Path(local.anchor).glob(str(local.relative_to(local.anchor))))
        )
    if local.is_file():
        return [local]
    if not local.exists():
        raise FileNotFoundError(
            f"source {text!r} does not exist; give a Zarr store, a netCDF/GRIB file or a folder of them"
        )
    return []


def _open_file(path: Path) -> xr.Dataset:
    """One netCDF file, lazily; one clear message if unreadable."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return xr.open_dataset(path, chunks={}, engine="netcdf4", decode_timedelta=False)
    except Exception as err:  # netCDF4/HDF5 raise OSError, RuntimeError, ValueError...
        raise ValueError(
            f"cannot read {path} ({path.stat().st_size} bytes): {type(err).__name__}: {err}. The file is "
            f"corrupt or truncated (an interrupted download?); download it again or move it out of the "
            f"source folder"
        ) from None


def open_source(
    src: str | Path, names: dict[str, str] | None = None, time_units: str | None = None
) -> StoreView:
    """A Zarr store (path or URL), a netCDF/GRIB file, or a folder / glob of them, lazily with dask.

    Each netCDF file is mapped to canonical names first (``store.canonical_dataset``, the one naming
    table ``store.ALIASES``), the messages of all GRIB files together (``grib.GribMessages``: mixed
    level types, any split over files), then the parts are merged: the CDS pressure-level +
    single-level pair (both holding ``z``) becomes geopotential + geopotential_at_surface. A GRIB
    source's view keeps its messages (``StoreView.messages``) to name what a selection lacks.
    """
    text = str(src)
    files = netcdf_files(text) if "://" not in text else []
    if files:
        gribs = [f for f in files if is_grib(f)]
        messages = GribMessages(gribs, names) if gribs else None
        parts = [canonical_dataset(_open_file(f), str(f), names, time_units) for f in files if not is_grib(f)]
        if messages is not None:
            parts.append(canonical_dataset(messages.dataset(), messages.where))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                ds = (
                    parts[0]
                    if len(parts) == 1
                    else xr.combine_by_coords(
                        parts,
                        data_vars="minimal",
                        coords="minimal",
                        compat="override",
                        join="outer",
                        combine_attrs="drop_conflicts",
                    )
                )
            except ValueError as err:
                raise ValueError(
                    f"cannot combine the files of {text!r}: {err}. Files must share one grid "
                    f"and differ in time or in variables"
                ) from None
        view = StoreView.from_dataset(ds, text)
        view.messages = messages
        return view
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = xr.open_zarr(open_store(text), chunks=None, consolidated=None)
    return StoreView.from_dataset(_by_storage_object(ds), text, names=names, time_units=time_units)


def _by_storage_object(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with one dask chunk per storage object (a shard, else a chunk) of each variable: a
    tile-sharded store's small inner chunks would make a graph of millions of tasks, and a copy reads
    each object once either way."""
    out = {}
    for name, da in ds.data_vars.items():
        shape = da.encoding.get("shards") or da.encoding.get("chunks")
        out[name] = da.chunk(dict(zip(da.dims, shape)) if shape else {})
    return ds.assign(out)


def _canonical(
    view: StoreView, name: str, canonical: str, levels: list[int] | None, static: bool = False
) -> xr.DataArray:
    da = view.dataset[name]
    rename = {v: k for k, v in view.coord_names.items() if v in da.dims and v != k}
    da = da.rename(rename)
    if "level" in da.dims:
        da = da.assign_coords(level=np.rint(view.levels).astype(np.int64))
        if levels is not None:
            missing = [lev for lev in levels if lev not in da["level"].values]
            if missing:
                raise ValueError(
                    f"levels {missing} of {canonical!r} are not in {view.path!r}; it has "
                    f"{da['level'].values.tolist()}"
                )
            da = da.sel(level=list(levels))
        da = da.sortby("level")
    if view.messages is not None:  # a GRIB source: every selected level at every time, or say what lacks
        at = view.messages.times()[:1] if static else None  # a static field: its first time is kept
        view.messages.require(canonical, da["level"].values.tolist() if "level" in da.dims else None, at)
    da = da.isel(latitude=view.lat_storage, longitude=view.lon_storage)
    order = [d for d in ("time", "level", "latitude", "longitude") if d in da.dims]
    extra = [d for d in da.dims if d not in order]
    if extra:
        raise ValueError(
            f"variable {name!r} has dimensions {extra} besides time/level/lat/lon; select one value first"
        )
    return da.transpose(*order).astype(np.float32).rename(canonical)


@dataclass(frozen=True)
class TimeOptions:
    """How ``prepare`` shapes the time axis (see ``docs/data.md``)."""

    period: tuple[str, str] | None = None
    step_hours: int | None = None  # keep times at multiples of this many hours (regular axes)
    resample_hours: int | None = None  # resample an irregular axis onto this step
    resample_method: str = "nearest"
    resample_tolerance_hours: float | None = None  # default: half the step (nearest), 2 steps (linear)
    accumulate_hours: int | None = None  # sum shorter accumulations to totals over this period
    time_units: str | None = None


def _accumulation_hours(name: str, da: xr.DataArray) -> int | None:
    attr = da.attrs.get(ACCUMULATION_ATTR)
    if attr is not None:
        return int(attr)
    return ACCUMULATED.get(name)


def _accumulate(ds: xr.Dataset, hours: int, where: str) -> xr.Dataset:
    """Sum every shorter accumulation to ``hours`` totals ending at each time (WB2's convention)."""
    out = ds
    t = TimeAxis.of(ds["time"].values).times
    keep = np.ones(len(t), dtype=bool)  # times at which every total has a full window
    for name in [str(v) for v in ds.data_vars]:
        period = _accumulation_hours(name, ds[name])
        if period is None or period == hours or "time" not in ds[name].dims:
            continue
        if hours % period:
            raise ValueError(
                f"--accumulate {hours}h: {name!r} holds {period} h accumulations; choose a "
                f"multiple of {period} h"
            )
        n = hours // period
        steady = np.diff(t) == np.timedelta64(period, "h")  # consecutive accumulations
        run = np.convolve(steady.astype(int), np.ones(n - 1, dtype=int), "full")[: len(steady)]
        ok = np.concatenate([[False], run == n - 1])  # the n - 1 spacings before each time are steady
        if not ok.any():
            raise ValueError(
                f"--accumulate {hours}h: {name!r} in {where} needs {n} consecutive {period} h "
                f"values; the source has no such window (its spacing is "
                f"{TimeAxis.of(t).describe_histogram()})"
            )
        total = ds[name].rolling(time=n).sum().where(xr.DataArray(ok, dims="time"))
        new = f"{name.removesuffix(f'_{period}hr')}_{hours}hr"  # total_precipitation(_6hr) -> _24hr
        attrs = {**ds[name].attrs, ACCUMULATION_ATTR: hours}
        out = out.drop_vars(name).assign({new: total.assign_attrs(attrs)})
        log.info(
            "%s: %s (%d h accumulations) summed to %d h totals as %s (%d of %d times: full window)",
            where,
            name,
            period,
            hours,
            new,
            int(ok.sum()),
            len(ok),
        )
        keep &= ok
    return out.isel(time=np.nonzero(keep)[0])


def _shape_time(ds: xr.Dataset, opts: TimeOptions, where: str) -> xr.Dataset:
    """Period, resampling or step selection; an irregular axis is refused unless resampled."""
    if opts.accumulate_hours:
        ds = _accumulate(ds, opts.accumulate_hours, where)
    if opts.period is not None:
        ds = ds.sel(time=slice(*opts.period))
    if ds.sizes.get("time", 0) < 2:
        raise ValueError(
            f"period {opts.period} of {where} holds {ds.sizes.get('time', 0)} times; it needs at least 2"
        )
    times = ds["time"].values
    if opts.resample_hours:
        if opts.step_hours and opts.step_hours != opts.resample_hours:
            raise ValueError(
                f"--step-hours {opts.step_hours} and --resample {opts.resample_hours}h differ; "
                f"give only --resample"
            )
        h = opts.resample_hours
        tol = opts.resample_tolerance_hours
        tol = tol if tol is not None else (h / 2 if opts.resample_method == "nearest" else 2 * h)
        targets, i0, i1, w = resample_plan(times, h, opts.resample_method, tol)
        timed = [v for v in ds.data_vars if "time" in ds[v].dims]
        a = ds[timed].isel(time=i0).drop_vars("time")
        if opts.resample_method == "linear":
            wt = xr.DataArray(w.astype(np.float32), dims="time")
            with xr.set_options(keep_attrs=True):  # accumulation_hours and units survive
                a = a * (1 - wt) + ds[timed].isel(time=i1).drop_vars("time") * wt
        a = a.assign_coords(time=targets.astype("datetime64[ns]"))
        log.info(
            "%s: resampled %d times (%s) to %d times every %d h (%s, tolerance %g h)",
            where,
            len(times),
            TimeAxis.of(times).describe_histogram(),
            len(targets),
            h,
            opts.resample_method,
            tol,
        )
        return xr.merge([a, ds[[v for v in ds.data_vars if v not in timed]]])
    axis = TimeAxis.of(times)
    axis.require_regular(where)
    if opts.step_hours:
        if opts.step_hours % axis.step_hours:
            raise ValueError(
                f"--step-hours {opts.step_hours} is not a multiple of the {axis.step_hours:g} h "
                f"spacing of {where}; use a multiple, or --resample {opts.step_hours}h"
            )
        hours = (axis.times - np.datetime64("1970-01-01T00", "s")) // np.timedelta64(1, "h")
        keep = np.nonzero(hours % opts.step_hours == 0)[0]
        ds = ds.isel(time=keep)
        axis = TimeAxis.of(ds["time"].values)
    if axis.gaps:
        a, b = axis.gaps[0]
        log.warning(
            "%s keeps %d time gap(s) (%d missing times; first %s -> %s): train with data.allow_gaps: "
            "true, or choose --start/--end without them",
            where,
            len(axis.gaps),
            axis.missing_times(),
            a,
            b,
        )
    return ds


def _nan_scan(ds: xr.Dataset, progress: bool) -> dict[str, dict[str, Any]]:
    """Per variable: NaN count, times holding NaNs, the first such time, and the per-level mean of
    the finite values (for ``fill``); one dask pass over the selected source."""
    lazy: dict[str, Any] = {}
    for v, da in ds.data_vars.items():
        bad = da.isnull()
        other = [d for d in da.dims if d != "time"]
        lazy[v] = {
            "count": bad.sum(),
            "per_time": bad.sum(other) if "time" in da.dims else None,
            "mean": da.mean([d for d in da.dims if d != "level"], skipna=True),
        }
    with TqdmCallback("scan for NaNs", disable=not progress):
        (done,) = dask.compute(lazy)
    out = {}
    for v, r in done.items():
        count = int(r["count"])
        entry: dict[str, Any] = {"count": count, "mean": r["mean"]}
        if r["per_time"] is not None and count:
            hit = np.nonzero(np.asarray(r["per_time"]) > 0)[0]
            times = ds["time"].values
            entry.update(times=int(hit.size), first=str(np.datetime_as_string(times[hit[0]], unit="h")))
        out[v] = entry
    return out


def nan_report(scan: dict[str, dict[str, Any]]) -> str:
    """``temperature: 120 NaNs in 3 times (first 2020-01-05T06); …`` for the variables holding any."""
    parts = []
    for v, e in scan.items():
        if e["count"]:
            where = f" in {e['times']} times (first {e['first']})" if "times" in e else " (static field)"
            parts.append(f"{v}: {e['count']} NaNs{where}")
    return "; ".join(parts)


def prepare_store(
    src: str | Path,
    dst: str | Path,
    *,
    upper_air: list[str] | None = None,
    levels: list[int] | None = None,
    surface: list[str] | None = None,
    period: tuple[str, str] | None = None,
    step_hours: int | None = None,
    stats_period: tuple[str, str] | None = None,
    names: dict[str, str] | None = None,
    layout: ChunkLayout | None = None,
    overwrite: bool = False,
    progress: bool = True,
    time: TimeOptions | None = None,
    nans: str = "refuse",
    memory_mb: float = 1024,
) -> dict[str, Any]:
    """Copy ``src`` into the training layout at ``dst`` (a local path or a bucket URL), with
    statistics, in one resumable pass (``prepare_write``).

    ``upper_air`` / ``surface`` default to every known variable the source holds; an empty
    list means none. ``time`` shapes the time axis (``period`` / ``step_hours`` are shorthands).
    ``nans``: ``refuse`` a source holding NaNs (the default), ``fill`` them with the variable's
    mean, or ``keep`` them without scanning (module doc). ``memory_mb``: about the memory of one
    block of times (two are held: one read while the other is written).
    """
    if nans not in NAN_POLICIES:
        raise ValueError(f"--nans {nans!r}: choose one of {', '.join(NAN_POLICIES)}")
    if not memory_mb > 0:
        raise ValueError(f"--memory-mb {memory_mb}: give the MB of one block of times, more than 0")
    remote = "://" in str(src)
    source = None if remote else src
    protected = (("source of the prepare", source),)
    if remote and is_object_url(str(dst)):
        a, b = str(src).rstrip("/") + "/", str(dst).rstrip("/") + "/"
        if a.startswith(b) or b.startswith(a):
            raise ValueError(
                f"--out {dst} is, holds or lies inside the source {src}; nothing was written or deleted. "
                f"Choose an --out outside it"
            )
    if not is_object_url(str(dst)):
        check_output(dst, "store", overwrite=overwrite, protected=protected)
    opts = time or TimeOptions()
    if period is not None or step_hours is not None:
        opts = replace(opts, period=period or opts.period, step_hours=step_hours or opts.step_hours)
    view = open_source(src, names, opts.time_units)
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

    ua = (
        list(upper_air)
        if upper_air is not None
        else (present(UPPER_AIR_VARIABLES, True) if has_level else [])
    )
    sf = (
        list(surface)
        if surface is not None
        else [v for v in present(SURFACE_VARIABLES, False) if v not in STATIC]
    )
    st = [v for v in STATIC if v in present(STATIC, False)]
    if not ua and not sf:
        raise ValueError(
            f"found no known variable in {view.path!r} (it has {view.describe_variables()}); "
            f"map them with --name CANONICAL=STORE_NAME"
        )
    fields = {v: _canonical(view, view.resolve(v, True), v, levels) for v in ua}
    fields.update({v: _canonical(view, view.resolve(v, False), v, None) for v in sf})
    for v in [*ua, *sf]:
        acc = _accumulation_hours(v, fields[v])
        if acc is not None:
            fields[v].attrs[ACCUMULATION_ATTR] = acc
            if not opts.accumulate_hours and acc != (opts.step_hours or opts.resample_hours or acc):
                log.warning(
                    "%s holds %d h accumulations; kept as such (not summed). Pass --accumulate %dh "
                    "for %d h totals",
                    v,
                    acc,
                    opts.step_hours or opts.resample_hours,
                    opts.step_hours or opts.resample_hours,
                )
    for v in st:
        da = _canonical(view, view.resolve(v, False), v, None, static=True)
        fields[v] = da.isel(time=0, drop=True) if "time" in da.dims else da
    ds = _shape_time(xr.Dataset(fields), opts, repr(view.path))
    filled = ""
    if nans == "fill" or (nans == "refuse" and not remote):  # a bucket's source: checked as it is read
        scan = _nan_scan(ds, progress)
        found = nan_report(scan)
        if found and nans == "refuse":
            raise ValueError(
                f"source {view.path!r} holds NaN values: {found}. Nothing was written. Fill them with "
                f"each variable's mean (--nans fill), keep them (--nans keep: training stops at the first "
                f"step that reads one), or choose --start/--end or --surface/--upper-air without them"
            )
        if found:
            for v, e in scan.items():
                if e["count"]:
                    ds[v] = ds[v].fillna(e["mean"].astype(np.float32))
            filled = found
            log.warning("%s: filled NaNs with each variable's mean: %s", view.path, found)
    for var in ds.variables.values():  # our codecs and chunks, never the source's (numcodecs Blosc in v2)
        var.encoding = {}
    encoding, chunks = {}, {}
    for v, da in ds.data_vars.items():
        if "time" not in da.dims:
            encoding[v] = {"chunks": da.shape}
            continue
        c, s = layout.shapes(
            da.sizes["time"], da.sizes.get("level"), da.sizes["latitude"], da.sizes["longitude"]
        )
        encoding[v] = {"chunks": c, **({"shards": s} if s else {})}
        encoding[v]["compressors"] = layout.compressors() or None
        chunks[v] = s or c
    ds["time"].encoding = {
        "units": "hours since 1970-01-01",
        "calendar": "proleptic_gregorian",
        "dtype": "int64",
    }
    request = {
        "source": str(src),
        "variables": [str(v) for v in ds.data_vars],
        "levels": ds["level"].values.tolist() if "level" in ds.coords else None,
        "times": [str(ds["time"].values[0])[:19], str(ds["time"].values[-1])[:19], int(ds.sizes["time"])],
        "layout": layout.describe(),
        "statistics period": list(stats_period) if stats_period else None,
        "nans": nans,
    }
    target = Target.of(dst, overwrite, protected)
    write_blocks(
        ds,
        target,
        encoding,
        request,
        time_shard=layout.time_shard,
        stats_period=stats_period,
        check_nans=nans == "refuse" and remote,
        memory_mb=memory_mb,
        progress=progress,
        where=repr(view.path),
        info={"source": str(src), "layout": layout.describe()},
    )
    target.publish(protected, overwrite)
    log.info("wrote %s", dst)
    return {
        "nans_filled": filled,
        "store": str(dst),
        "variables": [str(v) for v in ds.data_vars],
        "times": int(ds.sizes["time"]),
        "grid": [int(ds.sizes["latitude"]), int(ds.sizes["longitude"])],
    }
