"""``jigsaw-earth config validate FILE [--world-size N] [--store PATH] [key=value ...]``, ``config show``,
``config schema``.

``validate`` parses and cross-checks the config, then runs the run-directory preflight
(``training/preflight.py``: writable, room for ``keep + 1`` checkpoints estimated from the model
on the store's grid), the run-directory claim (would ``train`` refuse this ``run.dir``?) and, when
the store is reachable, the store preflight (``data/preflight.py``: variables, levels, statics,
step, periods, climatology; NaNs in the values training reads, ``--nans``), and the loss/ensemble
advice (``config/advice.py``).
"""

from __future__ import annotations

import argparse
import json
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
    v.add_argument(
        "--nans",
        choices=["auto", "sample", "full", "none"],
        default="auto",
        help="NaNs in the values training reads: every time of the periods up to 2 GiB, else 5 of them "
        "(auto, the default); 5 times; every time; or none",
    )
    v.set_defaults(run=run_validate)
    s = csub.add_parser("show", help="every config field with its type, default and documentation")
    s.set_defaults(run=run_show)
    j = csub.add_parser("schema", help="JSON schema of the config for editors (YAML language server)")
    j.add_argument("--out", type=Path, metavar="PATH", help="write it to PATH (default: print it)")
    j.set_defaults(run=run_schema)


def run_validate(args: argparse.Namespace) -> int:
    if args.world_size is not None and args.world_size < 1:
        raise ValueError(
            f"--world-size {args.world_size}: give the number of ranks, a positive integer "
            f"(e.g. --world-size 4), or leave it out"
        )
    cfg = load_config(args.config, args.overrides, world_size=args.world_size)
    from ..config.advice import check_learnable

    for warning in check_learnable(cfg):  # errors raise; warnings are printed
        print(f"warning: {warning}", file=sys.stderr)
    _check_freeze(cfg)  # a pattern that matches no module: train's refusal
    note = _preflight(cfg, args.config, args.overrides)
    if not args.quiet:
        print(yaml.safe_dump(to_dict(cfg), sort_keys=False).rstrip())
    store = args.store or cfg.data.store
    if args.store or "://" in store or Path(store).exists():
        from ..data.preflight import store_nans, store_preflight

        problems, scanned = store_preflight(cfg, store), "none"
        if not problems:
            problems, scanned = store_nans(cfg, store, args.nans)
        if problems:
            print(f"config {args.config} does not fit store {store!r}:", file=sys.stderr)
            for problem in problems:
                print(f"- {problem}", file=sys.stderr)
            return 2
        scanned = {"sample": "; no NaN at 5 times of the periods (--nans full scans every time)",
                   "full": "; no NaN in the periods", "none": ""}[scanned]  # fmt: skip
        print(
            f"store {store!r} fits the config (variables, levels, statics, step, periods, climatology)"
            f"{scanned}"
        )
    else:
        print(f"store {store!r} is not reachable from here: store checks skipped (give --store PATH)")
    m, t = cfg.mesh, cfg.training
    members = ""
    if t.members > 1:
        members = f", {t.members} members per sample ({t.members // m.ensemble} per rank)"
    print(
        f"config {args.config} is valid: mesh {m.shape.describe()} "
        f"({m.shape.world_size} ranks), global batch {t.batch_size} "
        f"({t.batch_size // m.data} per replica){members}, {t.steps} steps; {note}"
    )
    return 0


def _preflight(cfg: TrainConfig, config_file: str | None = None, overrides: list[str] | None = None) -> str:
    """The run-directory checks of ``train``, without creating anything; returns a summary."""
    from ..training.preflight import preflight_run_dir
    from ..training.rundir import check_place, claim_run_dir, finished_step

    run_dir = Path(cfg.run.dir)
    check_place(cfg, config_file, overrides or ())
    size = _checkpoint_estimate(cfg)
    preflight_run_dir(run_dir, size, cfg.checkpoint.keep, create=False)
    claim_run_dir(cfg)  # refuses a run.dir holding another run's checkpoints (changes nothing)
    done = finished_step(cfg)
    finished = "" if done is None else (
        f"; it holds this run, finished at step {done} (train changes nothing; raise training.steps to "
        f"continue it)")  # fmt: skip
    if size is None:
        return f"run.dir {run_dir} writable (space not checked: the store's grid is unknown){finished}"
    keep = cfg.checkpoint.keep
    return (f"run.dir {run_dir} writable with room for {keep} + 1 checkpoints of {size / 2**20:.1f} MiB"
            f"{finished}")  # fmt: skip


def _store_grid(cfg: TrainConfig) -> tuple[int, int] | None:
    from ..data.store import StoreView

    try:
        return StoreView.open(cfg.data.store).grid_shape
    except Exception:  # the data checks report an unreadable store
        return None


def _model_args(cfg: TrainConfig) -> tuple[int, int, int]:
    """(state, static, time) channels of the config's model (as ``data/sources.py`` counts them)."""
    d = cfg.data
    n_state = len(d.upper_air) * len(d.levels) + len(d.surface)
    n_static = len(d.static) + 4 + cfg.model.noise_channels  # + geometry channels (data/sources.py)
    return n_state, n_static, 4


def _checkpoint_estimate(cfg: TrainConfig) -> int | None:
    """Checkpoint bytes of the config's model on the store's grid (``None`` if the store is unreadable)."""
    from ..distributed.mesh import MeshShape
    from ..models.summary import summarize

    grid = _store_grid(cfg)
    if grid is None:
        return None
    m = cfg.model
    shape = MeshShape(1, cfg.mesh.lat, cfg.mesh.lon)
    s = summarize(m.name, shape, grid, *_model_args(cfg), preset=m.preset, **m.overrides)
    return s.checkpoint_bytes


def _check_freeze(cfg: TrainConfig) -> None:
    """``training.freeze`` against the config's model (one rank's, built on the meta device): the
    refusal ``train`` gives. Skipped when the store's grid is unknown."""
    if not cfg.training.freeze:
        return
    from ..distributed.mesh import MeshShape
    from ..models.summary import rank_models
    from ..training.finetune import frozen_parameters

    grid = _store_grid(cfg)
    if grid is None:
        return
    m = cfg.model
    model = rank_models(m.name, MeshShape(1, 1, 1), grid, *_model_args(cfg), m.preset, **m.overrides)[0]
    frozen_parameters(model, cfg.training.freeze)


def run_schema(args: argparse.Namespace) -> int:
    from ..config.json_schema import json_schema
    from .checked_write import write_json

    schema = json_schema()
    if args.out is None:
        print(json.dumps(schema, indent=1))
        return 0
    write_json(args.out, schema, "--out", "title", "properties")
    print(f"wrote the config's JSON schema to {args.out}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    print("\n".join(describe(TrainConfig)))
    return 0
