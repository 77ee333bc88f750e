"""``jigsaw-earth score``: WB2 metrics of a forecast store per region, beside persistence,
climatology and the published baselines at the same resolution; optionally pictures (``--plot``).
A store with a member dimension (``number``) is scored as an ensemble (WB2's CRPS, spread/skill …)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np
import xarray as xr

from ..data.outputs import unfinished_reason
from ..data.store import open_dataset
from ..metrics.evaluate import check_times, evaluate, members, normalise
from ..metrics.regions import REGIONS
from ..metrics.scorecard import (
    check_scores_output,
    format_scorecard,
    grid_resolution,
    init_period,
    read_baselines,
    write_scores,
)

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "score", help="WeatherBench 2 RMSE/bias/ACC (and ensemble CRPS, spread/skill) of a forecast store"
    )
    p.add_argument("forecast", type=Path, metavar="FORECAST.zarr", help="dims time, prediction_timedelta, …")
    p.add_argument("--truth", type=Path, required=True, metavar="ERA5.zarr", help="verifying analysis")
    p.add_argument("--climatology", type=Path, metavar="CLIM.zarr", help="dims hour, dayofyear, … (for ACC)")
    p.add_argument(
        "--baselines", type=Path, metavar="CSV", help="published RMSEs (default: the shipped WB1/WB2 numbers)"
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
        type=Path,
        metavar="PREFIX",
        help="write PREFIX.json and PREFIX.csv (default: next to FORECAST)",
    )
    p.add_argument("--plot", type=Path, metavar="DIR", help="also write the scorecard and maps as PNGs here")
    p.set_defaults(run=run)


def _open(path: Path, what: str) -> xr.Dataset:
    if "://" not in str(path):
        if not path.exists():
            raise FileNotFoundError(f"{what} store {path} not found")
        why = unfinished_reason(path)
        if why is not None:
            raise ValueError(
                f"{what} store: {why}; score a finished store (run the command that writes it "
                f"again, then delete {path})"
            )
    return open_dataset(path)


def _absolute(path: Path) -> str:
    return str(path) if "://" in str(path) else str(path.resolve())


def _distinct(args: argparse.Namespace) -> None:
    """The forecast, truth and climatology must be three different stores."""
    given = [("FORECAST", args.forecast), ("--truth", args.truth), ("--climatology", args.climatology)]
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


def _outputs(args: argparse.Namespace, forecast: xr.Dataset) -> Path:
    """Check ``--out`` (or its default beside FORECAST) and ``--plot`` before any work."""
    from ..metrics.plots import check_plot_dir
    from ..metrics.regions import get_regions

    stores = (("forecast store", args.forecast), ("--truth store", args.truth),
              ("--climatology store", args.climatology))  # fmt: skip
    prefix = args.out or args.forecast.with_name(args.forecast.name.removesuffix(".zarr") + "-scores")
    check_scores_output(prefix, "--out", stores)
    if args.plot:
        variables = args.variables or [str(v) for v in forecast.data_vars]
        check_plot_dir(args.plot, [r.name for r in get_regions(args.regions)], variables, "--plot", stores)
    return prefix


def run(args: argparse.Namespace) -> int:
    _distinct(args)
    forecast = normalise(_open(args.forecast, "forecast"), "forecast")
    prefix = _outputs(args, forecast)
    if "time" in forecast.dims:
        check_times(forecast["time"].values, f"forecast {args.forecast}: init times")
    if args.start or args.end:
        forecast = forecast.sel(time=slice(args.start, args.end))
        if forecast.sizes["time"] == 0:
            raise ValueError(f"no init times between {args.start} and {args.end} in {args.forecast}")
    truth = _open(args.truth, "truth")
    clim = _open(args.climatology, "climatology") if args.climatology else None
    baselines = read_baselines(args.baselines)
    rows = evaluate(
        forecast, truth, clim, variables=args.variables, regions=args.regions, progress=sys.stderr.isatty()
    )
    resolution = grid_resolution(forecast.sizes["longitude"])
    times = forecast["time"].values
    first, last = (str(np.datetime_as_string(t, unit="h")) for t in (times.min(), times.max()))
    period = init_period(times)
    n_members = members(forecast)
    print(format_scorecard(rows, baselines, resolution, period, members=n_members))
    info = {  # absolute, so `plot` finds the stores from any directory
        "forecast": _absolute(args.forecast),
        "truth": _absolute(args.truth),
        "climatology": None if clim is None else _absolute(args.climatology),
        "baselines": None if args.baselines is None else str(args.baselines),
        "resolution": resolution,
        "inits": [first, last, int(times.size)],
        "members": n_members,
    }
    for path in write_scores(rows, prefix, info, "--out"):
        print(f"wrote {path}")
    if args.plot:
        from ..metrics.plots import plot_all

        for path in plot_all(rows, info, baselines, args.plot):
            print(f"wrote {path}")
    return 0
