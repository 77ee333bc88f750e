"""``jigsaw-earth predict``: sharded inference into one WB2-layout forecast Zarr store."""

from __future__ import annotations

import argparse
import os

import numpy as np

from ..config import load_config


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "predict", help="forecast from a trained run; all ranks write one WB2-layout Zarr store"
    )
    p.add_argument("config", help="the run's YAML config (e.g. configs/demo.yaml or RUN_DIR/config.yaml)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. mesh.lon=4")
    p.add_argument("--out", required=True, help="forecast store to write (WB2 forecast layout)")
    p.add_argument("--checkpoint", help="checkpoint folder; default: the newest in run.dir")
    p.add_argument("--start", help="first initialisation time (default: data.val_period[0])")
    p.add_argument("--end", help="last initialisation time (default: data.val_period[1])")
    p.add_argument("--steps", type=int, default=4, help="forecast steps of data.step_hours (default 4)")
    p.add_argument("--every-hours", type=int, default=12, help="initialise at multiples of this hour")
    p.add_argument("--max-inits", type=int, default=0, help="at most this many inits, evenly spaced")
    p.add_argument("--batch-size", type=int, default=2, help="initialisations per forward")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out store")
    p.set_defaults(run=run)


def _check_period(start: str, end: str) -> None:
    for option, text in (("--start", start), ("--end", end)):
        try:
            np.datetime64(text, "h")
        except ValueError:
            raise ValueError(f"{option} {text!r} is not a date; write YYYY-MM-DD or YYYY-MM-DDTHH") from None
    if np.datetime64(start, "h") > np.datetime64(end, "h"):
        raise ValueError(f"--start {start} is after --end {end}; swap them")


def run(args: argparse.Namespace) -> int:
    from ..inference.predict import run_prediction
    from ..training.runner import world_size_from_env

    cfg = load_config(args.config, args.overrides, world_size=world_size_from_env())
    period = cfg.data.val_period or ["", ""]
    start, end = args.start or period[0], args.end or period[-1]
    if not start or not end:
        raise ValueError("give --start and --end (the config has no data.val_period to default to)")
    _check_period(start, end)
    path = run_prediction(
        cfg,
        args.out,
        checkpoint=args.checkpoint,
        start=start,
        end=end,
        steps=args.steps,
        every_hours=args.every_hours,
        max_inits=args.max_inits,
        batch_size=args.batch_size,
        overwrite=args.overwrite,
    )
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"wrote {path}; open it with xarray.open_zarr({str(path)!r})")
    return 0
