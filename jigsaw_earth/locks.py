"""One live writer per folder: a lock file held by the process that writes there.

``PathLock.acquire(path, what)`` takes an exclusive ``flock`` on ``path`` (created if missing) and
writes who holds it — pid, host, start time and command line — into the file. The kernel drops a
``flock`` when its process ends, however it ends (SIGKILL included), so a lock file whose lock can
be taken again is **stale**: left by a run that died. It is taken over, with a warning naming the
run that left it. While the holder lives, every other ``acquire`` (and ``holder``) refuses at once
with a ``LockHeld`` error naming it. ``release`` removes the file.

Training holds ``RUN_DIR/run.lock`` for the whole run (``training/rundir.py``); ``predict`` holds
``OUT.lock`` beside the store it is writing. On a filesystem without ``flock`` (some network
mounts) a lock held by a process that is alive on this host, or by any process of another host,
counts as held; a stale one of another host must then be removed by hand (the error says which).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["LockHeld", "PathLock", "describe_holder", "pid_alive", "start_time"]

log = logging.getLogger(__name__)


class LockHeld(ValueError):
    """Another live process holds the lock."""


def describe_holder(info: dict[str, Any]) -> str:
    """``pid 1234 on host h, started 2025-01-01T12:00:00 (jigsaw-earth train c.yaml)``."""
    command = info.get("command") or "?"
    return (
        f"pid {info.get('pid', '?')} on host {info.get('host', '?')}, started {info.get('started', '?')} "
        f"({command})"
    )


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat``), against pid reuse."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def pid_alive(pid: int, start: str | None = None) -> bool:
    """Whether process ``pid`` of this host lives (and, with ``start``, is the same process)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return start is None or start_time(pid) in (None, start)


def _me(what: str) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(["jigsaw-earth", *sys.argv[1:]]) if sys.argv else what,
        "what": what,
    }


@dataclass
class PathLock:
    """A held lock (``acquire``); ``release`` it when done."""

    path: Path
    fd: int
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def acquire(cls, path: str | Path, what: str, fix: str) -> PathLock:
        """Hold ``path`` for ``what`` (e.g. ``"run.dir runs/x"``); ``LockHeld`` names the holder and
        ``fix`` (what the user can do) when a live process has it."""
        path = Path(path)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise LockHeld(
                    f"{what} is in use by another run: {describe_holder(_read(path))} holds {path}; {fix}"
                ) from None
            except OSError as err:  # no flock here (ENOLCK, EOPNOTSUPP): judge by the pid
                if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    os.close(fd)
                    raise
                _refuse_if_alive(path, what, fix)
            try:  # the file may have been released (removed) between open and flock: retry
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        old = _read(path)
        if old:
            log.warning("%s: took over the lock %s left by a run that ended without releasing it: %s",
                        what, path, describe_holder(old))  # fmt: skip
        info = _me(what)
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        os.fsync(fd)
        return cls(path, fd, info)

    @staticmethod
    def holder(path: str | Path) -> dict[str, Any] | None:
        """Who holds ``path`` now (``None``: nobody alive), without taking it."""
        path = Path(path)
        if not path.is_file():
            return None
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read(path) or {"pid": "?"}
        except OSError:
            info = _read(path)
            return info if info and _held_by_pid(info) else None
        finally:
            os.close(fd)
        return None

    def release(self) -> None:
        """Remove the file and drop the lock (idempotent)."""
        if self.fd < 0:
            return
        try:
            if _read(self.path).get("pid") == self.info.get("pid"):
                self.path.unlink(missing_ok=True)
        finally:
            os.close(self.fd)
            self.fd = -1


def _held_by_pid(info: dict[str, Any]) -> bool:
    pid = info.get("pid")
    if info.get("host") != socket.gethostname():
        return True  # cannot tell: treat as held
    return isinstance(pid, int) and pid != os.getpid() and pid_alive(pid)


def _refuse_if_alive(path: Path, what: str, fix: str) -> None:
    info = _read(path)
    if info and _held_by_pid(info):
        raise LockHeld(
            f"{what} is in use by another run: {describe_holder(info)} holds {path} (this filesystem "
            f"has no flock: if that run is gone, remove {path}); {fix}"
        )
