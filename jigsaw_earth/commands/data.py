"""``jigsaw-earth data``: synth, prepare, inspect and io-report for ERA5-like Zarr stores."""

from __future__ import annotations

import argparse
import logging
import math
import time
from pathlib import Path

from ..argtypes import parse_grid, parse_list, path_or_url
from ..distributed.halo import Halo
from ..distributed.mesh import parse_mesh
from .checked_write import check_json, write_json

log = logging.getLogger(__name__)

__all__ = ["add_parser", "run"]


def _names(items: list[str] | None) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--name {item!r}: write CANONICAL=STORE_NAME, e.g. 2m_temperature=t2m")
        out[key] = value
    return out


def _csv(text: str | None, what: str, cast=str) -> list | None:
    return None if text is None else parse_list(text, what, cast, example="500,850")


def _variables(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--upper-air",
        help="comma-separated upper-air variables (WB2 names); default: every "
        "known one in the store; '' = none",
    )
    p.add_argument(
        "--levels",
        help="comma-separated levels in hPa, or 'all' (default: all, for io-report "
        "500,850 when the store has them)",
    )
    p.add_argument(
        "--surface",
        help="comma-separated surface variables (WB2 names); default: every known "
        "one in the store; '' = none",
    )
    p.add_argument(
        "--name",
        action="append",
        metavar="CANONICAL=STORE_NAME",
        help="map a WB2 name (or latitude/longitude/level/time) to the store's name",
    )


def _layout_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chunk", metavar="LATxLON", help="inner chunk size (default: whole grid)")
    p.add_argument("--shard", metavar="LATxLON", help="shard size (default: whole grid)")
    p.add_argument("--time-shard", type=int, help="times per shard")
    p.add_argument(
        "--for-mesh",
        metavar="LATxLON",
        help="tile-aligned layout for this mesh: one shard "
        "per tile, inner chunks ~1/16 of a tile (overrides --chunk/--shard)",
    )
    p.add_argument(
        "--compression",
        choices=["none", "zstd", "lz4"],
        help="chunk compression (default: zstd for prepare, none for synth); none reads fastest "
        "(memory-mapped), lz4 decodes ~2x faster than zstd (docs/data.md)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="make, convert and inspect ERA5-like Zarr stores")
    dsub = p.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")

    s = dsub.add_parser("synth", help="write a synthetic ERA5-like store (WB2 layout) + climatology")
    s.add_argument(
        "--out", required=True, type=path_or_url, help="store to write (its climatology goes beside it)"
    )
    s.add_argument("--grid", default="32x64", metavar="LATxLON", help="global grid (default 32x64, 5.625°)")
    s.add_argument("--start", default="2019-01-01T00", help="first time (default 2019-01-01T00)")
    s.add_argument("--end", default="2020-12-31T18", help="last time, 6-hourly (default 2020-12-31T18)")
    s.add_argument("--levels", default="500,850", help="comma-separated hPa levels, or 'all' (13)")
    s.add_argument("--seed", type=int, default=0, help="seed of the synthetic weather")
    s.add_argument(
        "--stochastic",
        type=float,
        default=0.0,
        metavar="SIGMA",
        help="add unpredictable weather: a red-noise stream of amplitude SIGMA x 200 m²/s² on the waves, "
        "for ensembles to learn its spread (docs/ensembles.md; default 0 = off)",
    )
    s.add_argument("--no-climatology", action="store_true", help="skip the WB2-layout climatology store")
    _layout_args(s)

    r = dsub.add_parser("prepare", help="convert a WB2-layout store or netCDF folder to the training layout")
    r.add_argument("src", help="Zarr store (path or fsspec URL), netCDF/GRIB file, or a folder/glob of them")
    r.add_argument(
        "--out", required=True, help="training store to write: a local path or a bucket URL (s3://, gs://)"
    )
    _variables(r)
    r.add_argument("--start", help="first time to keep")
    r.add_argument("--end", help="last time to keep")
    r.add_argument("--step-hours", type=int, help="keep times at multiples of N hours (regular axes)")
    r.add_argument(
        "--time-units",
        metavar="UNITS",
        help="CF units of a numeric time axis, e.g. 'hours since 1970-01-01' (default: the "
        "coordinate's units, else a store attribute such as time_units)",
    )
    r.add_argument("--resample", metavar="HOURS", help="resample an irregular axis to this step, e.g. 6h")
    r.add_argument(
        "--resample-method",
        choices=["nearest", "linear"],
        default="nearest",
        help="nearest source time within the tolerance (default), or linear interpolation",
    )
    r.add_argument(
        "--resample-tolerance",
        type=float,
        metavar="HOURS",
        help="nearest: max distance to a source time (default half the step); linear: max "
        "span between the two source times (default two steps)",
    )
    r.add_argument(
        "--accumulate",
        metavar="HOURS",
        help="sum shorter accumulations (hourly total_precipitation) to totals over this "
        "period, e.g. 6h -> total_precipitation_6hr",
    )
    r.add_argument("--stats-start", help="first time of the statistics period")
    r.add_argument("--stats-end", help="last time of the statistics period")
    r.add_argument(
        "--nans",
        choices=["refuse", "fill", "keep"],
        default="refuse",
        help="NaNs in the source (a local one scanned before writing, a bucket's as it is read): refuse "
        "(default: report them per variable), "
        "fill with each variable's mean, or keep them unscanned",
    )
    r.add_argument(
        "--memory-mb",
        type=float,
        default=1024,
        help="about the memory of one block of times read at once (default 1024; two blocks are held, "
        "one read while the other is written)",
    )
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    _layout_args(r)

    i = dsub.add_parser("inspect", help="variables, levels, grid, times, chunking, gaps, NaNs")
    i.add_argument("path", help="store to describe")
    i.add_argument(
        "--nans",
        choices=["none", "sample", "full"],
        default="sample",
        help="NaN scan: none, 5 sampled times (default) or every time",
    )
    i.add_argument("--name", action="append", metavar="CANONICAL=STORE_NAME")
    i.add_argument("--json", type=path_or_url, metavar="PATH")

    o = dsub.add_parser("io-report", help="bytes each rank of a mesh reads for one sample")
    o.add_argument("path", help="store to read one sample from")
    o.add_argument("--mesh", action="append", metavar="LATxLON", help="repeatable; default 2x2")
    o.add_argument(
        "--halo",
        type=int,
        default=0,
        help="halo rows/columns read around each tile (default 0: training reads tiles; layers "
        "exchange halos over the network)",
    )
    o.add_argument("--pole", default="zeros", choices=["zeros", "replicate", "pole"])
    o.add_argument("--lead-steps", type=int, default=1, help="target steps per sample")
    o.add_argument("--time-index", type=int, default=0, help="which time to read")
    o.add_argument(
        "--bench",
        type=int,
        default=0,
        metavar="N",
        help="also time N samples: tile reader vs xarray whole-field read + slicing",
    )
    _variables(o)
    o.add_argument("--json", type=path_or_url, metavar="PATH")
    p.set_defaults(run=run)


def _spec(args: argparse.Namespace, view):
    """Variables and levels to read: as given ('' = none), else every known one the store holds."""
    from jigsaw_earth.data.batch import DEFAULT_LEVELS, VariableSpec

    store_upper, store_surface, _ = view.known_variables()
    upper = store_upper if args.upper_air is None else _csv(args.upper_air, "--upper-air")
    surface = store_surface if args.surface is None else _csv(args.surface, "--surface")
    store_levels = [] if view.levels is None else [int(x) for x in view.levels]
    if args.levels == "all" or (args.levels is None and not set(DEFAULT_LEVELS) <= set(store_levels)):
        levels = store_levels
    else:
        levels = _csv(args.levels, "--levels", int) if args.levels is not None else list(DEFAULT_LEVELS)
    return VariableSpec(tuple(upper), tuple(levels if upper else ()), tuple(surface), static=())


def _layout(args: argparse.Namespace, grid: tuple[int, int] | None, default_time_shard: int):
    from dataclasses import replace

    from jigsaw_earth.data.writer import ChunkLayout

    ts = args.time_shard or default_time_shard
    if args.for_mesh:
        if grid is None:
            raise ValueError("--for-mesh needs the grid size; give --chunk/--shard instead")
        m = parse_mesh(args.for_mesh)
        layout = ChunkLayout.for_mesh(*grid, m, time_shard=args.time_shard or 1)
    else:
        layout = ChunkLayout.parse(args.chunk, args.shard, ts)
    return replace(layout, compression=args.compression) if args.compression else layout


#: what ``data inspect --json`` and ``data io-report --json`` hold
INSPECT_KEYS, IO_KEYS = ("path", "grid", "variables"), ("store", "mesh")


def _write_json(path: Path | None, obj, keys: tuple[str, ...]) -> None:
    if path:
        write_json(path, obj, "--json", *keys)


def run(args: argparse.Namespace) -> int:
    commands = {"synth": _synth, "prepare": _prepare, "inspect": _inspect, "io-report": _io}
    return commands[args.data_command](args)


def _synth(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from jigsaw_earth.data.synth import WB2_LEVELS, SynthConfig, synth_store

    n_lat, n_lon = parse_grid(args.grid)
    levels = WB2_LEVELS if args.levels == "all" else tuple(_csv(args.levels, "--levels", int) or ())
    if not (args.stochastic >= 0 and math.isfinite(args.stochastic)):
        raise ValueError(f"--stochastic {args.stochastic}: use an amplitude >= 0 (0 = off, 1 = 200 m²/s²)")
    cfg = SynthConfig(
        n_lat=n_lat, n_lon=n_lon, start=args.start, end=args.end, levels=levels, seed=args.seed,
        stochastic=args.stochastic,
    )  # fmt: skip
    if args.chunk or args.shard or args.for_mesh or args.time_shard or args.compression:
        layout = _layout(args, (n_lat, n_lon), cfg.layout.time_shard)
        cfg = replace(cfg, layout=replace(layout, compression=args.compression or "none"))
    t0 = time.perf_counter()
    info = synth_store(args.out, cfg, overwrite=args.overwrite, climatology=not args.no_climatology)
    print(
        f"wrote {info['store']}: {info['times']} times, grid {n_lat}x{n_lon}, levels {info['levels']}"
        f"{', climatology ' + info['climatology'] if 'climatology' in info else ''} "
        f"({time.perf_counter() - t0:.1f} s)"
    )
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from jigsaw_earth.data.prepare import TimeOptions, open_source, prepare_store
    from jigsaw_earth.data.times import parse_hours

    names = _names(args.name)
    grid = open_source(args.src, names, args.time_units).grid_shape if args.for_mesh else None
    layout = _layout(args, grid, 1)
    period = (args.start, args.end) if args.start or args.end else None
    if period:
        period = (period[0] or "1900-01-01", period[1] or "2200-01-01")
    stats = (args.stats_start, args.stats_end) if args.stats_start and args.stats_end else None
    levels = None if args.levels in (None, "all") else _csv(args.levels, "--levels", int)
    t0 = time.perf_counter()
    info = prepare_store(
        args.src,
        args.out,
        upper_air=_csv(args.upper_air, "--upper-air"),
        levels=levels,
        surface=_csv(args.surface, "--surface"),
        time=TimeOptions(
            period=period,
            step_hours=args.step_hours,
            resample_hours=parse_hours(args.resample, "--resample") if args.resample else None,
            resample_method=args.resample_method,
            resample_tolerance_hours=args.resample_tolerance,
            accumulate_hours=parse_hours(args.accumulate, "--accumulate") if args.accumulate else None,
            time_units=args.time_units,
        ),
        stats_period=stats,
        names=names,
        layout=layout,
        overwrite=args.overwrite,
        progress=not args.no_progress,
        nans=args.nans,
        memory_mb=args.memory_mb,
    )
    if info["nans_filled"]:
        print(f"filled NaNs with each variable's mean: {info['nans_filled']}")
    print(
        f"wrote {info['store']}: {', '.join(info['variables'])}; {info['times']} times, grid "
        f"{info['grid'][0]}x{info['grid'][1]} ({time.perf_counter() - t0:.1f} s)"
    )
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from jigsaw_earth.data.report import inspect_store
    from jigsaw_earth.inference.unfinished import describe

    check_json(args.json, "--json", *INSPECT_KEYS)
    unfinished = describe(args.path)
    if unfinished is not None:  # its fields are not final: what it is and what it will hold
        print(f"UNFINISHED forecast of predict: {unfinished.text()}")
        for line in unfinished.details():
            print(f"  {line}")
        print(f"the same predict command resumes it; remove it: jigsaw-earth predict --remove-unfinished "
              f"{unfinished.path}")  # fmt: skip
        _write_json(args.json, {"path": str(unfinished.path), "unfinished": unfinished.text(),
                                "request": unfinished.request}, ("path", "unfinished"))  # fmt: skip
        return 0
    r = inspect_store(args.path, _names(args.name), args.nans)
    g, t = r["grid"], r["time"]
    print(f"store     {r['path']}  (complete marker: {r['complete']})")
    print(
        f"grid      {g['n_lat']} x {g['n_lon']}  latitude {g['lat'][0]:.3f} .. {g['lat'][1]:.3f} "
        f"(stored {g['latitude_order']}), longitude {g['lon'][0]:.3f} .. {g['lon'][1]:.3f}"
    )
    print(f"levels    {r['levels']}")
    print(
        f"time      {t['start']} .. {t['end']}  ({t['count']} times, step {t['step_hours'] or 0:g} h, "
        f"{len(t['gaps'])} gaps = {t['missing_times']} missing times, "
        f"{len(t['irregular'])} irregular spacings)"
    )
    for a, b in t["gaps"][:10]:
        print(f"  gap     {a} -> {b}")
    if t["irregular"]:
        suggest = max(h for h in (1, 2, 3, 6, 12, 24) if h <= max(1, t["step_hours"]))
        spacing = ", ".join(f"{h:g} h x{n}" for h, n in sorted(t["spacing_hours"].items()))
        print(
            f"  IRREGULAR time axis: spacings {spacing}; not gaps. Fix: jigsaw-earth data prepare "
            f"{r['path']} --out DST --resample {suggest}h"
        )
        for a, b in t["irregular"][:5]:
            print(f"  irregular {a} -> {b}")
    print(f"{'variable':<28} {'dims':<40} {'chunks':<22} {'shards':<22} NaNs ({r['nan_scan']})")
    for v in r["variables"]:
        shards = "-" if not v["shards"] else "x".join(map(str, v["shards"]))
        print(
            f"{v['name']:<28} {','.join(v['dims']):<40} {'x'.join(map(str, v['chunks'])):<22} "
            f"{shards:<22} {v.get('nans', '-')}"
        )
    _write_json(args.json, r, INSPECT_KEYS)
    return 0


def _io(args: argparse.Namespace) -> int:
    from jigsaw_earth.data.report import io_report, throughput
    from jigsaw_earth.data.store import StoreView

    check_json(args.json, "--json", *IO_KEYS)
    names = _names(args.name)
    view = StoreView.open(args.path, names=names)
    spec = _spec(args, view)
    halo = Halo.uniform(args.halo, lat_mode=args.pole)
    records, failed = [], False
    for text in args.mesh or ["2x2"]:
        m = parse_mesh(text)
        r = io_report(args.path, m, spec, halo, args.lead_steps, time_index=args.time_index, names=names)
        ok = r["max_fraction"] <= r["bound"]
        failed |= not ok
        print(
            f"mesh {r['mesh']}: whole sample {r['sample_bytes_read']} B read "
            f"({r['sample_bytes_uncompressed']} B uncompressed, {r['channels']} channels, "
            f"{1 + args.lead_steps} times); bound 1/N + halo + 10% = {r['bound']:.3f}"
        )
        print(
            f"  {'rank':>4} {'tile (rows, cols)':<24} {'bytes read':>12} {'requests':>8} {'fraction':>9} "
            f"{'ideal':>7} {'planned':>7}"
        )
        for k in r["ranks"]:
            a, b, c, d = k["tile"]
            print(
                f"  {k['rank']:>4} {f'{a}:{b}, {c}:{d}':<24} {k['bytes_read']:>12} {k['requests']:>8} "
                f"{k['fraction']:>9.3f} {k['ideal_fraction']:>7.3f} {k['planned_fraction']:>7.3f}"
            )
        print(f"  max fraction {r['max_fraction']:.3f} {'<=' if ok else '>'} bound {r['bound']:.3f}")
        if r["warning"]:
            print(f"  WARNING: {r['warning']}")
        if args.bench:
            b = throughput(args.path, m, spec, halo, args.bench, args.lead_steps, names=names)
            r["throughput"] = b
            print(
                f"  throughput (rank 0, {b['samples']} samples): tile reader "
                f"{b['tile_reader_samples_per_s']:.1f} samples/s, xarray whole field + slicing "
                f"{b['xarray_full_then_slice_samples_per_s']:.1f} samples/s ({b['speedup']:.2f}x)"
            )
        records.append(r)
    _write_json(args.json, records, IO_KEYS)
    return 1 if failed else 0
