"""``jigsaw-earth model export`` and ``model verify``: share a trained model as one folder, and check one.

::

    torchrun --nproc-per-node 4 -m jigsaw_earth model export runs/demo/train --out runs/demo/model \
        --license apache-2.0
    jigsaw-earth model verify runs/demo/model

``export`` runs on the ranks of a mesh (the run's, when the job has its world size; else the
squarest ``lat × lon`` mesh of the job), every rank writing its own blocks (``sharing/export.py``).
``verify`` exits 0 when every file is as exported and the reference forecast matches, 1 when not
(each difference on a line), 2 when the folder cannot be read (a missing or truncated file, a
changed contract: one line naming it).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

__all__ = ["add_actions", "run_export", "run_verify"]


def add_actions(actions: argparse._SubParsersAction) -> None:
    e = actions.add_parser(
        "export",
        help="a trained run's model as one folder: safetensors weights, input contract, card, reference",
    )
    e.add_argument(
        "source", metavar="RUN", help="a run directory (its newest checkpoint) or a checkpoint folder"
    )
    e.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. mesh.lon=4")
    e.add_argument("--out", required=True, help="the folder to write (uploads to Hugging Face as it is)")
    e.add_argument(
        "--license",
        required=True,
        help="the model card's license, e.g. apache-2.0, cc-by-4.0, mit (your choice)",
    )
    e.add_argument(
        "--scores", type=Path, metavar="PREFIX.json", help="validation scores of `jigsaw-earth score`"
    )
    e.add_argument("--dataset", nargs="+", default=[], metavar="NAME", help="the card's datasets, e.g. era5")
    e.add_argument("--max-file-size", default="5GB", metavar="SIZE", help="largest weight file (default 5GB)")
    e.add_argument(
        "--reference-steps", type=int, default=2, metavar="N", help="steps of the reference (default 2)"
    )
    e.add_argument("--overwrite", action="store_true", help="replace an earlier export at --out")
    e.set_defaults(run=run_export)
    v = actions.add_parser("verify", help="check a model folder's files and rerun its reference forecast")
    v.add_argument("folder", metavar="DIR", help="a folder written by `jigsaw-earth model export`")
    v.add_argument("--device", default="cpu", help="where the reference runs (default cpu)")
    v.add_argument(
        "--no-twin", action="store_true", help="run the one-rank jigsaw model, not the plain-PyTorch twin"
    )
    v.set_defaults(run=run_verify)


def _run_config(run: str) -> tuple[Path, Path]:
    """The config file and checkpoint of ``RUN`` (a run directory or one of its checkpoints)."""
    from ..checkpoint import latest_checkpoint, read_meta

    path = Path(run)
    if (path / "meta.json").is_file():
        read_meta(path)
        ckpt, run_dir = path, path.parent.parent
    else:
        found = latest_checkpoint(path) if path.is_dir() else None
        if found is None:
            what = "holds no complete checkpoint" if path.is_dir() else "does not exist"
            raise ValueError(
                f"RUN {run} {what}; give a run directory with checkpoints/step_N (train first) or a "
                "checkpoint folder RUN/checkpoints/step_N"
            )
        ckpt, run_dir = found, path
    config = run_dir / "config.yaml"
    if not config.is_file():
        raise ValueError(f"{config} not found: RUN must be the run directory `train` wrote (its config.yaml)")
    return config, ckpt


def run_export(args: argparse.Namespace) -> int:
    from ..argtypes import parse_bytes
    from ..config import parse_config
    from ..config.parse import load_yaml
    from ..mesh_setup import world_size_from_env
    from ..sharing.export import ExportRequest, export_model
    from ..sharing.use import fit_mesh

    config, ckpt = _run_config(args.source)
    world = world_size_from_env()
    raw: dict[str, Any] = load_yaml(config.read_text()) or {}
    cfg = parse_config(fit_mesh(raw, args.overrides, world), args.overrides)
    cfg.check(world)
    request = ExportRequest(
        out=Path(args.out),
        license=args.license,
        overwrite=args.overwrite,
        max_file_bytes=parse_bytes(args.max_file_size, "--max-file-size", "5GB"),
        scores=args.scores,
        datasets=tuple(args.dataset),
        reference_steps=args.reference_steps,
    )
    out = export_model(cfg, ckpt, request)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"exported {ckpt} to {out}; check it with `jigsaw-earth model verify {out}`")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from ..sharing.verify import verify_model

    result = verify_model(args.folder, args.device, twin=not args.no_twin)
    for line in result.problems:
        print(f"DIFFERS  {line}")
    verdict = "matches" if result.ok else f"does NOT match ({len(result.problems)} difference(s) above)"
    print(
        f"{args.folder}: {result.files} files checked against the export; reference forecast "
        f"{result.compared} statistics, largest deviation {result.worst:.3g} of the tolerance: {verdict}"
    )
    return 0 if result.ok else 1
