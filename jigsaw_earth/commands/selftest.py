"""``jigsaw-earth selftest [--device cuda|cpu] [--nproc N]``: versions, devices and their matrix-product
rate, then a tiny run (train, validate, checkpoint, resume, predict --score) on the device compared with
the same steps on the CPU; exit 0 only when every comparison agrees (``jigsaw_earth/selftest.py``).

The arguments are checked before anything runs: a device torch does not have here (or MPS, which
neither NCCL nor gloo serves), CUDA asked of a torch build or machine without it, more processes than
the selftest's grid has longitudes for, and a ``--workdir`` that is not a folder."""

from __future__ import annotations

import argparse
import errno
import logging
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)
GRID = (12, 24)  # the grid of the selftest's store (selftest.tiny_store)


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


def _check_device(device: str, nproc: int) -> None:
    """``--device``: auto, cpu, or a device this torch build and machine have (cuda, cuda:K, or an
    accelerator registered with torch); never MPS, which no process-group backend serves."""
    import torch

    kind, _, index = device.partition(":")
    fix = "use --device cpu (or cuda on an NVIDIA GPU)"
    try:
        torch.device("cpu" if kind == "auto" else device)
    except RuntimeError:
        raise ValueError(f"--device {device!r} is not a device torch knows; {fix}") from None
    if kind == "mps":
        raise ValueError(
            f"--device {device!r}: jigsaw-earth's ranks talk over NCCL (CUDA) or gloo (CPU), and neither "
            f"serves Apple's MPS; {fix}"
        )
    module = getattr(torch, kind, None)
    if kind not in ("auto", "cpu", "cuda") and not (module is not None and module.is_available()):
        raise ValueError(f"--device {device!r}: torch {torch.__version__} has no {kind} device here; {fix}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if kind == "cuda" and not gpus:
        build = f"CUDA {torch.version.cuda}, but it sees no GPU" if torch.version.cuda else "a CPU-only build"
        raise ValueError(
            f"--device {device}: torch {torch.__version__} is {build}; run selftest --device cpu, or install "
            f"the CUDA build of torch that matches the driver (nvidia-smi) on a machine with a GPU"
        )
    if kind == "cuda" and index and int(index) >= gpus:
        raise ValueError(
            f"--device {device}: torch sees {gpus} GPU{'s' * (gpus != 1)} (cuda:0 to cuda:{gpus - 1}); "
            f"choose one of them, or --device cuda"
        )
    if (kind == "cuda" or (kind == "auto" and gpus)) and nproc > gpus:
        raise ValueError(
            f"--nproc {nproc} needs {nproc} GPUs (one per process); torch sees {gpus}: lower --nproc or run "
            f"on a node with more GPUs"
        )


def _fits(nproc: int) -> str | None:
    """Why the selftest's model does not split over a 1 x ``nproc`` mesh (``None``: it does); rank 0's
    model on the meta device (shapes only, nothing allocated)."""
    from ..config import parse_config
    from ..distributed.mesh import DomainMesh, MeshShape
    from ..layers.base import Domain
    from ..models import build_model
    from ..models.meta import meta_construction
    from ..selftest import tiny_config
    from .config import _model_args

    cfg = parse_config(tiny_config(Path("selftest"), "check", "cpu", nproc))
    m = cfg.model
    try:
        with meta_construction():
            domain = Domain.create(DomainMesh(MeshShape(1, 1, nproc), rank=0), *GRID)
            build_model(m.name, domain, *_model_args(cfg), m.preset, **m.overrides)
    except ValueError as err:
        return str(err)
    return None


def _check_nproc(nproc: int) -> None:
    """``--nproc``: at least 1, and the selftest's model splits over a 1 x nproc mesh of its grid."""
    if nproc < 1:
        raise ValueError(f"--nproc {nproc}: give at least 1 (e.g. --nproc 2)")
    why = _fits(nproc)
    if why is not None:
        most = next(n for n in range(min(nproc, GRID[1]), 0, -1) if _fits(n) is None)
        raise ValueError(
            f"--nproc {nproc}: the selftest's model on its {GRID[0]}x{GRID[1]} grid does not split over a "
            f"1x{nproc} mesh ({why}); use --nproc {most} or fewer"
        )


def run(args: argparse.Namespace) -> int:
    from ..selftest import run_selftest

    _check_device(args.device, args.nproc)
    _check_nproc(args.nproc)
    where = args.workdir or tempfile.gettempdir()
    if args.workdir is not None and not Path(args.workdir).is_dir():
        raise ValueError(f"--workdir {args.workdir} is not a folder; give an existing folder to run in")
    try:
        lines, ok = run_selftest(args.device, args.nproc, args.workdir)
    except NotImplementedError as err:  # an accelerator backend without an operator the run needs
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ValueError(
            f"--device {args.device}: torch's backend lacks an operator the run needs ({first}); use "
            f"--device cpu (or cuda on an NVIDIA GPU)"
        ) from None
    except OSError as err:
        if err.filename is not None:
            raise  # the command line names the file
        code = errno.errorcode.get(err.errno or 0, "")
        raise ValueError(
            f"the selftest's run in {where} failed: {err.strerror or err}{f' [{code}]' if code else ''}; "
            f"free space there or pass --workdir DIR on another filesystem"
        ) from None
    print("\n".join(lines))
    return 0 if ok else 1
