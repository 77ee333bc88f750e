"""``jigsaw-earth score``: WB2 metrics of a forecast store per region, beside persistence,
climatology and the published baselines at the same resolution; optionally pictures (``--plot``).
A store with a member dimension (``number``) is scored as an ensemble (WB2's CRPS, spread/skill …).
Every score has an interval (``--method``, ``--confidence``); the forecast is compared with the
baselines and ``--against`` another forecast (differences, p-values, corrected over the cells; a
deterministic ``--against`` store beside an ensemble is scored as a one-member ensemble, whose CRPS is its
MAE, so the CRPS difference is paired too); the per-init statistics are written beside the scores, and
FORECAST may be such files instead of a store."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np
import xarray as xr

from ..argtypes import URL, path_or_url
from ..data.store import open_dataset
from ..metrics.engine import MEMBER
from ..metrics.evaluate import evaluate_statistics, normalise
from ..metrics.intervals import METHODS
from ..metrics.regions import REGIONS
from ..metrics.scorecard import (
    check_scores_output,
    format_scorecard,
    grid_resolution,
    init_period,
    read_baselines,
    write_scores,
)
from ..metrics.significance import CORRECTIONS, IntervalOptions, compare_rows, score_rows
from ..metrics.significance_card import format_comparisons
from ..metrics.statistics import SUFFIX, Statistics, check_times, stats_path
from ..ownership import read_marker, unfinished_reason

log = logging.getLogger(__name__)
BASELINE_MODELS = ("persistence", "climatology")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "score", help="WeatherBench 2 RMSE/bias/ACC (and ensemble CRPS, spread/skill) of a forecast store"
    )
    p.add_argument(
        "forecast", type=path_or_url, nargs="+", metavar="FORECAST",
        help="a forecast store (dims time, prediction_timedelta, …), or PREFIX-stats.nc files of earlier "
        "scores (campaigns joined on their inits)",
    )  # fmt: skip
    p.add_argument("--truth", type=path_or_url, metavar="ERA5.zarr", help="verifying analysis (for a store)")
    p.add_argument(
        "--climatology", type=path_or_url, metavar="CLIM.zarr", help="dims hour, dayofyear, … (for ACC)"
    )
    p.add_argument(
        "--baselines",
        type=path_or_url,
        metavar="CSV",
        help="published RMSEs (default: the shipped WB1/WB2 numbers)",
    )
    p.add_argument("--variables", nargs="+", metavar="NAME", help="score only these variables")
    p.add_argument(
        "--regions",
        nargs="+",
        default=["global"],
        metavar="NAME",
        help=f"WB2 regions to score, or 'all' (default global): {', '.join(REGIONS)}",
    )
    p.add_argument("--start", help="first init time (e.g. 2020-01-01)")
    p.add_argument("--end", help="last init time")
    p.add_argument(
        "--out",
        type=path_or_url,
        metavar="PREFIX",
        help="write PREFIX.json, PREFIX.csv and PREFIX-stats.nc (default: next to FORECAST)",
    )
    p.add_argument(
        "--plot", type=path_or_url, metavar="DIR", help="also write the scorecard and maps as PNGs here"
    )
    g = p.add_argument_group("intervals and significance (docs/metrics.md, 'Intervals')")
    g.add_argument(
        "--against", type=path_or_url, metavar="OTHER",
        help="compare with a second forecast store (scored as FORECAST) or its PREFIX-stats.nc, on the "
        "inits both have",
    )  # fmt: skip
    g.add_argument("--method", default="ar2", choices=METHODS, help="interval method (default ar2)")
    g.add_argument("--confidence", type=float, default=0.95, help="interval level (default 0.95)")
    g.add_argument(
        "--correction", default="holm", choices=CORRECTIONS,
        help="multiple-testing correction over a comparison's cells (default holm; bh: Benjamini–Hochberg)",
    )  # fmt: skip
    g.add_argument("--replicates", type=int, default=1000, help="bootstrap resamples (default 1000)")
    g.add_argument("--seed", type=int, default=0, help="bootstrap random seed (default 0)")
    p.set_defaults(run=run)


def _open(path: Path, what: str) -> xr.Dataset:
    why = unfinished_reason(path) if "://" in str(path) else None  # a bucket's store: its marker
    if why is not None:
        raise ValueError(f"{what} store: {why}; score a finished store (run the command that writes it "
                         f"again)")  # fmt: skip
    if "://" not in str(path):
        if not path.exists():
            raise FileNotFoundError(f"{what} store {path} not found")
        why = unfinished_reason(path)
        if why is not None:
            raise ValueError(
                f"{what} store: {why}; score a finished store (run the command that writes it "
                f"again, then delete {path})"
            )
        files = (read_marker(path) or {}).get("format")
        if files is not None and files != "zarr":
            raise ValueError(
                f"{what} {path} is a folder of {files} files (predict --format {files}); score reads a "
                f"Zarr store: predict the same forecast with --format zarr, or score it as it runs (predict "
                f"--score)"
            )
    return open_dataset(path)


def _absolute(path: Path | str) -> str:
    return str(path) if "://" in str(path) else str(path.resolve())


def _is_statistics(paths: list[Path]) -> bool:
    """FORECAST names statistics files (``.nc``: read as such, a missing one said so), not a store; a
    mix is refused."""
    kinds = {str(p).endswith(".nc") and not URL.match(str(p)) for p in paths}
    if len(kinds) > 1 or (len(paths) > 1 and kinds != {True}):
        raise ValueError(
            f"FORECAST {[str(p) for p in paths]}: give one forecast store, or one or more PREFIX-stats.nc "
            f"files to join, not a mix"
        )
    return kinds == {True}


def _distinct(args: argparse.Namespace) -> None:
    """The forecast, truth and climatology must be three different stores."""
    given = [("FORECAST", args.forecast[0]), ("--truth", args.truth), ("--climatology", args.climatology)]
    seen: dict[str, str] = {}
    for option, path in given:
        if path is None:
            continue
        key = str(path) if "://" in str(path) else str(Path(path).resolve())
        if key in seen:
            raise ValueError(
                f"{option} {path} is the same store as {seen[key]}; pass the verifying analysis "
                f"(e.g. the ERA5 store) as --truth and its climatology as --climatology"
            )
        seen[key] = option


def _outputs(args: argparse.Namespace, variables: list[str], stats_input: bool) -> Path:
    """Check ``--out`` (or its default beside FORECAST) and ``--plot`` before any work."""
    from ..metrics.plots import check_plot_dir
    from ..metrics.regions import get_regions

    stores = (("forecast store", args.forecast[0]), ("--truth store", args.truth),
              ("--climatology store", args.climatology), ("--against", args.against))  # fmt: skip
    first = args.forecast[0]
    if stats_input:  # beside the first file, named by the method: never over the file read
        default = first.with_name(first.name.removesuffix(SUFFIX) + f"-{args.method}")
        stores = (("--against", args.against), ("--truth store", args.truth),
                  ("--climatology store", args.climatology))  # fmt: skip
    elif args.out is None and isinstance(first, str):
        raise ValueError(f"FORECAST {first} is a URL: give --out PREFIX, a local prefix for the scores")
    else:
        default = first.with_name(first.name.removesuffix(".zarr") + "-scores")
    prefix = args.out or default
    if stats_input and any(stats_path(prefix).resolve() == p.resolve() for p in args.forecast):
        raise ValueError(f"--out {prefix} would overwrite the statistics it reads; choose another --out")
    check_scores_output(prefix, "--out", stores)
    if args.plot:
        regions = args.regions if stats_input else [r.name for r in get_regions(args.regions)]
        check_plot_dir(args.plot, regions, variables, "--plot", stores, against=_label(args))
    return prefix


def _label(args: argparse.Namespace) -> list[str]:
    """The names the comparisons give their second forecasts (built-in baselines, ``--against``)."""
    names = list(BASELINE_MODELS)
    if args.against is not None:
        names.append(_name_of(args.against))
    return names


def _name_of(path: Path | str) -> str:
    name = str(path).rstrip("/").rsplit("/", 1)[-1]
    return name.removesuffix(SUFFIX).removesuffix(".zarr").removesuffix("-scores") or "against"


def _store_statistics(
    args: argparse.Namespace, path: Path, truth: xr.Dataset, clim: xr.Dataset | None, baselines: bool = True,
    one_member: bool = False,
) -> Statistics:  # fmt: skip
    """``one_member``: a deterministic store is scored as an ensemble of one member (CRPS = MAE)."""
    forecast = normalise(_open(path, "forecast"), "forecast")
    if one_member and MEMBER not in forecast.dims:
        forecast = forecast.expand_dims({MEMBER: [0]}, axis=2)
    if "time" in forecast.dims:
        check_times(forecast["time"].values, f"forecast {path}: init times")
    if args.start or args.end:
        forecast = forecast.sel(time=slice(args.start, args.end))
        if forecast.sizes["time"] == 0:
            raise ValueError(f"no init times between {args.start} and {args.end} in {path}")
    stats = evaluate_statistics(forecast, truth, clim, variables=args.variables, regions=args.regions,
                                baselines=baselines, progress=sys.stderr.isatty())  # fmt: skip
    stats.ds.attrs.update(forecast=_absolute(path), resolution=grid_resolution(forecast.sizes["longitude"]))
    for what in ("truth", "climatology"):  # what they were computed against, checked by every comparison
        given = getattr(args, what)
        if given is not None:
            stats.ds.attrs[what] = _absolute(given)
    stats.source = str(path)
    return stats


def _read_statistics(args: argparse.Namespace) -> Statistics:
    """FORECAST's statistics files, joined; ``--truth`` and ``--climatology`` only serve to score an
    ``--against`` store (on the statistics' regions)."""
    against_store = args.against is not None and not _is_statistics([args.against])
    for option in ("variables", "start", "end", *(() if against_store else ("truth", "climatology"))):
        if getattr(args, option):
            raise ValueError(
                f"--{option} applies to a forecast store; FORECAST is statistics, scored as written "
                f"(leave --{option} out, or score the store)"
            )
    stats = Statistics.join([Statistics.read(p) for p in args.forecast])
    args.regions = [str(r) for r in stats.ds["region"].values]
    return stats


def _against(args: argparse.Namespace, truth, clim, ensemble: bool = False) -> Statistics:
    """The ``--against`` forecast's statistics (``ensemble``: FORECAST is one, so a deterministic store is
    scored as a one-member ensemble beside it)."""
    if _is_statistics([args.against]):
        other = Statistics.read(args.against)
    else:
        if truth is None:
            raise ValueError(f"--against {args.against} is a forecast store: give --truth to score it")
        other = _store_statistics(args, args.against, truth, clim, baselines=False, one_member=ensemble)
    return other.renamed(_model(other), "against")


def _model(stats: Statistics) -> str:
    """The forecast's name among the models of ``stats`` (the one that is not a built-in baseline)."""
    return next(m for m in stats.models if m not in BASELINE_MODELS)


def run(args: argparse.Namespace) -> int:
    opts = IntervalOptions(args.method, args.confidence, args.replicates, args.seed, args.correction)
    stats_input = _is_statistics(args.forecast)
    stats = None
    if not stats_input:
        if len(args.forecast) > 1:
            raise ValueError("give one forecast store (several FORECAST are statistics files to join)")
        if args.truth is None:
            raise ValueError("--truth is required to score a forecast store; e.g. --truth ERA5.zarr")
        _distinct(args)
        forecast = normalise(_open(args.forecast[0], "forecast"), "forecast")
        variables = args.variables or [str(v) for v in forecast.data_vars]
    else:
        stats = _read_statistics(args)
        variables = list(dict.fromkeys(str(v) for v in stats.ds["variable"].values))
    prefix = _outputs(args, variables, stats_input)
    truth = _open(args.truth, "truth") if args.truth else None
    clim = _open(args.climatology, "climatology") if args.climatology else None
    baselines = read_baselines(args.baselines)
    if stats is None:
        stats = _store_statistics(args, args.forecast[0], truth, clim)
    model = _model(stats)
    rows = score_rows(stats, opts)
    comparisons = []
    for base in BASELINE_MODELS:
        if base in stats.models:
            comparisons += compare_rows(stats, model, stats, base, opts)
    if args.against is not None:
        other = _against(args, truth, clim, ensemble=stats.ds.attrs.get("members") is not None)
        comparisons += compare_rows(stats, model, other, "against", opts, _name_of(args.against))
    times = stats.times
    first, last = (str(np.datetime_as_string(t, unit="h")) for t in (times.min(), times.max()))
    resolution = stats.ds.attrs.get("resolution", "?")
    n_members = stats.ds.attrs.get("members")
    n_members = None if n_members is None else int(n_members)  # netCDF gives numpy integers
    interval = opts.info(int(times.size))
    period = init_period(times)
    print(format_scorecard(rows, baselines, resolution, period, members=n_members, interval=interval))
    print(format_comparisons(comparisons, interval))
    info = {  # absolute, so `plot` finds the stores from any directory
        "forecast": stats.ds.attrs.get("forecast"),
        "truth": _absolute(args.truth) if args.truth else stats.ds.attrs.get("truth"),
        "climatology": _absolute(args.climatology) if args.climatology else stats.ds.attrs.get("climatology"),
        "baselines": None if args.baselines is None else str(args.baselines),
        "resolution": resolution,
        "inits": [first, last, int(times.size)],
        "members": n_members,
        "interval": interval,
    }
    stats.ds.attrs.update({k: v for k, v in info.items() if k in ("truth", "climatology") and v})
    for path in write_scores(rows, prefix, info, "--out", statistics=stats, comparisons=comparisons):
        print(f"wrote {path}")
    if args.plot:
        from ..metrics.plots import plot_all

        for path in plot_all(rows, info, baselines, args.plot, comparisons=comparisons):
            print(f"wrote {path}")
    return 0
