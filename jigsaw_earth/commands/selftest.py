"""``jigsaw-earth selftest [--device cuda|cpu] [--nproc N | --mesh MESH] [--models M,...]``: versions,
devices and their matrix-product rate, then a tiny run (train, validate, checkpoint, resume, predict
--score) on the device compared with the same steps on the CPU; exit 0 only when every comparison
agrees (``jigsaw_earth/selftest.py``).

The arguments are checked before anything runs: a device torch does not have here (or MPS, which
neither NCCL nor gloo serves), CUDA asked of a torch build or machine without it, a mesh the
selftest's models do not split over, and a ``--workdir`` that is not a folder. More processes than
GPUs is allowed: the ranks share the GPUs (``distributed/transport.py``)."""

from __future__ import annotations

import argparse
import errno
import logging
import tempfile
from pathlib import Path
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


def _check_device(device: str) -> None:
    """``--device``: auto, cpu, or a device this torch build and machine have (cuda, cuda:K, or an
    accelerator registered with torch); never MPS, which no process-group backend serves. More
    processes than GPUs is allowed: the ranks share them."""
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


def _fits(mesh: MeshShape, models: tuple[str, ...]) -> str | None:
    """Why a model of ``models`` does not split over ``mesh`` (``None``: each does); rank 0's model
    on the meta device (shapes only, nothing allocated)."""
    from ..config import parse_config
    from ..distributed.mesh import DomainMesh
    from ..layers.base import Domain
    from ..models import build_model
    from ..models.meta import meta_construction
    from ..selftest import GRID, tiny_config
    from .config import _model_args

    for name in models:
        cfg = parse_config(tiny_config(Path("selftest"), "check", "cpu", mesh.world_size, name, mesh))
        m = cfg.model
        try:
            with meta_construction():
                domain = Domain.create(DomainMesh(mesh, rank=0), *GRID)
                build_model(m.name, domain, *_model_args(cfg), m.preset, **m.overrides)
        except ValueError as err:
            return f"{name}: {err}"
    return None


def _check_mesh(args: argparse.Namespace) -> tuple[MeshShape, int, tuple[str, ...]]:
    """``--nproc`` / ``--mesh`` and ``--models``: the device runs' mesh, its processes and the models,
    each model split over that mesh of the selftest's grid."""
    from ..distributed.mesh import MeshShape, parse_mesh
    from ..selftest import GRID, MODELS, default_models

    if args.nproc is not None and args.nproc < 1:
        raise ValueError(f"--nproc {args.nproc}: give at least 1 (e.g. --nproc 2)")
    if args.mesh is None:
        nproc = args.nproc or 1
        mesh = MeshShape.squarest(nproc)
    else:
        mesh = parse_mesh(args.mesh)
        nproc = mesh.world_size
        if mesh.ensemble != 1:
            raise ValueError(
                f"--mesh {args.mesh}: selftest's runs have no ensemble axis; give LATxLON or DATAxLATxLON"
            )
        if args.nproc is not None and args.nproc != nproc:
            raise ValueError(
                f"--mesh {args.mesh} has {nproc} ranks but --nproc is {args.nproc}; give one of the two"
            )
    models = default_models(nproc)
    if args.models is not None:
        models = tuple(n.strip() for n in args.models.split(",") if n.strip())
        if not models or any(n not in MODELS for n in models):
            raise ValueError(f"--models {args.models!r}: choose from {', '.join(MODELS)} (comma-separated)")
    why = _fits(mesh, models)
    if why is not None:
        grid = f"{GRID[0]}x{GRID[1]} grid"
        if args.mesh is not None:
            raise ValueError(
                f"--mesh {args.mesh}: a selftest model on its {grid} does not split over it ({why})"
            )
        most = next(
            n for n in range(min(nproc, GRID[1]), 0, -1) if _fits(MeshShape.squarest(n), models) is None
        )
        raise ValueError(
            f"--nproc {nproc}: a selftest model on its {grid} does not split over a {mesh.lat}x{mesh.lon} "
            f"mesh ({why}); use --nproc {most} or fewer"
        )
    return mesh, nproc, models


def run(args: argparse.Namespace) -> int:
    from ..selftest import run_selftest

    _check_device(args.device)
    mesh, nproc, models = _check_mesh(args)
    where = args.workdir or tempfile.gettempdir()
    if args.workdir is not None and not Path(args.workdir).is_dir():
        raise ValueError(f"--workdir {args.workdir} is not a folder; give an existing folder to run in")
    try:
        lines, ok = run_selftest(args.device, nproc, args.workdir, mesh, models)
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
