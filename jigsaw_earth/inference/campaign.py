"""What a forecast will write, whether it fits, who is writing it, and how far it has come (a campaign).

* ``store_bytes``: the forecast store's size (float32, uncompressed: inits × leads × members ×
  channels × grid); ``check_room`` refuses an ``--out`` whose filesystem has less free space,
  before any forecast runs, and says what would shrink it;
* ``lock_output``: ``OUT.lock`` beside the store, held by the predict writing it
  (``locks.PathLock``): a second predict to the same ``--out`` refuses at once, naming the first;
* ``StepLog``: rank 0 logs the model steps done (inits × members × steps of its replica), the
  rate and the time left, every ``EVERY_S`` seconds and at each tenth, so a long run is never silent.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from ..data.objects import is_object_url
from ..locks import LockHeld, PathLock
from .forecast_store import ForecastLayout

__all__ = ["EVERY_S", "StepLog", "check_room", "lock_output", "store_bytes"]

log = logging.getLogger(__name__)
EVERY_S = 30.0


def store_bytes(layout: ForecastLayout) -> int:
    """Bytes of the forecast store's fields (float32, before compression)."""
    return (
        len(layout.init_times)
        * len(layout.leads)
        * (layout.members or 1)
        * len(layout.channels)
        * len(layout.latitude)
        * len(layout.longitude)
        * 4
    )


def _size(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def describe(layout: ForecastLayout) -> str:
    """``12 inits × 4 leads × 3 members × 5 channels × 16x32 = 0.35 MB``."""
    members = f" × {layout.members} members" if layout.members else ""
    return (
        f"{len(layout.init_times)} inits × {len(layout.leads)} leads{members} × {len(layout.channels)} "
        f"channels × {len(layout.latitude)}x{len(layout.longitude)} = {_size(store_bytes(layout))}"
    )


def _existing_parent(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_room(out: str | Path, layout: ForecastLayout, fmt: str = "zarr") -> str:
    """Refuse an ``--out`` whose filesystem cannot hold the store; returns the estimate's line. GRIB 2
    and netCDF files are made from the in-progress store, so both are there at the end (at most twice
    the store: neither file format is larger than float32)."""
    need = store_bytes(layout) * (1 if fmt == "zarr" else 2)
    if is_object_url(str(out)):  # a bucket says no free space: its quota refuses a write
        return f"forecast store {out}: {describe(layout)} (float32, uncompressed), into the bucket"
    free = shutil.disk_usage(_existing_parent(Path(out))).free
    both = "" if fmt == "zarr" else f"; with the {fmt} files made from it, up to {_size(need)}"
    line = f"forecast store {out}: {describe(layout)} (float32, uncompressed){both}, {_size(free)} free there"
    if need > free:
        raise ValueError(
            f"--out {out} needs about {_size(need)} ({describe(layout)}, float32) but its filesystem has "
            f"{_size(free)} free; nothing was written. Write less (--variables, --levels, --lead-hours or "
            f"--lead-every, fewer --members or --max-inits), or choose an --out with room"
        )
    return line


def lock_output(out: str | Path) -> PathLock | _NoLock:
    """Hold ``OUT.lock`` beside the store ``out`` while this predict writes it (a bucket has no file
    lock: its forecast's ``_progress/lock`` is taken when predict claims it, ``bucket_output.py``)."""
    if is_object_url(str(out)):
        return _NoLock()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        return PathLock.acquire(
            out.with_name(out.name + ".lock"),
            f"--out {out}",
            "wait for it to finish, stop it, or choose another --out",
        )
    except LockHeld as err:
        raise ValueError(str(err)) from None


class _NoLock:
    def release(self) -> None:
        pass


def _duration(seconds: float) -> str:
    if seconds != seconds or seconds == float("inf"):
        return "?"
    h, rest = divmod(int(seconds), 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


class StepLog:
    """Model steps done of ``total`` (this replica's inits × members × steps), logged by rank 0."""

    def __init__(self, total: int, rank: int, every_s: float = EVERY_S):
        self.total, self.rank, self.every_s = max(total, 1), rank, every_s
        self.done, self.tenth = 0, 0
        self.t0 = self.last = time.perf_counter()

    def advance(self, n: int) -> None:
        self.done += n
        now = time.perf_counter()
        tenth = 10 * self.done // self.total
        if self.rank != 0 or (now - self.last < self.every_s and tenth == self.tenth):
            return
        self.last, self.tenth = now, tenth
        rate = self.done / max(now - self.t0, 1e-9)
        left = (self.total - self.done) / rate if rate > 0 else float("inf")
        log.info(
            "forecast %.0f%%: %d of %d model steps (inits × members × steps of this replica), %.2f steps/s, "
            "about %s left",
            100 * self.done / self.total,
            self.done,
            self.total,
            rate,
            _duration(left),
        )
