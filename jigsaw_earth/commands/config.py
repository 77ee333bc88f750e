"""``jigsaw-earth config validate FILE [--world-size N] [--store PATH] [KEY=VALUE ...]``; ``config show``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from ..config import TrainConfig, describe, load_config, to_dict


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="check a training config without training, or list every field")
    csub = p.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    v = csub.add_parser("validate", help="parse and cross-check a config; print the resolved config")
    v.add_argument("config", help="YAML config file")
    v.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides such as mesh.lat=2")
    v.add_argument("--world-size", type=int, default=None, help="check the mesh against this many ranks")
    v.add_argument("--quiet", action="store_true", help="print only the verdict")
    v.add_argument(
        "--store",
        help="check the config against this store (default: data.store, when it is reachable)",
    )
    v.set_defaults(run=run_validate)
    s = csub.add_parser("show", help="every config field with its type, default and documentation")
    s.set_defaults(run=run_show)


def run_validate(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides, world_size=args.world_size)
    if not args.quiet:
        print(yaml.safe_dump(to_dict(cfg), sort_keys=False).rstrip())
    store = args.store or cfg.data.store
    if args.store or "://" in store or Path(store).exists():
        from ..data.preflight import store_preflight

        problems = store_preflight(cfg, store)
        if problems:
            print(f"config {args.config} does not fit store {store!r}:", file=sys.stderr)
            for problem in problems:
                print(f"- {problem}", file=sys.stderr)
            return 2
        print(f"store {store!r} fits the config (variables, levels, statics, step, periods, climatology)")
    else:
        print(f"store {store!r} is not reachable from here: store checks skipped (give --store PATH)")
    m = cfg.mesh
    print(
        f"config {args.config} is valid: mesh data={m.data} × lat={m.lat} × lon={m.lon} "
        f"({m.shape.world_size} ranks), global batch {cfg.training.batch_size} "
        f"({cfg.training.batch_size // m.data} per replica), {cfg.training.steps} steps"
    )
    return 0


def run_show(args: argparse.Namespace) -> int:
    print("\n".join(describe(TrainConfig)))
    return 0
