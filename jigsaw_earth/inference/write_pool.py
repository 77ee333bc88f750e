"""predict's way out: from the device to the forecast store without the forward waiting for the disk.

Each written lead's fields, ``(members × inits, channels, h, w)`` on the device, are copied into a
host slot ``(leads, members, inits, channels, h, w)`` (``device.CopyOut``: page-locked memory filled
on a CUDA stream of its own, so the next step computes while the copy runs). Once a slot holds one
chunk of leads (``StoreChunks.leads``) or the batch's last lead, it goes to the writers: one job per
variable on a pool of ``WRITERS`` threads, each writing whole chunks (``ForecastWriter.write``). There
are ``SLOTS`` slots, double buffers: the forward fills one while the writers empty the other, and it
waits (the *write stall*) only when every slot is still being written. The slots bound the queue:
at most ``SLOTS`` × variables jobs are ever waiting. ``WriterPool`` counts the bytes written and the
time at least one writer was busy, which gives the disk's measured rate.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch

from ..device import CopyOut, host_empty
from ..distributed.tiles import Tile
from .forecast_store import ForecastWriter

__all__ = ["SLOTS", "WRITERS", "ForecastOutput", "WriterPool"]

SLOTS = 2  # host buffers of one chunk of leads each: double buffering
WRITERS = 4  # writer threads (file writes and copies release the GIL)


class WriterPool:
    """Threads that run write jobs; ``bytes`` written and ``busy_s``, the wall time during which at
    least one job ran (bytes / busy_s: the rate the disk sustained)."""

    def __init__(self, threads: int = WRITERS):
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="jigsaw-predict-write")
        self._lock = threading.Lock()
        self._active, self._since = 0, 0.0
        self.busy_s, self.bytes = 0.0, 0

    def submit(self, job: Callable[[], None], nbytes: int) -> Future:
        return self._pool.submit(self._run, job, nbytes)

    def _run(self, job: Callable[[], None], nbytes: int) -> None:
        with self._lock:
            if not self._active:
                self._since = time.perf_counter()
            self._active += 1
        try:
            job()
        finally:
            with self._lock:
                self._active -= 1
                if not self._active:
                    self.busy_s += time.perf_counter() - self._since
        with self._lock:
            self.bytes += nbytes

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


@dataclass
class _Slot:
    host: torch.Tensor  # (leads, members, inits, channels, h, w)
    copies: list[Callable[[], None]] = field(default_factory=list)  # wait() of each copy into it
    jobs: list[Future] = field(default_factory=list)  # its write jobs: free once all are done


class ForecastOutput:
    """One rank's writes of a forecast store: ``begin`` a batch, ``put`` each written lead in order,
    ``end_batch`` returns the batch's write jobs (done: the batch is in the store)."""

    def __init__(self, writer: ForecastWriter, tile: Tile, device: torch.device, batch: int,
                 members: range | None, pool: WriterPool) -> None:  # fmt: skip
        self.writer, self.tile, self.pool, self.members = writer, tile, pool, members
        lay = writer.layout
        self.n_leads, self.per_write = len(lay.leads), writer.chunks.leads
        m = 1 if members is None else len(members)
        shape = (min(self.per_write, self.n_leads), m, batch, len(lay.channels), *tile.shape)
        self.copier = CopyOut(device)
        self.slots = [_Slot(host_empty(shape, torch.float32, device)) for _ in range(SLOTS)]
        self.stall_s = 0.0  # the forward waiting for a free slot
        self._variables = [(name, len(lay.levels)) for name in lay.upper_air] + [(n, 1) for n in lay.surface]
        self._next, self._slot, self._batch_jobs = 0, None, []
        self._runs: list[tuple[int, int, int]] = []

    def begin(self, positions: np.ndarray) -> None:
        """A new batch: the inits at ``positions`` of the store's init axis (ascending)."""
        positions = np.asarray(positions, np.int64)
        self.n = len(positions)
        breaks = np.flatnonzero(np.diff(positions) != 1) + 1  # runs of consecutive inits
        self._runs = [(int(positions[r[0]]), int(r[0]), len(r)) for r in np.split(np.arange(self.n), breaks)]
        self._batch_jobs = []

    def put(self, lead_index: int, fields: torch.Tensor) -> None:
        """Lead ``lead_index`` (of the layout's leads) of the batch: ``(members × inits, channels, h,
        w)`` in physical units, member-major, on the device."""
        first = lead_index - lead_index % self.per_write
        if lead_index == first:
            self._slot = self._free_slot()
        slot = self._slot
        view = fields.view(slot.host.shape[1], self.n, *fields.shape[1:])
        slot.copies.append(self.copier.copy(slot.host[lead_index - first, :, : self.n], view))
        if lead_index - first + 1 == self.per_write or lead_index + 1 == self.n_leads:
            self._flush(slot, first, lead_index + 1)

    def end_batch(self) -> list[Future]:
        jobs, self._batch_jobs = self._batch_jobs, []
        return jobs

    def _free_slot(self) -> _Slot:
        slot = self.slots[self._next]
        self._next = (self._next + 1) % len(self.slots)
        t0 = time.perf_counter()
        for job in slot.jobs:
            job.result()  # a writer's error surfaces here
        self.stall_s += time.perf_counter() - t0
        slot.jobs, slot.copies = [], []
        return slot

    def _flush(self, slot: _Slot, first: int, stop: int) -> None:
        """Hand the slot's leads ``[first, stop)`` to the writers, one job per variable."""
        copies, leads, runs = list(slot.copies), slice(first, stop), list(self._runs)
        block = slot.host[: stop - first, :, : self.n]
        h, w = self.tile.shape
        for name, depth in self._variables:
            nbytes = (stop - first) * block.shape[1] * self.n * depth * h * w * 4
            job = self.pool.submit(partial(self._write, name, copies, block, leads, runs), nbytes)
            slot.jobs.append(job)
            self._batch_jobs.append(job)

    def _write(self, name: str, copies: list[Callable[[], None]], block: torch.Tensor, leads: slice,
               runs: list[tuple[int, int, int]]) -> None:  # fmt: skip
        """One variable of a slot's block: the batch's ``runs`` of consecutive inits (store index,
        row in the block, length)."""
        for landed in copies:
            landed()
        fields: Any = block.numpy().transpose(2, 0, 1, 3, 4, 5)  # (inits, leads, members, C, h, w)
        for start, row, n in runs:
            part = fields[row : row + n]
            if self.members is None:
                self.writer.write(slice(start, start + n), leads, part[:, :, 0], self.tile, None, (name,))
            else:
                members = slice(self.members.start, self.members.stop)
                self.writer.write(slice(start, start + n), leads, part, self.tile, members, (name,))
