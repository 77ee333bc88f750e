"""Forecasts in progress: one folder per output, a lock while it is written, and the abandoned ones.

``predict --out OUT`` writes ``OUT.in-progress`` and renames it to ``OUT`` once every init is written;
a score-only run with ``--scores PREFIX`` keeps its progress in ``PREFIX.in-progress``. The folder is
a Zarr group marked ``jigsaw_earth = {kind: forecast, complete: false}`` (the forecast written so far;
no arrays for a score-only run) with ``_progress/`` beside the arrays (``progress.py``: the request,
each rank's batches done, their score shares) and ``_progress/lock``: the host, process and Slurm job
that writes it. A lock is stale when its process is gone from this host, or when its Slurm job is this
one (``sbatch --requeue`` keeps the job id); a stale lock is taken over, a live one refuses a second
predict. ``find_unfinished`` lists predict's own unfinished folders (``*.in-progress`` holding
``_progress``, and ``*.tmp-*`` forecast stores of earlier versions) and nothing else;
``remove_unfinished`` deletes only those, and none that a live process holds.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..data.outputs import IN_PROGRESS, kind_of, read_marker
from ..locks import pid_alive, start_time

__all__ = ["PROGRESS", "Lock", "Unfinished", "describe", "find_unfinished", "remove_unfinished"]

log = logging.getLogger(__name__)

PROGRESS = "_progress"  # inside the in-progress folder: what a resume needs
REQUEST = "request.json"
FORMAT = "jigsaw-earth predict progress"
KIND = "forecast"


def holder_is_live(info: dict[str, Any]) -> bool:
    """Whether the process that wrote lock ``info`` may still be writing (unknown hosts: yes)."""
    job = os.environ.get("SLURM_JOB_ID")
    if job and info.get("slurm_job") == job:
        return False  # this job before its requeue: Slurm ended every task of it
    if info.get("host") != socket.gethostname():
        return True
    return pid_alive(int(info.get("pid", -1)), info.get("start"))


def _holder_text(info: dict[str, Any]) -> str:
    job = f", Slurm job {info['slurm_job']}" if info.get("slurm_job") else ""
    return f"process {info.get('pid')} on {info.get('host')}{job}"


class Lock:
    """``FOLDER/_progress/lock``, created exclusively; one predict writes a folder at a time."""

    def __init__(self, folder: Path):
        self.path = folder / PROGRESS / "lock"
        self.held = False

    def read(self) -> dict[str, Any] | None:
        try:
            info = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return info if isinstance(info, dict) else None

    def acquire(self) -> None:
        """Take the lock (a stale one is taken over); ``ValueError`` naming the holder if it is live."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        mine = {"host": socket.gethostname(), "pid": os.getpid(), "start": start_time(os.getpid()),
                "slurm_job": os.environ.get("SLURM_JOB_ID"), "time": time.time()}  # fmt: skip
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                info = self.read()
                if info is not None and holder_is_live(info):
                    raise ValueError(
                        f"{self.path.parent.parent} is being written by {_holder_text(info)}; wait for it "
                        f"or stop it. If that process is gone (another host cannot be asked), delete "
                        f"{self.path} and run again"
                    ) from None
                if info is None and time.time() - self.path.stat().st_mtime < 10:
                    time.sleep(1)  # being written by a predict starting at this moment
                    continue
                log.info("taking over %s from %s, which is gone", self.path, _holder_text(info or {}))
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(mine, f)
            self.held = True
            return
        raise ValueError(f"cannot take {self.path}: another predict keeps taking it; run again")

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False


@dataclass(frozen=True)
class Unfinished:
    """An unfinished forecast of predict: its folder, the batches recorded and who holds it."""

    path: Path
    batches_done: int  # every rank has written (and scored) these
    batches: int | None  # None: a temporary store of an earlier version, nothing recorded
    inits: int | None
    scores_only: bool
    holder: dict[str, Any] | None  # the lock, when a live process holds it
    modified: float
    request: dict[str, Any] | None = None  # what it forecasts (``progress.forecast_request``)

    def text(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.modified))
        if self.batches is None:
            what = "the temporary store of a predict that did not finish (nothing to resume)"
        else:
            kind = (
                "the unfinished scoring of a forecast (no store)"
                if self.scores_only
                else "an unfinished forecast"
            )
            what = f"{kind}: {self.batches_done} of {self.batches} batches recorded"
            what += f" ({self.inits} inits)" if self.inits is not None else ""
        state = f"written now by {_holder_text(self.holder)}" if self.holder else f"last written {when}"
        return f"{self.path}: {what}, {state}"

    def details(self) -> list[str]:
        """One line per item of the request it answers (long lists shortened)."""
        lines = []
        for key, value in (self.request or {}).items():
            if isinstance(value, list) and len(value) > 4:
                value = f"{len(value)} values {value[0]} … {value[-1]}"
            lines.append(f"{key}: {value}")
        return lines


def _rank_batches(progress: Path) -> list[int]:
    done = []
    for path in sorted(progress.glob("rank-*.json")):
        try:
            done.append(int(json.loads(path.read_text())["batches"]))
        except (OSError, ValueError, KeyError, TypeError):
            done.append(0)
    return done


def read_request(folder: Path) -> dict[str, Any] | None:
    """``_progress/request.json`` of a predict in-progress folder (None: not one, or not started)."""
    try:
        info = json.loads((folder / PROGRESS / REQUEST).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and info.get("format") == FORMAT else None


def batches_done(folder: Path, world: int) -> int:
    """Batches every one of ``world`` ranks has recorded (0 when a rank recorded none)."""
    done = _rank_batches(folder / PROGRESS)
    return min(done) if len(done) >= world else 0


def describe(path: str | Path) -> Unfinished | None:
    """What ``path`` is if it is predict's unfinished forecast; None for anything else."""
    path = Path(path)
    if not path.is_dir() or path.is_symlink():
        return None
    modified = path.stat().st_mtime
    if ".tmp-" in path.name and kind_of(path) == KIND and (read_marker(path) or {}).get("complete") is False:
        return Unfinished(path, 0, None, None, False, None, modified)
    if not path.name.endswith(IN_PROGRESS) or not (path / PROGRESS).is_dir():
        return None
    if (path / "zarr.json").exists() and kind_of(path) != KIND:
        return None
    info = read_request(path) or {}
    holder = Lock(path).read()
    holder = holder if holder is not None and holder_is_live(holder) else None
    stamps = [p.stat().st_mtime for p in (path / PROGRESS).glob("rank-*.json")]
    world = int(info.get("world", 1))
    return Unfinished(path, batches_done(path, world), int(info.get("batches", 0)), info.get("inits"),
                      bool(info.get("scores_only")), holder, max(stamps, default=modified),
                      info.get("request"))  # fmt: skip


def find_unfinished(folder: str | Path, *, besides: Path | None = None) -> list[Unfinished]:
    """Predict's unfinished forecasts in ``folder`` (not ``besides``, the caller's own)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    own = besides.resolve() if besides is not None else None
    found = []
    for entry in sorted(folder.iterdir()):
        if (IN_PROGRESS in entry.name or ".tmp-" in entry.name) and entry.resolve() != own:
            item = describe(entry)
            if item is not None:
                found.append(item)
    return found


def remove_unfinished(path: str | Path) -> Unfinished:
    """Delete predict's unfinished forecast ``path``; ``ValueError`` for anything else or one in use."""
    item = describe(path)
    if item is None:
        raise ValueError(
            f"{path} is not an unfinished forecast of predict (an OUT.in-progress folder holding "
            f"{PROGRESS}/, or a forecast store named *.tmp-*); nothing was deleted"
        )
    if item.holder is not None:
        raise ValueError(f"{path} is being written by {_holder_text(item.holder)}; nothing was deleted")
    shutil.rmtree(item.path)
    return item
