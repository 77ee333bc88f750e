"""Run-directory preflight: writable, and room for every checkpoint the run will keep.

Called by the trainer before the first step (rank 0; the verdict is shared with every rank by
``on_rank0``) and by ``jigsaw-earth config validate``. The store, variable, period and
climatology checks live with the data code; these are the run directory's:

* ``check_writable``: ``run.dir`` (and ``checkpoints/``) can be created and written — a probe
  file is written and removed (``create=True``), or a probe folder is made and removed in the
  nearest existing parent (``create=False``: nothing is left behind);
* ``check_free_space``: the filesystem has room for ``(checkpoint.keep + 1)`` checkpoints (the
  kept ones plus the one being saved), less what this run's checkpoints already occupy. A
  checkpoint's size is estimated from the model with ``models.summary.checkpoint_bytes``.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import TypeVar

import torch

from ..fs_errors import explain
from ..layers.base import spec_of

__all__ = [
    "PreflightError",
    "check_free_space",
    "check_writable",
    "model_checkpoint_bytes",
    "preflight_run_dir",
]

log = logging.getLogger(__name__)
T = TypeVar("T")
_PROBE = ".jigsaw-earth-write-test"


class PreflightError(ValueError):
    """The run directory cannot hold this run (not writable, or too little space)."""


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**27 else f"{n / 2**20:.1f} MiB"


def _existing_parent(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable(run_dir: Path, create: bool) -> None:
    """``run_dir`` can be written: created with a probe file (``create``) or its parent is writable."""
    if create:
        ckpt = run_dir / "checkpoints"
        ckpt.mkdir(parents=True, exist_ok=True)
        probe = ckpt / _PROBE
        with open(probe, "w") as f:
            f.write("ok\n")
        probe.unlink()
        return
    parent = _existing_parent(run_dir)
    if not parent.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(parent))
    os.rmdir(tempfile.mkdtemp(prefix=_PROBE, dir=parent))  # a real write test that leaves nothing


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def check_free_space(run_dir: Path, ckpt_bytes: int, keep: int) -> None:
    """Room for ``keep + 1`` checkpoints of ``ckpt_bytes``; this run's own checkpoints count as room."""
    held = min(_dir_bytes(run_dir / "checkpoints"), keep * ckpt_bytes)
    need = (keep + 1) * ckpt_bytes - held
    free = shutil.disk_usage(_existing_parent(run_dir)).free
    if free < need:
        raise PreflightError(
            f"run.dir {str(run_dir)!r}: {_gib(free)} free, but checkpoint.keep={keep} needs room for "
            f"{keep} + 1 checkpoints of ~{_gib(ckpt_bytes)} (model + AdamW state)"
            f"{f', less {_gib(held)} already held' if held else ''} = {_gib(need)}; free space, lower "
            f"checkpoint.keep, or choose a run.dir on a larger filesystem"
        )
    log.debug("preflight: %s free for %d x %s checkpoints", _gib(free), keep + 1, _gib(ckpt_bytes))


def model_checkpoint_bytes(model: torch.nn.Module, writers: int = 1) -> int:
    """Checkpoint size of ``model`` (global shapes; ``writers`` domain ranks each write a block)."""
    from ..models.summary import checkpoint_bytes

    params = [p for p in model.parameters() if p.requires_grad]
    total = sum(math.prod(spec_of(p).global_shape) for p in params)
    return checkpoint_bytes(total, len(params), writers)


def preflight_run_dir(run_dir: Path, ckpt_bytes: int | None, keep: int, create: bool) -> None:
    """Both checks; ``ckpt_bytes=None`` skips the space check."""
    try:
        check_writable(run_dir, create)
    except OSError as err:
        reason = explain(err, "cannot write")
        raise PreflightError(f"run.dir {str(run_dir)!r} is not writable: {reason}") from err
    if ckpt_bytes is not None:
        check_free_space(run_dir, ckpt_bytes, keep)
