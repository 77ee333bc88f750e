"""Point-to-point messages between the ranks of one host through shared memory (CPU tensors).

gloo carries every CPU message through a socket and its transport thread; on a host with one
core per rank that thread's wake-ups cost about a quarter of a serial step per rank
(docs/scaling.md), which made a second rank slower than one. Here each ordered pair of ranks owns
a ring buffer in ``/dev/shm`` with one writer and one reader: a send copies the tensor's bytes
in, a receive copies them out, and a rank that waits drives every transfer it has posted (no
thread), so messages larger than the ring stream through it. Every message carries its tag; one
that arrives before its receive is posted is kept aside, so messages match per (peer, tag) in
posting order, as torch.distributed's do.

Used by ``comm.exchange`` for CPU tensors between the ranks of one x86-64 host (its cores see
each other's stores in program order, which the ring's two counters rely on): ``connect`` groups
the ranks by host (hostname, boot id and the ``/dev/shm`` they see), and each host with more than
one rank gets rings between its ranks; messages to the other hosts, and every message with
``distributed.transport: backend``, go through the process group.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import mmap
import os
import platform
import socket
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from .heartbeat import PeerGone

__all__ = ["SharedMemoryTransport", "connect"]

log = logging.getLogger(__name__)

HEADER = 16  # bytes before every message: tag and payload length (uint64 each)
_CTRL = 128  # bytes of counters at the start of a ring: bytes written at 0, bytes read at 64
RING_BYTES = 16 << 20  # per ordered pair of ranks, at most (messages larger than this stream)
SHM_BUDGET = 256 << 20  # all rings of a host together, at most
_DIR = "/dev/shm"


def _padded(n: int) -> int:
    return -(-n // HEADER) * HEADER


def _bytes_of(t: torch.Tensor) -> np.ndarray:
    """A contiguous tensor's memory as a flat uint8 array (shared, no copy; any dtype)."""
    return t.reshape(-1).view(torch.uint8).numpy() if t.numel() else np.zeros(0, np.uint8)


class _Ring:
    """One direction of one pair: ``capacity`` data bytes after two counters (written, read)."""

    def __init__(self, mm: mmap.mmap, capacity: int):
        self.mm, self.capacity = mm, capacity
        self.written = np.ndarray((1,), np.uint64, mm, 0)
        self.read = np.ndarray((1,), np.uint64, mm, 64)
        self.data = np.ndarray((capacity,), np.uint8, mm, _CTRL)


class _Doorbells:
    """One futex word per rank (plus a "sleeping" flag): a rank that finds nothing to do sleeps on
    its word in the kernel; a peer that writes to it or reads from it rings it. A wake-up lost to
    a race costs at most ``NAP_S`` (the sleep's timeout), never a hang."""

    NAP_S = 1e-3

    def __init__(self, mm: mmap.mmap, world: int):
        self.mm = mm
        words = np.ndarray((world, 16), np.uint32, mm, 0)  # 64 bytes per rank: seq, sleeping
        self.seq, self.sleeping = words[:, 0], words[:, 1]
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._nap = _Timespec(0, int(self.NAP_S * 1e9))

    def ring(self, rank: int) -> None:
        """Wake the rank at position ``rank`` of this host's ranks."""
        self.seq[rank] += 1
        if self.sleeping[rank]:
            self._libc.syscall(_SYS_FUTEX, self._c_addr(rank), _FUTEX_WAKE, 1 << 30, None, None, 0)

    def sleep(self, rank: int, seen: int) -> None:
        """Sleep until the word of position ``rank`` differs from ``seen`` (or ``NAP_S``)."""
        self._libc.syscall(
            _SYS_FUTEX,
            self._c_addr(rank),
            _FUTEX_WAIT,
            ctypes.c_uint32(seen),
            ctypes.byref(self._nap),
            None,
            0,
        )

    def _c_addr(self, rank: int) -> ctypes.c_void_p:
        return ctypes.c_void_p(self._base + 64 * rank)


_SYS_FUTEX, _FUTEX_WAIT, _FUTEX_WAKE = 202, 0, 1  # x86-64 Linux; shared (not private) futexes


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Op:
    """A posted send or receive; ``done`` once its bytes are in the ring / in ``dest``."""

    __slots__ = ("claimed_by", "dest", "done", "peer")

    def __init__(self, peer: int, dest: np.ndarray | None = None):
        self.peer, self.dest, self.done = peer, dest, False
        self.claimed_by: _Op | None = None  # a receive waiting for this early arrival


class _Outgoing:
    """The sending end of one ring: messages queued in posting order, copied in as space frees."""

    def __init__(self, ring: _Ring, wake: Callable[[], None]):
        self.ring, self.pos, self.wake = ring, 0, wake
        self.queue: deque[tuple[_Op, list[np.ndarray]]] = deque()

    def push(self) -> bool:
        ring, cap, moved = self.ring, self.ring.capacity, False
        while self.queue:
            op, parts = self.queue[0]
            free = cap - (self.pos - int(ring.read[0]))
            while parts and free:
                part = parts[0]
                k = min(free, len(part))
                start = self.pos % cap
                first = min(k, cap - start)
                ring.data[start : start + first] = part[:first]
                if k > first:
                    ring.data[: k - first] = part[first:k]
                self.pos += k
                free -= k
                if k == len(part):
                    parts.pop(0)
                else:
                    parts[0] = part[k:]
            if int(ring.written[0]) != self.pos:
                ring.written[0] = self.pos  # after the bytes: x86-64 keeps stores in order
                self.wake()
            if parts:
                break
            op.done, moved = True, True
            self.queue.popleft()
        return moved


class _Incoming:
    """The receiving end of one ring: matches each arriving message to the first receive posted
    for its tag, or keeps it aside until one is."""

    def __init__(self, ring: _Ring, peer: int, wake: Callable[[], None]):
        self.ring, self.peer, self.pos, self.wake = ring, peer, 0, wake
        self.expected: dict[int, deque[_Op]] = defaultdict(deque)
        self.early: dict[int, deque[_Op]] = defaultdict(deque)
        self.current: _Op | None = None
        self.size = self.filled = self.left = 0

    def post(self, op: _Op, tag: int) -> None:
        if self.early[tag]:
            got = self.early[tag].popleft()
            _check_size(got.dest.nbytes, op, tag)  # type: ignore[union-attr]
            if got.done:
                op.dest[:] = got.dest  # type: ignore[index]
                op.done = True
            else:
                got.claimed_by = op
        else:
            self.expected[tag].append(op)

    def pull(self) -> bool:
        ring, cap, moved = self.ring, self.ring.capacity, False
        while True:
            avail = int(ring.written[0]) - self.pos
            if self.current is None:
                if avail < HEADER:
                    break
                start = self.pos % cap
                tag, size = (int(x) for x in ring.data[start : start + HEADER].view(np.uint64))
                self.pos += HEADER
                avail -= HEADER
                self.current = self._match(tag, size)
                self.size, self.filled, self.left = size, 0, _padded(size)
            k = min(avail, self.left)
            if k:
                useful = min(k, self.size - self.filled)
                start = self.pos % cap
                first = min(useful, cap - start)
                dest = self.current.dest
                dest[self.filled : self.filled + first] = ring.data[start : start + first]  # type: ignore[index]
                if useful > first:
                    dest[self.filled + first : self.filled + useful] = ring.data[: useful - first]  # type: ignore[index]
                self.pos += k
                self.filled += useful
                self.left -= k
            if self.left:
                break
            self._complete(self.current)
            self.current, moved = None, True
        if int(ring.read[0]) != self.pos:
            ring.read[0] = self.pos
            self.wake()  # the sender may wait for room
        return moved

    def _match(self, tag: int, size: int) -> _Op:
        if self.expected[tag]:
            op = self.expected[tag].popleft()
            _check_size(size, op, tag)
            return op
        early = _Op(self.peer, np.empty(size, np.uint8))
        self.early[tag].append(early)
        return early

    @staticmethod
    def _complete(op: _Op) -> None:
        op.done = True
        if op.claimed_by is not None:
            op.claimed_by.dest[:] = op.dest  # type: ignore[index]
            op.claimed_by.done = True


def _check_size(size: int, op: _Op, tag: int) -> None:
    if size != op.dest.nbytes:  # type: ignore[union-attr]
        raise RuntimeError(
            f"rank {op.peer} sent {size} bytes with tag {tag} where this rank posted a "
            f"receive of {op.dest.nbytes}: the ranks run different programs"
        )  # type: ignore[union-attr]


class _Handle:
    """What ``post`` returns: ``wait()`` drives transfers until its operations are done."""

    def __init__(self, transport: SharedMemoryTransport, ops: list[_Op], keep: list[torch.Tensor]):
        self._transport, self._ops, self._keep = transport, ops, keep

    def wait(self) -> None:
        self._transport.wait(self._ops)
        self._keep = []


class SharedMemoryTransport:
    """Rings to and from every other rank of this host (``connect`` builds it). Ranks are global;
    ``local`` lists this host's, whose positions index the doorbells."""

    def __init__(
        self,
        rank: int,
        outgoing: dict[int, _Ring],
        incoming: dict[int, _Ring],
        bells: _Doorbells,
        pids: dict[int, int],
        timeout_s: float,
        oversubscribed: bool,
        local: Sequence[int],
    ):
        self.rank, self.pids, self.timeout_s, self.bells = rank, dict(pids), timeout_s, bells
        self.slot = {r: i for i, r in enumerate(local)}  # global rank -> its doorbell
        self.peers = frozenset(r for r in local if r != rank)
        wake = {p: functools.partial(bells.ring, self.slot[p]) for p in self.peers}
        self.out = {p: _Outgoing(r, wake[p]) for p, r in outgoing.items()}
        self.inc = {p: _Incoming(r, p, wake[p]) for p, r in incoming.items()}
        self.spin = 0 if oversubscribed else 200  # polls before sleeping (one core per rank)
        self.yield_after = 8  # polls after which each further one first offers the core (sched_yield)

    def post(
        self, sends: Sequence[tuple[int, torch.Tensor]], recvs: Sequence[tuple[int, torch.Tensor]], tag: int
    ) -> _Handle:
        """Queue ``sends`` (peer, contiguous CPU tensor) and post ``recvs`` (peer, tensor to fill)."""
        ops: list[_Op] = []
        for peer, buf in recvs:
            op = _Op(peer, _bytes_of(buf))
            self.inc[peer].post(op, tag)
            ops.append(op)
        for peer, t in sends:
            payload = _bytes_of(t)
            op = _Op(peer)
            header = np.array([tag, payload.nbytes], np.uint64).view(np.uint8)
            pad = np.zeros(_padded(payload.nbytes) - payload.nbytes, np.uint8)
            self.out[peer].queue.append((op, [p for p in (header, payload, pad) if len(p)]))
            ops.append(op)
        for peer, _ in sends:
            self.out[peer].push()
        return _Handle(self, ops, [t for _, t in sends] + [b for _, b in recvs])

    def progress(self) -> bool:
        moved = False
        for o in self.out.values():
            if o.queue:
                moved |= o.push()
        for i in self.inc.values():
            moved |= i.pull()
        return moved

    def wait(self, ops: list[_Op]) -> None:
        polls, start, next_check = 0, time.monotonic(), 1.0
        me, bells = self.slot[self.rank], self.bells
        while True:
            seen = int(bells.seq[me])
            moved = self.progress()
            if all(op.done for op in ops):
                return
            if moved:
                polls = 0
                continue
            polls += 1
            if polls <= self.spin:
                if polls > self.yield_after:  # a peer (or anyone) waiting for this core runs first
                    os.sched_yield()
                continue
            bells.sleeping[me] = 1
            if not self.progress():  # nothing arrived between the last look and the flag
                bells.sleep(me, seen)
            bells.sleeping[me] = 0
            waited = time.monotonic() - start
            if waited > next_check:
                next_check += 1.0
                self._check_peers(ops, waited)

    def _check_peers(self, ops: list[_Op], waited: float) -> None:
        for peer in sorted({op.peer for op in ops if not op.done}):
            try:
                os.kill(self.pids[peer], 0)
            except ProcessLookupError:
                raise PeerGone(
                    f"rank {peer} (pid {self.pids[peer]}) exited while rank {self.rank} "
                    f"waited for a message from or to it"
                ) from None
            if waited > self.timeout_s:
                raise RuntimeError(
                    f"rank {self.rank} waited {waited:.0f} s for a message from or to rank "
                    f"{peer} (distributed.timeout_s = {self.timeout_s:g}): a rank hangs"
                )


def _ring_path(token: str, src: int, dst: int) -> str:
    return os.path.join(_DIR, f"jigsaw-{token}-{src}-{dst}")


def _map(path: str, size: int, create: bool) -> mmap.mmap:
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if create:
            os.ftruncate(fd, size)
            os.posix_fallocate(fd, 0, size)  # reserve now: a full /dev/shm fails here, not mid-run
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def _host_key() -> tuple[str, str, int]:
    """What ranks of one host share: its name, its boot, the ``/dev/shm`` they see (two containers
    or simulated hosts with one kernel have their own)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    try:
        shm_dev = os.stat(_DIR).st_dev
    except OSError:
        shm_dev = -1
    return socket.gethostname(), boot, shm_dev


def connect(timeout_s: float) -> SharedMemoryTransport | None:
    """Collective over the default group: rings between the ranks of each x86-64 host that has
    more than one rank and room in /dev/shm; this rank's, or None where its host has none. The ring
    files are unlinked once every rank has mapped them, so nothing is left behind, even after a
    crash."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world < 2:
        return None
    try:
        free = os.statvfs(_DIR).f_bavail * os.statvfs(_DIR).f_frsize
    except OSError:
        free = 0
    cores = len(os.sched_getaffinity(0))
    me = (_host_key(), os.getpid(), platform.machine(), free, uuid.uuid4().hex[:12], cores)
    everyone: list = [None] * world
    dist.all_gather_object(everyone, me)
    local = [r for r in range(world) if everyone[r][0] == me[0]]
    first = everyone[local[0]]
    rings = len(local) * (len(local) - 1)
    capacity = min(RING_BYTES, SHM_BUDGET // max(rings, 1)) // HEADER * HEADER
    usable = (
        len(local) > 1
        and all(everyone[r][2] in ("x86_64", "AMD64") for r in local)
        and capacity >= (1 << 20)
        and first[3] > 2 * rings * (capacity + _CTRL)
    )
    token, size = first[4], capacity + _CTRL
    bells_path, bells_size = os.path.join(_DIR, f"jigsaw-{token}-bells"), 64 * len(local)
    mine: list[str] = []
    incoming: dict[int, _Ring] = {}
    bells_map, error = None, ""
    if usable:
        mine = [_ring_path(token, src, rank) for src in local if src != rank]
        mine += [bells_path] if rank == local[0] else []
        try:
            for src in local:
                if src != rank:
                    incoming[src] = _Ring(_map(_ring_path(token, src, rank), size, True), capacity)
            if rank == local[0]:
                bells_map = _map(bells_path, bells_size, True)
        except OSError as err:
            error = f"rank {rank}: {err}"
    errors: list = [None] * world
    dist.all_gather_object(errors, error)
    failed = [errors[r] for r in local if errors[r]]
    outgoing: dict[int, _Ring] = {}
    try:
        if usable and not failed:
            outgoing = {dst: _Ring(_map(_ring_path(token, rank, dst), size, False), capacity)
                        for dst in local if dst != rank}  # fmt: skip
            bells_map = bells_map or _map(bells_path, bells_size, False)
    finally:
        dist.barrier()
        for path in mine:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    if not usable:
        log.debug("shared-memory transport off on this host (one rank, not x86-64, or /dev/shm full)")
        return None
    if failed:
        log.warning("shared-memory transport off on this host: %s", "; ".join(failed))
        return None
    log.debug("shared-memory transport: %d rings of %d MiB on this host", rings, capacity >> 20)
    return SharedMemoryTransport(
        rank,
        outgoing,
        incoming,
        _Doorbells(bells_map, len(local)),  # type: ignore[arg-type]
        {r: everyone[r][1] for r in local},
        timeout_s,
        oversubscribed=len(local) > max(first[5], 1),
        local=local,
    )
