"""Reads that run ahead of their use: ``read(0)``, ``read(1)``, … on a thread of their own.

``ReadAhead`` keeps at most ``depth`` reads in flight or done but not yet taken (a bound on the
memory they hold); ``take`` returns them in order and counts how long it blocked (``waited_s``).
``predict --score`` reads the truth and climatology of a batch's leads this way
(``scoring.TileScorer``), so the scoring thread finds each lead's fields already read.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["ReadAhead"]


class ReadAhead:
    """``read(k)`` for ``k`` = 0 … ``count`` − 1 on ``pool``, at most ``depth`` ahead of ``take``."""

    def __init__(self, pool: ThreadPoolExecutor, read: Callable[[int], Any], count: int, depth: int):
        self._pool, self._read, self._count, self._depth = pool, read, count, max(1, depth)
        self._queued: deque[Future] = deque()
        self._next = self._taken = 0
        self.waited_s = 0.0
        self._fill()

    def _fill(self) -> None:
        while self._next < self._count and len(self._queued) < self._depth:
            self._queued.append(self._pool.submit(self._read, self._next))
            self._next += 1

    def take(self, k: int) -> Any:
        """``read(k)``'s result; ``k`` is the next one not taken (reads are used in order)."""
        if k != self._taken or not self._queued:
            raise RuntimeError(f"read {k} taken out of order (next: {self._taken} of {self._count})")
        t0 = time.perf_counter()
        value = self._queued.popleft().result()
        self.waited_s += time.perf_counter() - t0
        self._taken += 1
        self._fill()
        return value

    def cancel(self) -> None:
        """Drop the reads not yet started (those running finish on their own)."""
        for job in self._queued:
            job.cancel()
        self._queued.clear()
