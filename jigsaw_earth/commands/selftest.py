"""``jigsaw-earth selftest [--device cuda|cpu] [--nproc N]``: versions, devices and their matrix-product
rate, then a tiny run (train, validate, checkpoint, resume, predict --score) on the device compared with
the same steps on the CPU; exit 0 only when every comparison agrees (``jigsaw_earth/selftest.py``)."""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("selftest", help="is this machine ready? a tiny run on the device against the CPU")
    p.add_argument(
        "--device", default="auto", metavar="DEVICE",
        help="cuda, cpu, or auto (default: the GPU when torch sees one)",
    )  # fmt: skip
    p.add_argument(
        "--nproc", type=int, default=1, metavar="N",
        help="processes (mesh 1xN): one GPU each with NCCL, or CPU ranks with gloo (default 1)",
    )  # fmt: skip
    p.add_argument("--workdir", metavar="DIR", help="where the temporary run goes (default: the system's)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from ..selftest import run_selftest

    if args.nproc < 1:
        raise ValueError(f"--nproc {args.nproc}: give at least 1 (e.g. --nproc 2)")
    wants_gpus = args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())
    if wants_gpus and args.nproc > torch.cuda.device_count():
        raise ValueError(
            f"--nproc {args.nproc} needs {args.nproc} GPUs (one per process); torch sees "
            f"{torch.cuda.device_count()}: lower --nproc or run on a node with more GPUs"
        )
    lines, ok = run_selftest(args.device, args.nproc, args.workdir)
    print("\n".join(lines))
    return 0 if ok else 1
