"""Point-to-point transport and communication accounting.

Every byte that a jigsaw collective moves goes through ``exchange`` (P2P) or ``all_reduce_``
here, and is recorded in the process-wide ``ledger`` under the current call site (``ledger.stack``,
``ledger.current_site``). Tests and benchmarks read the ledger to assert volumes against analytical
figures. How messages travel is the mesh's ``Wire`` (``transport.py``), which every ``Axis`` of the
mesh holds: per pair of ranks, ``torch.distributed.batch_isend_irecv`` (gloo on CPU, NCCL on GPU),
or, for CPU tensors between ranks of one host, shared-memory rings (``shm.py``): the same messages
in the same order, without gloo's socket and transport thread. A job on several hosts keeps the
rings within each host and reaches the other hosts through the process group. Ranks that share a
GPU stage device tensors: copied to pinned host memory, carried as CPU tensors are, copied back to
the device (``Wire.staged``).

``Wire.overlap = False`` makes every exchange wait for its transfers as soon as they are posted
(the same messages in the same order, so the same numbers): on a CPU host loaded far beyond its
cores, where gloo's transport thread waits for a core, that was faster; on a lightly loaded one
overlap is (docs/scaling.md). The trainer sets it from ``distributed.overlap`` (default on).

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
    "ring_bytes",
    "run_exchange",
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
    def stack(self) -> tuple[str, ...]:
        """The names of the ``comm_site`` blocks the code is in, outermost first (empty outside any)."""
        return tuple(self._stack)

    @property
    def current_site(self) -> str:
        """The current call site: ``stack`` joined by ``/``, or ``unnamed``."""
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


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """``t`` copied to pinned host memory, the copy finished (a send reads the memory at once)."""
    host = host_empty(t.shape, t.dtype, t.device)
    host.copy_(t, non_blocking=True)
    copies_done(t.device)()
    return host


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
    wire = axis.wire
    staged = device if device.type != "cpu" and wire.staged else None
    if staged is not None:
        sends = [(peer, _to_host(t)) for peer, t in sends if t.numel()]
        device = torch.device("cpu")
    rings = wire.rings if device.type == "cpu" else None
    received = [_buffer(shape, dtype, device, staged) for _, shape in recvs]
    posted_recvs = [(peer, buf) for (peer, _), buf in zip(recvs, received) if buf.numel()]
    posted_sends = [(peer, t.contiguous()) for peer, t in sends if t.numel()]
    ledger.record(op, sum(_nbytes(t) for _, t in posted_sends), sum(_nbytes(b) for _, b in posted_recvs))
    works: list = []
    if rings is not None:  # the pairs within this host: the rings; the others: the process group
        near = rings.peers
        ring_sends = [(p, t) for p, t in posted_sends if p in near]
        ring_recvs = [(p, b) for p, b in posted_recvs if p in near]
        if ring_sends or ring_recvs:
            works.append(rings.post(ring_sends, ring_recvs, tag))
        posted_sends = [(p, t) for p, t in posted_sends if p not in near]
        posted_recvs = [(p, b) for p, b in posted_recvs if p not in near]
    ops = [dist.P2POp(dist.irecv, buf, peer, axis.group, tag) for peer, buf in posted_recvs]
    ops += [dist.P2POp(dist.isend, t, peer, axis.group, tag) for peer, t in posted_sends]
    if ops:
        works += dist.batch_isend_irecv(ops)
    pending = Pending(works, received, staged)
    if not wire.overlap:
        pending.wait()
    return pending


def _buffer(
    shape: Sequence[int], dtype: torch.dtype, device: torch.device, staged: torch.device | None
) -> torch.Tensor:
    """A receive buffer: on ``device``, or in pinned host memory bound for ``staged``."""
    if staged is not None:
        return host_empty(shape, dtype, staged)
    return torch.empty(shape, dtype=dtype, device=device)


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
            if tensor.device.type != "cpu" and axis.wire.staged:
                host = _to_host(tensor)
                dist.all_reduce(host, op=reduce, group=axis.group)
                tensor.copy_(host, non_blocking=True)
            else:
                dist.all_reduce(tensor, op=reduce, group=axis.group)
    return tensor
