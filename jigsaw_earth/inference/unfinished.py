"""Forecasts in progress: one folder per output, a lock while it is written, and the abandoned ones.

``predict --out OUT`` writes ``OUT.in-progress`` and renames it to ``OUT`` once every init is written;
a score-only run with ``--scores PREFIX`` keeps its progress in ``PREFIX.in-progress``. The folder is
a Zarr group marked ``jigsaw_earth = {kind: forecast, complete: false}`` (the forecast written so far;
no arrays for a score-only run) with ``_progress/`` beside the arrays (``progress.py``: the request,
each rank's batches done, their score shares) and ``_progress/lock``: the host, process and Slurm job
that writes it, its lease renewed while it is held. A lock is stale as ``locks.holder_alive`` judges:
its process gone from this host, an earlier attempt of this Slurm job (``sbatch --requeue`` keeps the
job id), or another host's lease run out; a stale lock is taken over, a live one refuses a second
predict.

What predict wrote is provable: when predict starts a folder it writes ``_progress/folder.json``
(``mark_folder``), and once its store's template is written it records there the arrays it made
(``record_arrays``). ``foreign_files`` lists every file of a folder that predict's files do not
account for: ``_progress`` holds only the lock, the request, the folder mark, ``rank-R.json`` and
``scores/rank-R/batch-B.pt`` (and their ``.part`` while written); the store only its ``zarr.json``
and, in each recorded array's folder, its ``zarr.json`` and chunk files ``c/I/J/…``; ``_output`` (the
files of ``predict --format grib2|netcdf`` while they are written, ``formats.py``) only the files
recorded in the mark before they are written (``record_outputs``) and the folder's marker file.
``find_unfinished`` lists predict's own unfinished folders (``*.in-progress`` holding ``_progress``
with predict's mark or request, and ``*.tmp-*`` forecast stores of earlier versions) and nothing
else; ``remove_unfinished`` deletes only those, none that a live process holds, and none holding a
file predict did not write (it is named).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..locks import holder_alive, lease_left, renew, slurm_attempt, start_time, stop_renewing
from ..ownership import FOLDER_MARKER, IN_PROGRESS, kind_of, read_marker

__all__ = [
    "OUTPUT",
    "PROGRESS",
    "UNFINISHED_LOCAL",
    "Lock",
    "Unfinished",
    "describe",
    "find_unfinished",
    "foreign_files",
    "foreign_text",
    "holder",
    "holder_text",
    "mark_folder",
    "record_arrays",
    "record_outputs",
    "remove_unfinished",
]

log = logging.getLogger(__name__)

PROGRESS = "_progress"  # inside the in-progress folder: what a resume needs
OUTPUT = "_output"  # inside it too: predict --format grib2|netcdf's files until every rank wrote its own
REQUEST = "request.json"
MARK = "folder.json"  # predict made this folder (and, once written, the arrays of its store)
FORMAT = "jigsaw-earth predict progress"
KIND = "forecast"
#: what predict writes in ``_progress`` (``progress.py``), each possibly with ``.part`` while written
_PROGRESS_FILES = re.compile(
    r"(lock|request\.json|folder\.json|rank-\d+\.json|scores/rank-\d+/batch-\d+\.pt)(\.part)?"
)
_CHUNK_KEY = re.compile(r"c(/\d+)*")

#: what --unfinished and --remove-unfinished serve (a bucket has neither)
UNFINISHED_LOCAL = (
    "lists and removes unfinished forecasts in local folders; an unfinished forecast in a bucket is "
    "finished by running its predict command again, or removed with the bucket's own tools (e.g. "
    "`aws s3 rm --recursive URL`)"
)


def _lease_text(info: dict[str, Any], path: Path) -> str:
    if info.get("host") == socket.gethostname():
        return ""
    return (f". A lock of another host counts as held while its lease runs ({lease_left(path):.0f} s more "
            f"unless renewed): if that host is gone, run again after that")  # fmt: skip


def holder() -> dict[str, Any]:
    """What a lock says of this process: host, process (and its start), Slurm job, time."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": start_time(os.getpid()),
            **slurm_attempt(), "time": time.time()}  # fmt: skip


def holder_text(info: dict[str, Any]) -> str:
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
        mine = holder()
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                info = self.read()
                if info is not None and holder_alive(info, self.path):
                    raise ValueError(
                        f"{self.path.parent.parent} is being written by {holder_text(info)}; wait for it "
                        f"or stop it{_lease_text(info, self.path)}"
                    ) from None
                if info is None and time.time() - self.path.stat().st_mtime < 10:
                    time.sleep(1)  # being written by a predict starting at this moment
                    continue
                log.info("taking over %s from %s, which is gone", self.path, holder_text(info or {}))
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(mine, f)
            self.held = True
            renew(self.path)
            return
        raise ValueError(f"cannot take {self.path}: another predict keeps taking it; run again")

    def release(self) -> None:
        if self.held:
            stop_renewing(self.path)
            info = self.read() or {}
            if (info.get("host"), info.get("pid")) == (socket.gethostname(), os.getpid()):
                self.path.unlink(missing_ok=True)  # not another's that took it over once our lease ran out
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
        state = f"written now by {holder_text(self.holder)}" if self.holder else f"last written {when}"
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


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _mark(folder: Path) -> dict[str, Any] | None:
    """``_progress/folder.json`` of a folder predict made (None: it has none)."""
    info = _read_json(folder / PROGRESS / MARK)
    return info if info is not None and info.get("format") == FORMAT else None


def mark_folder(folder: Path) -> None:
    """Rank 0, when predict starts ``folder``: write the mark that proves predict made it."""
    info = {"format": FORMAT, "created": time.time(), "host": socket.gethostname(), "pid": os.getpid()}
    _write(folder / PROGRESS / MARK, info)


def record_arrays(folder: Path) -> None:
    """Rank 0, once the store's template is written in the folder predict started: record its arrays
    (the folders holding an array's ``zarr.json``) in the mark."""
    info = _mark(folder) or {"format": FORMAT, "created": time.time()}
    arrays = [p.parent.name for p in folder.glob("*/zarr.json") if p.parent.name != PROGRESS]
    _write(folder / PROGRESS / MARK, {**info, "arrays": sorted(arrays)})


def record_outputs(folder: Path, names: list[str]) -> None:
    """Rank 0, before the files of ``--format grib2|netcdf`` are written into ``folder/OUTPUT``: record
    their names in the mark, so those and no others are predict's."""
    info = _mark(folder) or {"format": FORMAT, "created": time.time()}
    _write(folder / PROGRESS / MARK, {**info, "outputs": sorted(names)})


def _write(path: Path, info: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(info, indent=1))
    os.replace(tmp, path)


def _is_array(folder: Path) -> bool:
    return (_read_json(folder / "zarr.json") or {}).get("node_type") == "array"


def foreign_files(folder: str | Path) -> list[str]:
    """Files and links under ``folder`` (relative paths) that predict did not write: anything but
    its progress files, the store's ``zarr.json`` and the recorded arrays' metadata and chunks (an
    earlier version's ``*.tmp-*`` store, or a folder cut short before its arrays were recorded:
    the folders holding an array's ``zarr.json``)."""
    folder = Path(folder)
    recorded = (_mark(folder) or {}).get("arrays")
    arrays = set(recorded) if isinstance(recorded, list) else None
    outputs = [str(n) for n in (_mark(folder) or {}).get("outputs") or []] + [FOLDER_MARKER]
    written = {f"{OUTPUT}/{n}{part}" for n in outputs for part in ("", ".part")}
    foreign = []
    for path in sorted(folder.rglob("*")):
        if path.is_dir() and not path.is_symlink():
            continue
        parts = path.relative_to(folder).parts
        rel = "/".join(parts)
        if parts[0] == PROGRESS:
            ok = not path.is_symlink() and _PROGRESS_FILES.fullmatch("/".join(parts[1:])) is not None
        elif parts[0] == OUTPUT:
            ok = not path.is_symlink() and rel in written
        elif len(parts) == 1:
            ok = rel == "zarr.json" and not path.is_symlink()
        else:
            known = parts[0] in arrays if arrays is not None else _is_array(folder / parts[0])
            inner = "/".join(parts[1:])
            ok = (
                known
                and not path.is_symlink()
                and (inner == "zarr.json" or _CHUNK_KEY.fullmatch(inner) is not None)
            )
        if not ok:
            foreign.append(rel)
    return foreign


def describe(path: str | Path) -> Unfinished | None:
    """What ``path`` is if it is predict's unfinished forecast; None for anything else (an
    ``*.in-progress`` folder is predict's when its ``_progress`` holds predict's mark or request)."""
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
    request = read_request(path)
    if _mark(path) is None and request is None:
        return None  # a folder predict did not make
    info = request or {}
    lock = Lock(path)
    holder = lock.read()
    holder = holder if holder is not None and holder_alive(holder, lock.path) else None
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


def foreign_text(path: Path, foreign: list[str]) -> str:
    more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
    return f"{path} holds {path / foreign[0]}{more}, which predict did not write"


def remove_unfinished(path: str | Path) -> Unfinished:
    """Delete predict's unfinished forecast ``path``; ``ValueError`` for anything else, one in use,
    or one holding a file predict did not write."""
    if "://" in str(path):
        raise ValueError(f"--remove-unfinished {path}: predict {UNFINISHED_LOCAL}; nothing was deleted")
    item = describe(path)
    if item is None:
        foreign = foreign_files(path) if Path(path).is_dir() and not Path(path).is_symlink() else []
        held = f"; it holds {Path(path) / foreign[0]}, which predict did not write" if foreign else ""
        raise ValueError(
            f"{path} is not an unfinished forecast of predict (an OUT.in-progress folder whose "
            f"{PROGRESS}/ holds predict's {MARK} or {REQUEST}, or a forecast store named *.tmp-*){held}; "
            f"nothing was deleted"
        )
    if item.holder is not None:
        raise ValueError(f"{path} is being written by {holder_text(item.holder)}; nothing was deleted")
    foreign = foreign_files(item.path)
    if foreign:
        raise ValueError(
            f"{foreign_text(item.path, foreign)}; nothing was deleted. Move your files out of it and run "
            f"--remove-unfinished again, or remove the folder yourself"
        )
    shutil.rmtree(item.path)
    return item
