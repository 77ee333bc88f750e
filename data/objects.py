"""Object storage (S3, GCS): a bucket URL opened for zarr, and byte ranges read at the link's speed.

The client is obstore (Rust's ``object_store``): fetching the same byte ranges from a SeaweedFS bucket
on this machine it moved 1.3-2.2x the bytes per second of s3fs at every concurrency and took a third of
its CPU time (``scripts/s3_clients.py``, docs/data.md "Object storage"); zarr's ``ObjectStore`` is the
same client behind zarr's store API, so the metadata, xarray and the writers go through it too.
Endpoint and credentials come from the client's standard variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``AWS_ALLOW_HTTP`` for a plain-HTTP
endpoint; for GCS ``GOOGLE_APPLICATION_CREDENTIALS`` or ``GOOGLE_SERVICE_ACCOUNT``, else anonymous
reads of public buckets).

``RangeReader`` is what the tile reader fetches with: one call gets any number of byte ranges of one
object (ranges longer than ``PART_BYTES`` split into parts fetched at once), on zarr's event loop, so
every reading thread's requests are in flight together. A request still running after the
``HEDGE_PERCENTILE``-th percentile of the recent ones of its size (``Latencies``) is **hedged**: the
same request is sent again and the first answer wins (the other is cancelled), so one slow server or
connection does not stall a step that waits for every rank.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from jigsaw_earth.data.zarr_api import sync

__all__ = [
    "HEDGE_PERCENTILE",
    "OBJECT_SCHEMES",
    "PART_BYTES",
    "REQUESTS_IN_FLIGHT",
    "Latencies",
    "RangeReader",
    "is_object_url",
    "object_store",
    "zarr_object_store",
]

log = logging.getLogger(__name__)

OBJECT_SCHEMES = ("s3", "gs")
#: requests a rank keeps in flight (``data.read_threads: auto`` for a bucket): the best of 1, 4, 16 and
#: 64 for the plain client on the shaped link of docs/data.md (``bench io s3://…``, its ``raw`` rows)
REQUESTS_IN_FLIGHT = 16
#: a range longer than this is fetched as parts at once (one connection rarely fills a link)
PART_BYTES = 8 << 20
#: a request slower than this percentile of the recent ones of its size class is sent again
HEDGE_PERCENTILE = 95.0
HEDGE_MIN_SECONDS = 0.005  # never sooner: a local server's jitter is not a straggler
WINDOW = 256  # recent latencies kept per size class
MIN_SAMPLES = 16  # no hedging before this many of a class were seen
#: any of these set: GCS with credentials; none: anonymous (public buckets)
GOOGLE_CREDENTIALS = (
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_SERVICE_ACCOUNT",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
)


def is_object_url(text: str) -> bool:
    """Whether ``text`` is a bucket URL this module opens (``s3://``, ``gs://``)."""
    return text.split("://", 1)[0].lower() in OBJECT_SCHEMES if "://" in text else False


_stores: dict[str, Any] = {}
_stores_lock = threading.Lock()


def object_store(url: str) -> Any:
    """The obstore store of ``url`` (bucket and prefix), one per URL and endpoint in this process."""
    url = url.rstrip("/")
    key = f"{url} {os.environ.get('AWS_ENDPOINT_URL', '')}"
    with _stores_lock:
        if key not in _stores:
            try:
                from obstore.store import from_url
            except ImportError:
                raise ValueError(
                    f"cannot open {url!r}: object storage needs obstore; pip install 'jigsaw-earth[cloud]'"
                ) from None
            kwargs: dict[str, Any] = {}
            if url.startswith("gs://") and not any(os.environ.get(k) for k in GOOGLE_CREDENTIALS):
                kwargs["skip_signature"] = True  # public buckets (WB2, ARCO-ERA5) read anonymously
            _stores[key] = from_url(url, **kwargs)
        return _stores[key]


def zarr_object_store(url: str, read_only: bool = True) -> Any:
    """A zarr store over ``object_store(url)``."""
    import zarr.storage

    return zarr.storage.ObjectStore(object_store(url), read_only=read_only)


try:
    from obstore.exceptions import NotFoundError

    _ABSENT: tuple[type[Exception], ...] = (FileNotFoundError, NotFoundError)
except ImportError:  # no obstore: ``object_store`` says what to install
    _ABSENT = (FileNotFoundError,)


class Latencies:
    """Recent request latencies by size class (a factor of 4 in bytes), thread-safe."""

    def __init__(self, percentile: float = HEDGE_PERCENTILE):
        self.percentile = percentile
        self._by_class: dict[int, deque[float]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _class(size: int) -> int:
        return max(int(size), 1).bit_length() // 2

    def add(self, size: int, seconds: float) -> None:
        with self._lock:
            self._by_class.setdefault(self._class(size), deque(maxlen=WINDOW)).append(seconds)

    def threshold(self, size: int) -> float | None:
        """Seconds after which a request of ``size`` bytes is hedged (None: too few seen yet)."""
        with self._lock:
            seen = self._by_class.get(self._class(size))
            if seen is None or len(seen) < MIN_SAMPLES:
                return None
            values = np.fromiter(seen, float, len(seen))
        return max(HEDGE_MIN_SECONDS, float(np.percentile(values, self.percentile)))


class RangeReader:
    """Byte ranges of the objects under one bucket URL, hedged (module docstring). Counters:
    ``requests`` sent (hedges included), ``hedged`` requests sent again."""

    def __init__(self, url: str, hedge: bool = True):
        self.url, self.hedge = url.rstrip("/"), hedge
        self.store = object_store(self.url)
        self.latencies = Latencies()
        self.requests = self.hedged = 0
        self._lock = threading.Lock()

    # ---- one request, timed and hedged ------------------------------------------------------------
    async def _timed(self, size: int, make: Callable[[], Awaitable[Any]]) -> Any:
        with self._lock:
            self.requests += 1
        t0 = time.perf_counter()
        out = await make()  # obstore's ``Bytes``: a buffer, not copied
        self.latencies.add(size, time.perf_counter() - t0)
        return out

    async def _request(self, size: int, make: Callable[[], Awaitable[Any]]) -> Any:
        first = asyncio.ensure_future(self._timed(size, make))
        wait = self.latencies.threshold(size) if self.hedge else None
        if wait is None:
            return await first
        done, _ = await asyncio.wait({first}, timeout=wait)
        if done:
            return first.result()
        with self._lock:
            self.hedged += 1
        second = asyncio.ensure_future(self._timed(size, make))
        pending = {first, second}
        while True:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            ok = [d for d in done if d.exception() is None]
            if ok or not pending:
                for p in pending:
                    p.cancel()
                return (ok or list(done))[0].result()

    # ---- what the chunk source asks for ------------------------------------------------------------
    async def _ranges(self, key: str, ranges: list[tuple[int, int]]) -> list[Any]:
        import obstore

        parts: list[tuple[int, int, int]] = []  # (range index, start, stop)
        for i, (a, b) in enumerate(ranges):
            parts += [(i, s, min(b, s + PART_BYTES)) for s in range(a, b, PART_BYTES)] or [(i, a, b)]

        def make(a: int, b: int) -> Callable[[], Awaitable[Any]]:
            return lambda: obstore.get_range_async(self.store, key, start=a, end=b)

        got = await asyncio.gather(*(self._request(b - a, make(a, b)) for _, a, b in parts))
        out: list[list[Any]] = [[] for _ in ranges]
        for (i, _, _), data in zip(parts, got):
            out[i].append(data)
        return [p[0] if len(p) == 1 else b"".join(p) for p in out]

    async def _whole(self, key: str, suffix: int | None) -> Any:
        import obstore

        async def make() -> Any:
            options = {"range": {"suffix": suffix}} if suffix is not None else None
            resp = await obstore.get_async(self.store, key, options=options)
            return await resp.bytes_async()

        return await self._request(suffix or PART_BYTES, make)

    def get(self, key: str, ranges: list[tuple[int, int]] | None) -> list[Any] | None:
        """Ranges ``[a, b)`` of object ``key`` (None: the whole object, one entry), as buffers; None if
        the object is absent."""
        try:
            if ranges is None:
                return [sync(self._whole(key, None))]
            return sync(self._ranges(key, ranges)) if ranges else []
        except _ABSENT:
            return None

    def suffix(self, key: str, n: int) -> Any:
        """The last ``n`` bytes of object ``key`` (a shard's index); None if absent."""
        try:
            return sync(self._whole(key, n))
        except _ABSENT:
            return None
