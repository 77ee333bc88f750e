"""Where a forecast's time went, and whether the disk was the limit.

``LoopTimes`` holds one rank's account of the forecast loop (the batches, from the first read to the
last write; loading and compiling the model are reported apart): the device time of the forward
steps (``comm_wait_s`` of it blocked in exchanges and collectives with other ranks,
``comm.ledger.wait_s``) and of the copies out (``device.DeviceTimer``: CUDA events, no host sync per
step); the CPU time of the process over the loop (every thread); the host time the loop
thread spent waiting — for a free output slot (*write stall*), for the inputs (*read stall*), for the
scoring thread (*score stall*, mostly its truth and climatology reads, whose own wait is
``truth_wait_s``) and, after the last step, for the last writes and scores (``drain_s``); and the
bytes written with the time the writers were busy. ``reduce`` takes every figure's largest value
over the ranks (the slowest rank sets the pace); ``line`` is predict's log line; ``disk_limit``
says, with the measured write rate, when waiting for the writers took more than ``DISK_LIMITED``
of the loop.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch
import torch.distributed as dist

from ..distributed.comm import all_reduce_
from ..distributed.mesh import Axis

__all__ = ["DISK_LIMITED", "LoopTimes"]

DISK_LIMITED = 0.1  # of the loop spent waiting for the writers: the disk is the limit


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


@dataclass
class LoopTimes:
    """Seconds of one rank's forecast loop, by part (see the module docstring)."""

    loop_s: float = 0.0
    forward_s: float = 0.0
    comm_wait_s: float = 0.0
    copy_s: float = 0.0
    write_stall_s: float = 0.0
    read_stall_s: float = 0.0
    score_stall_s: float = 0.0
    truth_wait_s: float = 0.0
    drain_s: float = 0.0
    writers_busy_s: float = 0.0
    written_bytes: float = 0.0
    cpu_s: float = 0.0
    compile_s: float = 0.0

    def reduce(self, axis: Axis, device: torch.device) -> LoopTimes:
        """The largest of each figure over the ranks of ``axis`` (collective; a no-op alone)."""
        if not dist.is_initialized() or axis.size == 1:
            return self
        values = [getattr(self, f.name) for f in fields(self)]
        values = torch.tensor(values, dtype=torch.float64, device=device)
        all_reduce_(values, axis, op="predict.times", reduce=dist.ReduceOp.MAX)
        return LoopTimes(*values.tolist())

    def rate(self) -> float:
        """Bytes per second the writers sustained while busy (0: nothing written)."""
        return self.written_bytes / self.writers_busy_s if self.writers_busy_s > 0 else 0.0

    def line(self) -> str:
        """``forecast loop 2.31 s: forward 1.95 s, copy-out 0.01 s, write stall 0.00 s, …``."""
        waits = f" ({self.comm_wait_s:.2f} s of it waiting for other ranks)" if self.comm_wait_s else ""
        parts = [
            f"forward {self.forward_s:.2f} s{waits}",
            f"copy-out {self.copy_s:.2f} s",
            f"write stall {self.write_stall_s:.2f} s",
            f"read stall {self.read_stall_s:.2f} s",
        ]
        if self.score_stall_s or self.truth_wait_s:
            waited = f"its truth reads waited {self.truth_wait_s:.2f} s"
            parts.append(f"score stall {self.score_stall_s:.2f} s ({waited})")
        parts.append(f"last writes and scores {self.drain_s:.2f} s")
        text = f"forecast loop {self.loop_s:.2f} s: {', '.join(parts)}"
        if self.written_bytes:
            text += (
                f"; wrote {_size(self.written_bytes)} at {_size(self.rate())}/s "
                f"(writers busy {self.writers_busy_s:.2f} s)"
            )
        if self.compile_s:
            text += f"; compiled in {self.compile_s:.1f} s before the loop"
        return text

    def disk_limit(self) -> str | None:
        """A warning when the loop waited for the writers for more than ``DISK_LIMITED`` of it."""
        if self.loop_s <= 0 or self.write_stall_s <= DISK_LIMITED * self.loop_s:
            return None
        return (
            f"the disk is the limit: the forecast waited {self.write_stall_s:.2f} s of {self.loop_s:.2f} s "
            f"for its writes, which ran at {_size(self.rate())}/s; write less (--variables, --levels, "
            f"--lead-hours) or to a faster disk (local or RAM disk)"
        )

    def as_dict(self) -> dict[str, float]:
        return asdict(self)
