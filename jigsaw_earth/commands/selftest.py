"""``jigsaw-earth selftest [--device cuda|cpu] [--nproc N | --mesh MESH] [--models M,...]``: versions,
devices and their matrix-product rate, then a tiny run (train, validate, checkpoint, resume, predict
--score) on the device compared with the same steps on the CPU; exit 0 only when every comparison
agrees (``jigsaw_earth/selftest.py``)."""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..distributed.mesh import MeshShape

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("selftest", help="is this machine ready? a tiny run on the device against the CPU")
    p.add_argument(
        "--device", default="auto", metavar="DEVICE",
        help="cuda, cpu, or auto (default: the GPU when torch sees one)",
    )  # fmt: skip
    p.add_argument(
        "--nproc", type=int, default=None, metavar="N",
        help="processes (default 1; the squarest lat x lon mesh of N): a GPU each with NCCL, ranks sharing "
        "the GPUs (messages staged through host memory) when N exceeds them, or CPU ranks with gloo",
    )  # fmt: skip
    p.add_argument(
        "--mesh", default=None, metavar="MESH",
        help="the device runs' mesh instead of --nproc's: LATxLON or DATAxLATxLON (e.g. 2x2, 2x1x2)",
    )  # fmt: skip
    p.add_argument(
        "--models", default=None, metavar="M,...",
        help="models compared: weathermixer, unet, vit (default: weathermixer on one process, all three "
        "on several: every kind of exchange)",
    )  # fmt: skip
    p.add_argument("--workdir", metavar="DIR", help="where the temporary run goes (default: the system's)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..selftest import run_selftest

    mesh, nproc = _mesh_of(args)
    models = _models_of(args.models)
    lines, ok = run_selftest(args.device, nproc, args.workdir, mesh, models)
    print("\n".join(lines))
    return 0 if ok else 1


def _mesh_of(args: argparse.Namespace) -> tuple[MeshShape, int]:
    """The device runs' mesh and process count from ``--mesh`` / ``--nproc``."""
    from ..distributed.mesh import parse_mesh
    from ..selftest import default_mesh

    if args.nproc is not None and args.nproc < 1:
        raise ValueError(f"--nproc {args.nproc}: give at least 1 (e.g. --nproc 2)")
    if args.mesh is None:
        nproc = args.nproc or 1
        return default_mesh(nproc), nproc
    mesh = parse_mesh(args.mesh)
    if mesh.ensemble != 1:
        raise ValueError(
            f"--mesh {args.mesh}: selftest's runs have no ensemble axis; give LATxLON or DATAxLATxLON"
        )
    if args.nproc is not None and args.nproc != mesh.world_size:
        raise ValueError(
            f"--mesh {args.mesh} has {mesh.world_size} ranks but --nproc is {args.nproc}; give one of the two"
        )
    return mesh, mesh.world_size


def _models_of(text: str | None) -> tuple[str, ...] | None:
    from ..selftest import MODELS

    if text is None:
        return None
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        raise ValueError(f"--models {text!r}: choose from {', '.join(MODELS)} (comma-separated)")
    return names
