"""``jigsaw-earth ensemble calibrate CONFIG --perturb SCHEME``: sweep a perturbation's amplitude on
validation inits, print the table and write the choice for ``predict --perturb``
(``inference/calibrate.py``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..config import load_config
from .checked_write import check_json, write_json
from .perturb_options import add_perturb_arguments, perturbation_from_args

__all__ = ["add_parser", "run"]

KEYS = ("kind", "scheme", "amplitude")


def add_parser(sub: argparse._SubParsersAction) -> None:
    from ..inference.calibrate import BY

    p = sub.add_parser("ensemble", help="ensembles from any model: calibrate a perturbation scheme")
    esub = p.add_subparsers(dest="ensemble_command", required=True, metavar="SUBCOMMAND")
    c = esub.add_parser(
        "calibrate",
        help="sweep a --perturb scheme's amplitude on validation inits; write the best for predict",
    )
    c.add_argument("config", help="the run's YAML config (e.g. configs/demo.yaml)")
    c.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. mesh.lon=4")
    add_perturb_arguments(c, calibrating=True)
    c.add_argument(
        "--amplitudes",
        nargs="+",
        type=float,
        metavar="A",
        help="the coarse sweep (default 0.1 0.3 1 3 10; --scale std 0.01 … 1; lagged 0.25 … 2)",
    )
    c.add_argument("--members", type=int, default=8, help="ensemble size (default 8)")
    c.add_argument("--lead-hours", type=int, default=24, help="the lead judged (default 24)")
    c.add_argument(
        "--by",
        choices=BY,
        default="spread-skill",
        help="spread-skill: mean |log spread/skill| nearest 0 (default); crps: lowest CRPS",
    )
    c.add_argument(
        "--fields",
        nargs="+",
        metavar="NAME",
        help="fields judged: variable@level or surface name (default validation.variables)",
    )
    c.add_argument(
        "--first-init",
        "--start",
        dest="start",
        metavar="TIME",
        help="first init (default data.val_period[0])",
    )
    c.add_argument(
        "--last-init", "--end", dest="end", metavar="TIME", help="last init (default val_period[1])"
    )
    c.add_argument("--every-hours", type=int, default=12, help="inits at multiples of this hour (default 12)")
    c.add_argument("--max-inits", type=int, default=32, help="at most this many inits, evenly spaced")
    c.add_argument("--seed", type=int, help="the perturbations' seed (default run.seed)")
    c.add_argument("--checkpoint", help="checkpoint folder; default: the newest in run.dir")
    c.add_argument("--batch-size", type=int, help="inits per forward (default: what memory holds)")
    c.add_argument(
        "--out",
        type=Path,
        metavar="FILE",
        help="settings written (default RUN_DIR/perturb-SCHEME.json: predict reads it)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import os

    from ..inference.calibrate import calibrate, format_table, settings
    from ..inference.perturb import settings_path
    from ..inference.progress import Stopped
    from ..mesh_setup import world_size_from_env

    cfg = load_config(args.config, args.overrides, world_size=world_size_from_env())
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    args.amplitude = 1.0  # a placeholder: the sweep sets it
    base = perturbation_from_args(args, cfg)
    out = args.out or settings_path(cfg, args.perturb)
    check_json(out, "--out", *KEYS, protected=(("data store data.store", cfg.data.store),))
    period = cfg.data.val_period or ["", ""]
    start, end = args.start or period[0], args.end or period[-1]
    if not start or not end:
        raise ValueError("give --first-init and --last-init (the config has no data.val_period)")
    try:
        result = calibrate(
            cfg,
            base,
            amplitudes=args.amplitudes,
            members=args.members,
            lead_hours=args.lead_hours,
            by=args.by,
            fields=args.fields,
            start=start,
            end=end,
            every_hours=args.every_hours,
            max_inits=args.max_inits,
            seed=args.seed,
            checkpoint=args.checkpoint,
            batch_size=args.batch_size,
        )
    except Stopped as err:
        if rank == 0:
            print(f"jigsaw-earth ensemble: {err}; nothing was written", file=sys.stderr)
        return err.exit_code
    if rank == 0:
        print(format_table(result))
        write_json(out, settings(result, args.checkpoint), "--out", *KEYS)
        amplitude = result.chosen.amplitude
        print(f"wrote {out}: predict --perturb {args.perturb} reads it (amplitude {amplitude:.4g})")
    return 0
