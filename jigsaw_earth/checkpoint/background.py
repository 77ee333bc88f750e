"""Checkpoints written in the background: a save stalls training only for the copy off the device.

``BackgroundSaver.save`` waits for the previous save to finish, copies this rank's blocks into
host memory (page-locked on a GPU, queued on the compute stream: the optimizer's next in-place
update runs after the copy, so the caller does not wait for it) and hands the files to a thread,
which writes exactly what ``save_checkpoint`` writes, atomically (``step_N.tmp/``, then
``meta.json``, the rename and ``latest``). The thread's collectives (DCP's plan exchange and the
ranks' agreement that every write succeeded) run on a gloo group of their own, so they never
interleave with training's. A process killed during the write leaves the previous checkpoint and
``latest`` untouched; a write that fails raises at the next ``save`` or ``wait``, on every rank.

The host copies are kept for the next save (the same blocks, the same buffers): the price is host
memory the size of this rank's part of a checkpoint.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..device import copies_done, host_empty
from ..distributed.mesh import DomainMesh
from .manager import SaveRequest, capture, write_checkpoint
from .planner import Block

__all__ = ["BackgroundSaver"]

log = logging.getLogger(__name__)


class BackgroundSaver:
    """One run's checkpoints, each written by a thread while training goes on; one save at a time.

    ``save`` is collective (every rank calls it at the same step) and returns the path the
    checkpoint will have; ``wait`` returns it once it is complete, or raises what went wrong.
    """

    def __init__(self) -> None:
        self._host: dict[str, torch.Tensor] = {}
        self._group: Any = None
        self._grouped = False
        self._thread: threading.Thread | None = None
        self._path: Path | None = None
        self._error: BaseException | None = None
        self.pending_step: int | None = None
        self.stall_s = 0.0  # the caller's time in the last ``save`` (the copy off the device)
        self.write_s = 0.0  # the thread's time writing the last finished save

    def save(self, request: SaveRequest) -> Path:
        """Start writing the checkpoint ``request`` describes (as ``save_checkpoint``); collective."""
        self.wait()
        t0 = time.perf_counter()
        group = self._checkpoint_group(request.mesh)
        job = capture(request, stage=self._stage)
        copied = copies_done(request.mesh.device)
        self.stall_s = time.perf_counter() - t0

        def write() -> None:
            t1 = time.perf_counter()
            try:
                copied()
                self._path = write_checkpoint(job, lambda failed: _any_rank(group, failed), group)
            except BaseException as err:  # raised by the caller's next save or wait
                self._error = err
                return
            self.write_s = time.perf_counter() - t1
            log.info(
                "saved checkpoint %s in the background in %.2f s (training stalled %.2f s for the copy)",
                job.final,
                self.write_s,
                self.stall_s,
            )

        self.pending_step, self._path, self._error = request.step, None, None
        self._thread = threading.Thread(target=write, name=f"checkpoint-{request.step}", daemon=True)
        self._thread.start()
        return job.final

    def wait(self) -> Path | None:
        """Block until the save in flight (if any) is complete; its path, or raise its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread, self.pending_step = None, None
        error, self._error = self._error, None
        if error is not None:
            raise error
        return self._path

    def _stage(self, blocks: dict[str, Block]) -> dict[str, Block]:
        """Host copies of ``blocks`` in buffers kept from the previous save."""
        out = {}
        for name, b in blocks.items():
            src = b.tensor.detach()
            host = self._host.get(name)
            if host is None or host.shape != src.shape or host.dtype != src.dtype:
                host = self._host[name] = host_empty(tuple(src.shape), src.dtype, src.device)
            host.copy_(src, non_blocking=True)
            out[name] = Block(host, b.global_shape, b.offsets)
        for name in set(self._host) - set(blocks):
            del self._host[name]
        return out

    def _checkpoint_group(self, mesh: DomainMesh) -> Any:
        """The gloo group of every rank for the thread's collectives (made at the first save)."""
        if not self._grouped:
            self._grouped = True
            if dist.is_initialized() and dist.get_world_size() > 1:
                self._group = dist.new_group(backend="gloo")
        return self._group


def _any_rank(group: Any, failed: bool) -> bool:
    """Collective over ``group``: whether any rank ``failed``."""
    flag = torch.tensor([1.0 if failed else 0.0])
    if group is not None:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return bool(flag.item())
