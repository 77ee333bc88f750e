"""Point-to-point transport and communication accounting.

Every byte that a jigsaw collective moves goes through ``exchange`` (P2P) or ``all_reduce_``
here, and is recorded in the process-wide ``ledger`` under the current call site. Tests and
benchmarks read the ledger to assert volumes against analytical figures. The transport is
``torch.distributed.batch_isend_irecv``, which runs unchanged on gloo (CPU) and NCCL (GPU), or,
for CPU tensors between ranks of one host, shared-memory rings (``shm.py``, ``set_transport``):
the same messages in the same order, without gloo's socket and transport thread. Ranks that share
a GPU (``transport.py``) stage device tensors: copied to pinned host memory, carried as CPU
tensors are, copied back to the device (``set_transport(..., staged=True)``, ``wire_device``).

``set_overlap(False)`` makes every exchange wait for its transfers as soon as they are posted
(the same messages in the same order, so the same numbers): on a CPU host loaded far beyond its
cores, where gloo's transport thread waits for a core, that was faster; on a lightly loaded one
overlap is (docs/scaling.md). The trainer's ``distributed.overlap`` sets it (default on).

The ledger also keeps ``wait_s``: the seconds this rank spent blocked in communication
(``Pending.wait``, the all-reduces, and any call made inside ``blocking()``): the exposed
communication of the trainer's step accounting. Two clock reads per blocking call, so it stays on.

Under ``torch.compile`` every exchange runs eagerly between compiled graphs: ``run_exchange`` (the
one way the layers call an exchanging autograd function) calls it through a
``torch.compiler.disable``d function once ``arm_for_compile()`` has made one (``models.run.
compile_model`` and ``Forecaster.compile`` do; it imports Dynamo, which a process that compiles
nothing never loads). Each exchange is then one graph break at its call, the compiled code around
it is traced once, and nothing of the transport (Python objects, the ledger, the shared-memory
rings) is traced. ``comm_site`` tags
nothing while Dynamo traces (a user context manager around a graph break would make Dynamo run the
rest of the function uncompiled): the compiled forward's bytes are recorded under their op names
(``unnamed:…``), as every backward's are. docs/layers.md lists the breaks.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ..device import copies_done, host_empty
from .axis import Axis

__all__ = [
    "CommLedger",
    "Pending",
    "all_reduce_",
    "arm_for_compile",
    "blocking",
    "comm_site",
    "constant_when_compiled",
    "exchange",
    "ledger",
    "overlap_enabled",
    "ring_bytes",
    "run_exchange",
    "set_overlap",
    "set_transport",
    "wire_device",
]


@dataclass
class SiteStats:
    calls: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0


@dataclass
class CommLedger:
    """Bytes sent and received by this rank, per call site; seconds blocked in communication."""

    sites: dict[str, SiteStats] = field(default_factory=lambda: defaultdict(SiteStats))
    wait_s: float = 0.0  # never reset: readers take differences
    _stack: list[str] = field(default_factory=list)
    _blocked: int = 0  # depth of nested ``blocking`` blocks (only the outermost is timed)

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
# whether exchanges return before their transfers complete (set_overlap; JIGSAW_OVERLAP=off
# sets the default of processes that build no Trainer: the validator, benchmarks, tests)
_overlap = [os.environ.get("JIGSAW_OVERLAP", "on").lower() != "off"]


_transport: list = [None]  # a shm.SharedMemoryTransport carrying CPU messages, or None
_staged = [False]  # device tensors cross ranks through host memory (ranks sharing a GPU)


def set_transport(transport: object | None, staged: bool = False) -> None:
    """Carry CPU point-to-point messages through ``transport`` (None: the process group); ``staged``:
    copy device tensors to host memory for every message (the process group carries host memory)."""
    _transport[0] = transport
    _staged[0] = staged


def wire_device(device: torch.device) -> torch.device:
    """Where a tensor handed to the process group lives: the CPU when messages are staged, else
    ``device`` (the rank's own: NCCL takes device tensors only)."""
    return torch.device("cpu") if _staged[0] else device


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """``t`` copied to pinned host memory, the copy finished (a send reads the memory at once)."""
    host = host_empty(t.shape, t.dtype, t.device)
    host.copy_(t, non_blocking=True)
    copies_done(t.device)()
    return host


def set_overlap(enabled: bool) -> None:
    """Post transfers and return (``True``, the default), or wait for them at once (``False``)."""
    _overlap[0] = bool(enabled)


def overlap_enabled() -> bool:
    return _overlap[0]


def comm_site(name: str) -> contextlib.AbstractContextManager[None]:
    """Tag the communication issued inside the block (nested names join with ``/``); while
    Dynamo traces, a ``nullcontext`` (the module docstring says why)."""
    if torch.compiler.is_compiling():
        return contextlib.nullcontext()
    return _site(name)


@contextlib.contextmanager
def _site(name: str) -> Iterator[None]:
    ledger._stack.append(name)
    try:
        yield
    finally:
        ledger._stack.pop()


_EAGER: list[Callable[..., Any]] = []  # ``_call`` under torch.compiler.disable, once armed
_CONSTANT: list[Callable[..., Any]] = []  # functions Dynamo calls while tracing and keeps the result of


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def arm_for_compile() -> None:
    """Prepare ``torch.compile`` for the exchanges; call it before compiling a model.

    Every ``run_exchange`` becomes a graph break, run eagerly with Dynamo off inside it (nothing
    of an exchange is traced). Dynamo's nested graph breaks (where this torch has them, set
    process-wide) let a break inside a layer resume tracing in that layer, so the graphs run from
    one exchange to the next instead of splitting every enclosing forward at the call that led
    to it; and a frame may hold 64 compiled variants (one frame serves every instance of a layer,
    each shape its own variant) before Dynamo would leave it uncompiled. The functions of
    ``constant_when_compiled`` are marked ``torch.compiler.assume_constant_result``."""
    if not _EAGER:
        _EAGER.append(
            torch.compiler.disable(_call, reason="a jigsaw exchange, run eagerly between compiled graphs")
        )
        for fn in _CONSTANT:
            torch.compiler.assume_constant_result(fn)  # marks ``fn`` in place
    config = torch._dynamo.config
    if hasattr(config, "nested_graph_breaks"):
        config.nested_graph_breaks = True
    config.recompile_limit = max(config.recompile_limit, 64)


def constant_when_compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Register ``fn``, a pure function of hashable arguments (a plan, a check), for
    ``torch.compiler.assume_constant_result`` when ``arm_for_compile`` runs: Dynamo then calls it
    once while tracing and keeps the answer instead of tracing its body (and the caches in it)."""
    _CONSTANT.append(fn)
    if _EAGER:
        torch.compiler.assume_constant_result(fn)
    return fn


def run_exchange(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, where ``fn`` (an exchanging autograd function's ``apply``) moves messages
    between ranks in its forward or backward; after ``arm_for_compile`` never traced by
    ``torch.compile`` (one graph break per call). Call it only where messages move: a one-rank
    path stays plain torch, compiled."""
    return _EAGER[0](fn, *args) if _EAGER else fn(*args)


@contextlib.contextmanager
def blocking() -> Iterator[None]:
    """Count the time spent inside the block as this rank blocked on communication
    (``ledger.wait_s``); wrap every wait on a collective or a transfer in it."""
    ledger._blocked += 1
    t0 = time.perf_counter()
    try:
        yield
    finally:
        ledger._blocked -= 1
        if not ledger._blocked:
            ledger.wait_s += time.perf_counter() - t0


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class Pending:
    """Received tensors of an exchange in flight; ``wait()`` returns them (on ``device``: staged
    messages are copied there from host memory)."""

    def __init__(self, works: list, received: list[torch.Tensor], device: torch.device | None = None):
        self._works = works
        self._received = received
        self._device = device

    def wait(self) -> list[torch.Tensor]:
        if self._works:
            with blocking():
                for w in self._works:
                    w.wait()
        self._works = []
        if self._device is not None:
            self._received = [b.to(self._device, non_blocking=True) for b in self._received]
            self._device = None
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
    staged = device if device.type != "cpu" and _staged[0] else None
    if staged is not None:
        sends = [(peer, _to_host(t)) for peer, t in sends if t.numel()]
        device = torch.device("cpu")
    shm = _transport[0] if device.type == "cpu" else None
    if shm is not None:
        return _exchange_shm(shm, sends, recvs, op=op, dtype=dtype, tag=tag, staged=staged)
    ops: list[dist.P2POp] = []
    received: list[torch.Tensor] = []
    sent_bytes = recv_bytes = 0
    for peer, shape in recvs:
        buf = _buffer(shape, dtype, device, staged)
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
    pending = Pending(works, received, staged)
    if not _overlap[0]:
        pending.wait()
    return pending


def _buffer(
    shape: Sequence[int], dtype: torch.dtype, device: torch.device, staged: torch.device | None
) -> torch.Tensor:
    """A receive buffer: on ``device``, or in pinned host memory bound for ``staged``."""
    if staged is not None:
        return host_empty(shape, dtype, staged)
    return torch.empty(shape, dtype=dtype, device=device)


def _exchange_shm(shm, sends, recvs, *, op: str, dtype: torch.dtype, tag: int, staged=None) -> Pending:
    """``exchange`` through the shared-memory rings (the same skipping of empty tensors)."""
    received = [_buffer(shape, dtype, torch.device("cpu"), staged) for _, shape in recvs]
    posted_recvs = [(peer, buf) for (peer, _), buf in zip(recvs, received) if buf.numel()]
    posted_sends = [(peer, t.contiguous()) for peer, t in sends if t.numel()]
    ledger.record(op, sum(_nbytes(t) for _, t in posted_sends), sum(_nbytes(b) for _, b in posted_recvs))
    pending = Pending([shm.post(posted_sends, posted_recvs, tag)], received, staged)
    if not _overlap[0]:
        pending.wait()
    return pending


def ring_bytes(kind: str, nbytes: int, ranks: int) -> int:
    """Bytes one rank sends in a ring ``kind`` (``all_reduce``, ``all_gather``, ``reduce_scatter``) of
    ``nbytes`` per rank: ``2(P-1)/P`` of it for an all-reduce, ``(P-1)/P`` for the others."""
    if ranks <= 1:
        return 0
    factor = 2 if kind == "all_reduce" else 1
    return factor * (ranks - 1) * nbytes // ranks


def all_reduce_(
    tensor: torch.Tensor, axis: Axis, *, op: str = "all_reduce", reduce: dist.ReduceOp = dist.ReduceOp.SUM
) -> torch.Tensor:
    """In-place reduction (a sum unless ``reduce``) over the axis; records its ring volume."""
    if axis.size > 1:
        moved = ring_bytes("all_reduce", _nbytes(tensor), axis.size)
        ledger.record(op, moved, moved)
        with blocking():
            if tensor.device.type != "cpu" and _staged[0]:
                host = _to_host(tensor)
                dist.all_reduce(host, op=reduce, group=axis.group)
                tensor.copy_(host, non_blocking=True)
            else:
                dist.all_reduce(tensor, op=reduce, group=axis.group)
    return tensor
