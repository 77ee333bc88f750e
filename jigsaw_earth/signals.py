"""Stop cleanly on Slurm's time-limit and preemption signals: checkpoint, then exit 75.

``SIGTERM`` (what ``scancel`` and Slurm's time limit send) and ``SIGUSR1`` (what
``#SBATCH --signal=USR1@120`` sends ahead of the limit) only set a flag. At the next step
boundary every rank learns whether any rank got one (one all-reduce of a flag, so all ranks stop
at the same step), saves a checkpoint and raises ``Preempted``; ``jigsaw-earth train`` exits with
``EXIT_PREEMPTED`` (75, ``EX_TEMPFAIL``: "try again"), and the same command — or
``sbatch --requeue`` — resumes from that checkpoint.

``predict`` asks before every model step (``host_group``: the flag on a gloo group of host tensors,
so the rollout on a GPU never waits for the host to ask).
"""

from __future__ import annotations

import logging
import shlex
import signal
import sys
import threading
from types import FrameType, TracebackType
from typing import Any

import torch
import torch.distributed as dist

from .distributed.comm import all_reduce_
from .distributed.mesh import DomainMesh

__all__ = ["EXIT_PREEMPTED", "STOP_SIGNALS", "Preempted", "StopSignals", "host_group", "rerun_hint"]

log = logging.getLogger(__name__)
EXIT_PREEMPTED = 75
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preempted(Exception):
    """Training stopped on a signal after saving a checkpoint; rerun the command to resume."""

    exit_code = EXIT_PREEMPTED


class StopSignals:
    """Context manager: while inside, ``SIGTERM``/``SIGUSR1`` set ``received`` instead of killing."""

    signals: tuple[signal.Signals, ...] = STOP_SIGNALS

    def __init__(self, mesh: DomainMesh):
        self.mesh = mesh
        self.received: str | None = None
        self._saved: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signal.Signals(signum).name
        log.warning("received %s: will checkpoint and stop after this step", self.received)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._saved[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._saved.clear()

    def should_stop(self, group: Any = None) -> bool:
        """Collective: ``True`` on every rank when any rank received a stop signal. ``group``: a gloo
        group of every rank (``host_group``), the flag a host tensor (no device work); None: the
        mesh's world on its device."""
        if group is not None:
            flag = torch.tensor([1.0 if self.received else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        else:
            flag = torch.tensor([1.0 if self.received else 0.0], device=self.mesh.device)
            if self.mesh.is_distributed and dist.is_initialized():
                all_reduce_(flag, self.mesh.world, op="stop_flag", reduce=dist.ReduceOp.MAX)
        if flag.item() and self.received is None:
            self.received = "a signal to another rank"
        return bool(flag.item())


def rerun_hint() -> str:
    """How to resume this command after it stopped: the same launch again (``jigsaw-earth`` and this
    process's arguments; the launcher's own options are the user's)."""
    return (
        f"start the same job again ({shlex.join(['jigsaw-earth', *sys.argv[1:]])} on every rank, on any "
        f"hosts; the Slurm templates requeue exit {EXIT_PREEMPTED})"
    )


def host_group(mesh: DomainMesh) -> Any:
    """Collective: a group of every rank that reduces host tensors (the world's own when its backend is
    gloo, else a new gloo group); None for a single process."""
    if not (mesh.is_distributed and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    return dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
