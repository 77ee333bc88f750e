"""Where stored cells go in a tile: runs of storage indices and the copies that place them.

A read asks, along each storage axis, for storage indices at destination positions (-1 where
the destination is zero padding). ``axis_plan`` splits them into ``Run``s, each a contiguous
storage range whose destinations step by +1 or -1 (latitude stored south→north lands reversed),
and notes what the runs cannot express: positions to zero and positions that repeat an earlier
one (a replicated pole row). ``place`` copies one block of decoded chunks (``chunks.Block``) into
the destination for a product of runs, in at most three slabs per axis (a partial first chunk,
whole chunks, a partial last chunk), so every copy is one strided numpy assignment, however many
chunks a tile spans.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from jigsaw_earth.data.chunks import Block
from numpy.lib.array_utils import byte_bounds

__all__ = ["AxisPlan", "DirectRead", "Recording", "Run", "axis_plan", "place", "recording", "replay"]


@dataclass(frozen=True)
class Run:
    """Storage ``[start, stop)`` to destination ``dst, dst + step, ...`` (``step`` is ±1)."""

    start: int
    stop: int
    dst: int
    step: int = 1


@dataclass
class AxisPlan:
    """One axis of a read: its runs, the positions to zero and the repeats ``(dst, source dst)``."""

    runs: list[Run]
    zeros: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    repeats: list[tuple[int, int]] = field(default_factory=list)

    @property
    def span(self) -> tuple[int, int]:
        return min(r.start for r in self.runs), max(r.stop for r in self.runs)


def axis_plan(storage: np.ndarray, positions: np.ndarray | None = None) -> AxisPlan:
    """Runs for destination ``positions`` (default ``0..n-1``) reading ``storage`` (-1: zeros)."""
    storage = np.asarray(storage, np.int64)
    if positions is None and len(storage) == 1 and storage[0] >= 0:  # one time or level: the common case
        return AxisPlan([Run(int(storage[0]), int(storage[0]) + 1, 0)])
    positions = np.arange(len(storage)) if positions is None else np.asarray(positions, np.int64)
    first: dict[int, int] = {}
    pairs, repeats = [], []
    for s, d in zip(storage.tolist(), positions.tolist()):
        if s < 0:
            continue
        if s in first:
            repeats.append((d, first[s]))
        else:
            first[s] = d
            pairs.append((s, d))
    runs: list[Run] = []
    for s, d in sorted(pairs):
        last = runs[-1] if runs else None
        single = last is not None and last.stop - last.start == 1
        if (
            last
            and s == last.stop
            and ((single and abs(d - last.dst) == 1) or d == last.dst + last.step * (last.stop - last.start))
        ):
            step = d - last.dst if single else last.step
            runs[-1] = Run(last.start, s + 1, last.dst, step)
        else:
            runs.append(Run(s, s + 1, d))
    return AxisPlan(runs, positions[storage < 0], repeats)


def _slabs(a: int, b: int, origin: int, chunk: int, n_grid: int) -> list[tuple[slice, slice, int, int]]:
    """Storage ``[a, b)`` within a block: ``(grid slice, chunk slice, first storage index, length)``
    of its partial first chunk, whole chunks and partial last chunk (those that exist)."""
    lo, hi = max(a, origin), min(b, origin + n_grid * chunk)
    if lo >= hi:
        return []
    lo, hi = lo - origin, hi - origin
    k0, k1 = lo // chunk, (hi - 1) // chunk
    if k0 == k1:
        return [(slice(k0, k0 + 1), slice(lo - k0 * chunk, hi - k0 * chunk), lo + origin, hi - lo)]
    out = []
    if lo % chunk:
        out.append((slice(k0, k0 + 1), slice(lo % chunk, chunk), lo + origin, chunk - lo % chunk))
        k0 += 1
    full_end = hi // chunk
    if full_end > k0:
        out.append((slice(k0, full_end), slice(0, chunk), k0 * chunk + origin, (full_end - k0) * chunk))
    if hi % chunk:
        tail = hi % chunk
        out.append((slice(full_end, full_end + 1), slice(0, tail), full_end * chunk + origin, tail))
    return out


def place(block: Block, runs: tuple[Run, ...], dst: np.ndarray, scratch: np.ndarray | None = None) -> None:
    """Copy the cells of ``block`` that ``runs`` (one per storage axis) ask for into ``dst``,
    whose axes are the storage axes (a view of the caller's output, transposed to them).

    A box whose chunks are stored in C order is one strided copy. Otherwise (zarr-python stores
    a shard's chunks in Morton order) chunks are gathered one row of the chunk grid at a time
    (along the last axis) with ``take`` into ``scratch`` (cache-sized), then copied into place:
    that measured faster than copying Morton squares directly (numpy iterates many small axes).
    """
    n = len(runs)
    chunk = block.chunks.shape[1:]
    per_axis = [
        _slabs(r.start, r.stop, o, c, g) for r, o, c, g in zip(runs, block.origin, chunk, block.grid.shape)
    ]
    for combo in itertools.product(*per_axis):
        ids = block.grid[tuple(s[0] for s in combo)]
        part = block.chunks[(slice(None), *(s[1] for s in combo))]  # (N, l0, ..., l_{n-1})
        index, split = [], []
        for r, (g, c, first, length) in zip(runs, combo):
            d0 = r.dst + r.step * (first - r.start)
            stop = d0 + r.step * length
            index.append(slice(d0, None if stop < 0 else stop, r.step))
            split += [g.stop - g.start, c.stop - c.start]
        target = _split_axes(dst[tuple(index)], split)  # (m0, l0, m1, l1, ...)
        flat = ids.reshape(-1)
        if len(flat) == 1 or (flat[-1] - flat[0] == len(flat) - 1 and (np.diff(flat) == 1).all()):  # C order
            src = part[flat[0] : flat[-1] + 1].reshape(*ids.shape, *part.shape[1:])
            order = [k for j in range(n) for k in (j, n + j)]
            if not _read_direct(block, src, target, order):
                _copied()
                np.copyto(target, src.transpose(order), casting="unsafe")
            continue
        _copied()
        row_bytes = ids.shape[-1] * part[0].nbytes
        for lead in np.ndindex(*ids.shape[:-1]):
            row = ids[lead]
            if len(row) == 1 or (row[-1] - row[0] == len(row) - 1 and (np.diff(row) == 1).all()):
                src = part[row[0] : row[-1] + 1]
            elif scratch is not None and scratch.nbytes >= row_bytes:
                src = scratch[:row_bytes].view(part.dtype).reshape(len(row), *part.shape[1:])
                np.take(part, row, axis=0, out=src, mode="clip")
            else:
                src = np.take(part, row, axis=0)
            # src (m_last, l0, ..., l_{n-1}) -> (l0, ..., l_{n-2}, m_last, l_{n-1})
            sel = tuple(x for k in lead for x in (k, slice(None)))
            np.copyto(target[sel], src.transpose(*range(1, n), 0, n), casting="unsafe")


#: runs shorter than this are copied from the memory map (a strided copy beats many tiny reads),
#: unless there are at most ``FEW_RUNS`` of them; reads of more file ranges than that are copied too
DIRECT_MIN_BYTES = 4096
FEW_RUNS = 64
IOV_MAX = 1024  # buffers per preadv call (Linux's UIO_MAXIOV)


@dataclass
class DirectRead:
    """One ``preadv``: ``len(starts)`` runs of ``run`` bytes from ``pos`` in the file of the storage
    object ``coords``, landing at byte offsets ``starts`` from the lowest address of the output."""

    coords: tuple[int, ...]
    pos: int
    starts: np.ndarray
    run: int


class Recording:
    """What one read did, kept while ``recording`` is active in this thread: its direct reads, and
    whether every cell came that way (``complete``; a copied block makes the read not replayable)."""

    def __init__(self, low: int):
        self.low, self.reads, self.complete = low, [], True


_active = threading.local()


@contextmanager
def recording(out: np.ndarray) -> Iterator[Recording]:
    """Record the direct reads into ``out`` made by ``place`` in this thread (for ``replay``)."""
    rec = Recording(byte_bounds(out)[0])
    _active.rec = rec
    try:
        yield rec
    finally:
        _active.rec = None


def _copied() -> None:
    rec = getattr(_active, "rec", None)
    if rec is not None:
        rec.complete = False


@dataclass(frozen=True)
class Preadv:
    """One ``preadv`` call of a replay: its buffers in the output and where it reads from."""

    pos: int
    bufs: list[memoryview]
    size: int  # bytes the call must return


def preadv_calls(reads: list[DirectRead], out: np.ndarray) -> list[Preadv]:
    """The calls that repeat recorded ``reads`` (one storage object's) into ``out`` (same shape and
    strides as the recorded output): built once per output buffer, so a replay is only syscalls."""
    low, high = byte_bounds(out)
    window = memoryview((ctypes.c_char * (high - low)).from_address(low)).cast("B")
    return [c for r in reads for c in _calls(window, r.starts, r.run, r.pos)]


def _calls(window: memoryview, starts: np.ndarray, run: int, pos: int) -> list[Preadv]:
    """``len(starts)`` runs of ``run`` bytes from ``pos`` to ``window[starts]``, as calls of at
    most ``IOV_MAX`` buffers."""
    calls, starts = [], starts.tolist()
    for i in range(0, len(starts), IOV_MAX):
        bufs = [window[a : a + run] for a in starts[i : i + IOV_MAX]]
        calls.append(Preadv(pos, bufs, run * len(bufs)))
        pos += run * len(bufs)
    return calls


def _make(fd: int, file: str, calls: list[Preadv]) -> None:
    for c in calls:
        got = os.preadv(fd, c.bufs, c.pos)
        if got != c.size:
            raise ValueError(
                f"{file}: {got} bytes at offset {c.pos} where {c.size} were expected: the shard is truncated"
            )


def replay(file: str, calls: list[Preadv]) -> None:
    """Make ``calls`` on ``file`` (``preadv_calls``)."""
    with _opened(file) as fd:
        _make(fd, file, calls)


@contextmanager
def _opened(file: str) -> Iterator[int]:
    fd = os.open(file, os.O_RDONLY)
    try:
        yield fd
    finally:
        os.close(fd)


def _read_direct(block: Block, src: np.ndarray, target: np.ndarray, order: list[int]) -> bool:
    """Read ``src`` (cells of chunks in ``block.file``) into ``target`` (``src`` transposed by
    ``order``) with ``preadv``: the kernel copies each run that is contiguous on both sides from
    the page cache into place, without faulting the mapped pages in; one call per contiguous
    range of the file. False (nothing done) where the dtypes differ or there are many short runs
    or ranges (a strided copy from the memory map is then cheaper)."""
    if block.file is None or src.dtype != target.dtype or not src.size or min(src.strides) < 0:
        return False
    t = target.transpose(np.argsort(order))  # target's axes in src's order
    k, run = 0, t.itemsize
    for size, t_stride, s_stride in zip(t.shape[::-1], t.strides[::-1], src.strides[::-1]):
        if size != 1 and (t_stride != run or s_stride != run):
            break
        run *= size
        k += 1
    outer = t.ndim - k
    n_runs = int(np.prod(t.shape[:outer]))
    if run < DIRECT_MIN_BYTES and n_runs > FEW_RUNS:
        return False
    t_starts = np.zeros(1, np.int64)  # byte offset of every run from t's first cell, in src's order
    s_starts = np.zeros(1, np.int64)  # ... and from src's first cell
    for size, t_stride, s_stride in zip(t.shape[:outer], t.strides[:outer], src.strides[:outer]):
        step = np.arange(size, dtype=np.int64)
        t_starts = (t_starts[:, None] + step * t_stride).reshape(-1)
        s_starts = (s_starts[:, None] + step * s_stride).reshape(-1)
    ranges = np.split(np.arange(n_runs), np.nonzero(np.diff(s_starts) != run)[0] + 1)
    if len(ranges) > FEW_RUNS:
        return False
    lo, hi = int(t_starts.min()), int(t_starts.max()) + run
    window = memoryview((ctypes.c_char * (hi - lo)).from_address(t.ctypes.data + lo)).cast("B")
    first = block.offset + (src.ctypes.data - block.chunks.ctypes.data)
    rec = getattr(_active, "rec", None)
    with _opened(block.file) as fd:
        for runs in ranges:
            pos = first + int(s_starts[runs[0]])
            _make(fd, block.file, _calls(window, t_starts[runs] - lo, run, pos))
            if rec is not None:  # offsets from the lowest address of the recorded output
                at = t_starts[runs] + (t.ctypes.data - rec.low)
                rec.reads.append(DirectRead(block.coords, pos, at, run))
    return True


def _split_axes(view: np.ndarray, split: list[int]) -> np.ndarray:
    """``view`` with axis ``j`` split into ``(split[2j], split[2j+1])``: always a view (no copy)."""
    strides = []
    for j, s in enumerate(view.strides):
        strides += [split[2 * j + 1] * s, s]
    return np.lib.stride_tricks.as_strided(view, shape=split, strides=strides)
