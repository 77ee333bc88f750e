"""One live writer per folder: a lock file held by the process that writes there, alive by lease.

``PathLock.acquire(path, what)`` takes an exclusive ``flock`` on ``path`` (created if missing) and
writes who holds it — pid, host, start time, Slurm job and command line — into the file. While it
holds the lock, the process renews the file's lease: it touches the file every quarter of
``lease_s()`` (60 s; ``JIGSAW_LOCK_LEASE_S``) from a side thread (``renew``). ``release`` removes the
file. Whether a holder lives (``holder_alive``) is judged, in this order:

* written by an earlier attempt of this Slurm job (``SLURM_JOB_ID`` equal, ``SLURM_RESTART_COUNT``
  lower): gone, since Slurm ends every task of a job, or marks its node DOWN, before it requeues it;
* written on this host: the kernel knows. A lock file whose ``flock`` can be taken was left by a run
  that died, however it died (SIGKILL included), and is taken over with a warning naming that run
  (on a file system without ``flock``, some network mounts: the pid is asked, ``kill(pid, 0)``);
* written on another host, whose pids cannot be asked from here: alive while its lease is fresh,
  gone once the file has not been touched for ``lease_s()``. This holds whatever the file system
  does with ``flock``: where it is local to each host (Lustre's ``localflock``, BeeGFS) a live run of
  another host is still refused; where it is cluster-wide but keeps a dead host's lock until the
  server notices (NFS's 90 s lease, a Lustre eviction), the file is replaced once the lease has
  run out. Clocks of the hosts must agree to well within the lease (NTP does).

A live holder makes every other ``acquire`` (and ``holder``) refuse at once with a ``LockHeld``
error naming it, and, for another host's, how long its lease still runs. The lease is 60 s so that
a stall of a shared file system does not end it, and a job that Slurm requeues after a node
failure (``SlurmdTimeout``, 300 s by default) never waits for it.

Training holds ``RUN_DIR/run.lock`` for the whole run (``training/rundir.py``); ``predict`` holds
``OUT.lock`` beside the store it is writing. Predict's ``_progress/lock`` and a checkpoint's pins
(``checkpoint/manager.py``) are renewed and judged by the same rules.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "LEASE_ENV",
    "LockHeld",
    "PathLock",
    "describe_holder",
    "holder_alive",
    "lease_left",
    "lease_s",
    "pid_alive",
    "renew",
    "slurm_attempt",
    "start_time",
    "stop_renewing",
]

log = logging.getLogger(__name__)
LEASE_ENV = "JIGSAW_LOCK_LEASE_S"
LEASE_S = 60.0


class LockHeld(ValueError):
    """Another live process holds the lock."""


def lease_s() -> float:
    """How long a lock of another host counts as held after its holder last renewed it (seconds)."""
    raw = os.environ.get(LEASE_ENV)
    if raw is None:
        return LEASE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{LEASE_ENV}={raw!r}: give the lock lease in seconds, a positive number (default "
                         f"{LEASE_S:g})")  # fmt: skip
    return value


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


def slurm_attempt() -> dict[str, Any]:
    """This process's Slurm job and attempt (``{}`` outside Slurm), for a lock's or a pin's file."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return {}
    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    return {"slurm_job": job, "slurm_restart": int(restarts) if restarts.isdigit() else 0}


def lease_left(path: str | Path) -> float:
    """Seconds until the lease of the lock or pin file ``path`` runs out (≤ 0: it has; the file is
    opened first, so a network file system shows its newest time)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return 0.0
    try:
        touched = os.fstat(fd).st_mtime
    finally:
        os.close(fd)
    return touched + lease_s() - time.time()


def holder_alive(info: dict[str, Any], path: str | Path | None) -> bool:
    """Whether the process that wrote ``info`` into the lock or pin file ``path`` may still run (the
    rules in the module docstring; this host's ``flock`` is the caller's to ask first). ``path`` None:
    a lock without a lease (a bucket's object), whose holder on another host counts as alive."""
    mine = slurm_attempt()
    theirs = info.get("slurm_restart", -1)
    earlier = isinstance(theirs, int) and bool(mine) and theirs < mine["slurm_restart"]
    if earlier and str(info.get("slurm_job")) == mine["slurm_job"]:
        return False  # an earlier attempt of this job: Slurm ended it before the requeue
    if info.get("host") == socket.gethostname():
        pid = info.get("pid")
        return isinstance(pid, int) and pid_alive(pid, info.get("start"))
    return path is None or lease_left(path) > 0


class _Renewer:
    """One side thread per process that touches every held lock and pin file each quarter lease."""

    def __init__(self) -> None:
        self.held: dict[int | str, int] = {}  # fd or path → holders
        self.guard = threading.Lock()
        self.thread: threading.Thread | None = None

    def add(self, target: int | str) -> None:
        lease_s()  # a bad JIGSAW_LOCK_LEASE_S is the caller's error, not the side thread's
        with self.guard:
            self.held[target] = self.held.get(target, 0) + 1
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, name="jigsaw-lock-lease", daemon=True)
                self.thread.start()

    def remove(self, target: int | str) -> None:
        with self.guard:
            left = self.held.pop(target, 0) - 1
            if left > 0:
                self.held[target] = left

    def _loop(self) -> None:
        while True:
            time.sleep(lease_s() / 4)
            with self.guard:  # held while touching: a released descriptor is never touched
                for target in self.held:
                    try:
                        os.utime(target)
                    except OSError as err:  # removed, or a file system hiccup: the next beat tries again
                        log.debug("cannot renew the lease of %s: %s", target, err)


_RENEWER = _Renewer()


def renew(target: int | str | Path) -> None:
    """Keep renewing the lease of a held lock or pin (an open file descriptor, or a path)."""
    _RENEWER.add(target if isinstance(target, int) else str(target))


def stop_renewing(target: int | str | Path) -> None:
    _RENEWER.remove(target if isinstance(target, int) else str(target))


def _me(what: str) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "start": start_time(os.getpid()),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **slurm_attempt(),
        "command": " ".join(["jigsaw-earth", *sys.argv[1:]]) if sys.argv else what,
        "what": what,
    }


def _try_flock(fd: int) -> bool | None:
    """Take ``fd``'s flock: True, False (another process holds it), None (no flock on this file system)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as err:
        if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        return None
    return True


def _judge(path: Path, info: dict[str, Any], flocked: bool | None) -> bool:
    """Whether ``info``'s holder lives, given what this host's flock said (``_try_flock``)."""
    if flocked is False and (not info or info.get("host") == socket.gethostname()):
        return True  # this host's kernel says a process holds it (or is writing it now)
    if flocked is True and info.get("host") == socket.gethostname():
        return False  # this host's kernel dropped it: its process ended
    return bool(info) and holder_alive(info, path)


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _held_error(path: Path, info: dict[str, Any], what: str, fix: str, flocked: bool | None) -> LockHeld:
    why = ""
    if info.get("host") not in (None, socket.gethostname()):
        left = lease_left(path)
        why = (
            f" (a lock of another host counts as held while its lease runs: {left:.0f} s more unless "
            f"renewed; if that host is gone, run again after that; lease {lease_s():g} s, {LEASE_ENV})"
        )
    elif flocked is None:
        why = f" (this filesystem has no flock: if that run is gone, remove {path})"
    return LockHeld(f"{what} is in use by another run: {describe_holder(info)} holds {path}{why}; {fix}")


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
        lease_s()  # a bad JIGSAW_LOCK_LEASE_S refused before anything is written
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            flocked = _try_flock(fd)
            if not _same_file(fd, path):  # released (removed) or replaced between open and flock: again
                os.close(fd)
                continue
            old = _read(path)
            if _judge(path, old, flocked):
                os.close(fd)
                raise _held_error(path, old, what, fix, flocked)
            if old:
                log.warning("%s: took over the lock %s left by a run that ended without releasing it: %s",
                            what, path, describe_holder(old))  # fmt: skip
            if flocked is not False:
                break
            # a flock the file system keeps for a process judged gone (its host's lease ran out):
            # a fresh file of our own instead
            if _same_file(fd, path):
                path.unlink(missing_ok=True)
            os.close(fd)
        info = _me(what)
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        os.fsync(fd)
        renew(fd)
        return cls(path, fd, info)

    @staticmethod
    def holder(path: str | Path, lease: bool = True) -> dict[str, Any] | None:
        """Who holds ``path`` now (``None``: nobody alive), without taking it. ``lease=False``: a lock
        of another host only when this host's ``flock`` sees it held (the ranks of a job that do not
        take the lock leave the lease to the one that does, so that hosts never judge apart)."""
        path = Path(path)
        if not path.is_file():
            return None
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                flocked: bool | None = True
            except BlockingIOError:
                flocked = False
            except OSError:
                flocked = None
            info = _read(path)
            if not lease and info.get("host") not in (None, socket.gethostname()):
                return info if flocked is False else None
            return (info or {"pid": "?"}) if _judge(path, info, flocked) else None
        finally:
            os.close(fd)

    def release(self) -> None:
        """Remove the file and drop the lock (idempotent)."""
        if self.fd < 0:
            return
        stop_renewing(self.fd)
        try:
            if _same_file(self.fd, self.path) and _read(self.path).get("pid") == self.info.get("pid"):
                self.path.unlink(missing_ok=True)
        finally:
            os.close(self.fd)
            self.fd = -1
