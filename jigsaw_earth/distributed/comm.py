"""Point-to-point transport and communication accounting.

Every byte that a jigsaw collective moves goes through ``exchange`` (P2P) or ``all_reduce_``
here, and is recorded in the process-wide ``ledger`` under the current call site. Tests and
benchmarks read the ledger to assert volumes against analytical figures. The transport is
``torch.distributed.batch_isend_irecv``, which runs unchanged on gloo (CPU) and NCCL (GPU).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .mesh import Axis

__all__ = ["CommLedger", "Pending", "all_reduce_", "comm_site", "exchange", "ledger"]


@dataclass
class SiteStats:
    calls: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0


@dataclass
class CommLedger:
    """Bytes sent and received by this rank, per call site."""

    sites: dict[str, SiteStats] = field(default_factory=lambda: defaultdict(SiteStats))
    _stack: list[str] = field(default_factory=list)

    @property
    def current_site(self) -> str:
        return "/".join(self._stack) or "unnamed"

    def record(self, op: str, sent: int, received: int) -> None:
        stats = self.sites[f"{self.current_site}:{op}"]
        stats.calls += 1
        stats.bytes_sent += sent
        stats.bytes_received += received

    def reset(self) -> None:
        self.sites.clear()

    @property
    def bytes_sent(self) -> int:
        return sum(s.bytes_sent for s in self.sites.values())

    @property
    def bytes_received(self) -> int:
        return sum(s.bytes_received for s in self.sites.values())

    def summary(self) -> dict[str, dict[str, int]]:
        return {k: vars(v).copy() for k, v in sorted(self.sites.items())}


ledger = CommLedger()


@contextlib.contextmanager
def comm_site(name: str) -> Iterator[None]:
    """Tag the communication issued inside the block (nested names join with ``/``)."""
    ledger._stack.append(name)
    try:
        yield
    finally:
        ledger._stack.pop()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class Pending:
    """Received tensors of an exchange in flight; ``wait()`` returns them."""

    def __init__(self, works: list, received: list[torch.Tensor]):
        self._works = works
        self._received = received

    def wait(self) -> list[torch.Tensor]:
        for w in self._works:
            w.wait()
        self._works = []
        return self._received


def exchange(
    axis: Axis,
    sends: Sequence[tuple[int, torch.Tensor]],
    recvs: Sequence[tuple[int, torch.Size | tuple[int, ...]]],
    *,
    op: str,
    dtype: torch.dtype,
    device: torch.device,
    tag: int = 0,
) -> Pending:
    """Post sends to and receives from peers (global ranks), all at once, without waiting.

    ``sends`` holds ``(peer, tensor)``, ``recvs`` holds ``(peer, shape)``. Peers equal to this
    rank are not allowed (callers copy locally). Empty tensors are skipped on both sides: the
    sizes are global knowledge, so sender and receiver agree. Messages between one pair with
    one ``tag`` are matched in the order they were posted on both sides.
    """
    ops: list[dist.P2POp] = []
    received: list[torch.Tensor] = []
    sent_bytes = recv_bytes = 0
    for peer, shape in recvs:
        buf = torch.empty(shape, dtype=dtype, device=device)
        received.append(buf)
        if buf.numel():
            ops.append(dist.P2POp(dist.irecv, buf, peer, axis.group, tag))
            recv_bytes += _nbytes(buf)
    for peer, tensor in sends:
        if tensor.numel():
            ops.append(dist.P2POp(dist.isend, tensor.contiguous(), peer, axis.group, tag))
            sent_bytes += _nbytes(tensor)
    ledger.record(op, sent_bytes, recv_bytes)
    works = dist.batch_isend_irecv(ops) if ops else []
    return Pending(works, received)


def all_reduce_(tensor: torch.Tensor, axis: Axis, *, op: str = "all_reduce") -> torch.Tensor:
    """In-place sum over the axis. Records the ring all-reduce volume 2(P-1)/P of the tensor."""
    if axis.size > 1:
        moved = 2 * (axis.size - 1) * _nbytes(tensor) // axis.size
        ledger.record(op, moved, moved)
        dist.all_reduce(tensor, group=axis.group)
    return tensor
