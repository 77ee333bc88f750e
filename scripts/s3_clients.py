"""Which client fetches byte ranges from an S3 bucket fastest, and for the least CPU?

The same ranges (``--ranges`` of ``--range-mb`` each, spread over ``--objects`` objects that this
script uploads first) are fetched by obstore, s3fs, and zarr's two stores over them
(``zarr.storage.ObjectStore``, ``zarr.storage.FsspecStore``), each at each concurrency of
``--concurrency``, interleaved over ``--repeats`` (medians). Endpoint and credentials come from the
standard variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``;
obstore also needs ``AWS_ALLOW_HTTP=true`` for a plain-HTTP endpoint)::

    python scripts/s3_clients.py s3://bench/clients --objects 8 --ranges 64 --range-mb 1

docs/data.md ("Object storage") has the figures and the choice they made.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

import numpy as np


def _obstore_fetch(url: str) -> Any:
    import obstore
    from obstore.store import from_url

    store = from_url(url)

    async def fetch(key: str, a: int, b: int) -> bytes:
        return bytes(await obstore.get_range_async(store, key, start=a, end=b))

    return store, fetch


def _s3fs_fetch(url: str) -> Any:
    import s3fs

    fs = s3fs.S3FileSystem(asynchronous=True)
    root = url.removeprefix("s3://").rstrip("/")

    async def fetch(key: str, a: int, b: int) -> bytes:
        if fs._s3 is None:
            await fs.set_session()
        return await fs._cat_file(f"{root}/{key}", start=a, end=b)

    return fs, fetch


def _zarr_fetch(url: str, kind: str) -> Any:
    import zarr.storage
    from zarr.abc.store import RangeByteRequest
    from zarr.buffer import default_buffer_prototype

    if kind == "zarr-obstore":
        from obstore.store import from_url

        store = zarr.storage.ObjectStore(from_url(url), read_only=True)
    else:
        store = zarr.storage.FsspecStore.from_url(url, read_only=True)
    proto = default_buffer_prototype()

    async def fetch(key: str, a: int, b: int) -> bytes:
        return (await store.get(key, proto, RangeByteRequest(a, b))).to_bytes()

    return store, fetch


CLIENTS = {
    "obstore": _obstore_fetch,
    "s3fs": _s3fs_fetch,
    "zarr-obstore": lambda url: _zarr_fetch(url, "zarr-obstore"),
    "zarr-fsspec": lambda url: _zarr_fetch(url, "zarr-fsspec"),
}


async def _run(fetch: Any, ranges: list[tuple[str, int, int]], concurrency: int) -> int:
    gate = asyncio.Semaphore(concurrency)

    async def one(key: str, a: int, b: int) -> int:
        async with gate:
            return len(await fetch(key, a, b))

    return sum(await asyncio.gather(*(one(*r) for r in ranges)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url", help="s3://BUCKET/PREFIX to upload the test objects to")
    p.add_argument("--objects", type=int, default=8)
    p.add_argument("--ranges", type=int, default=64)
    p.add_argument("--range-mb", type=float, default=1.0)
    p.add_argument("--concurrency", default="1,4,16,64")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--clients", default=",".join(CLIENTS))
    p.add_argument("--json", help="write the results here")
    a = p.parse_args(argv)
    import obstore
    from obstore.store import from_url

    size = int(a.range_mb * 2**20)
    per_object = -(-a.ranges // a.objects)
    up = from_url(a.url)
    rng = np.random.default_rng(0)
    for k in range(a.objects):
        obstore.put(up, f"o{k}", rng.integers(0, 255, per_object * size, dtype=np.uint8).tobytes())
    ranges = [(f"o{i % a.objects}", (i // a.objects) * size, (i // a.objects + 1) * size)
              for i in range(a.ranges)]  # fmt: skip
    total = size * a.ranges
    levels = [int(c) for c in a.concurrency.split(",")]
    names = a.clients.split(",")
    loop = asyncio.new_event_loop()
    fetchers = {n: CLIENTS[n](a.url)[1] for n in names}
    for n in names:  # warm-up: sessions, connections
        loop.run_until_complete(_run(fetchers[n], ranges[:4], 4))
    times: dict[tuple[str, int], list[tuple[float, float]]] = {(n, c): [] for n in names for c in levels}
    for rep in range(a.repeats):
        order = [(n, c) for c in levels for n in names]
        order = order[rep % len(order) :] + order[: rep % len(order)]
        for n, c in order:
            w0, c0 = time.perf_counter(), time.process_time()
            got = loop.run_until_complete(_run(fetchers[n], ranges, c))
            times[(n, c)].append((time.perf_counter() - w0, time.process_time() - c0))
            assert got == total, (n, c, got, total)
    rows = []
    print(f"{a.ranges} ranges of {a.range_mb} MB from {a.objects} objects, median of {a.repeats}")
    print(f"  {'client':<14} {'in flight':>9} {'ms':>8} {'MB/s':>8} {'cpu ms':>8}")
    for c in levels:
        for n in names:
            wall = statistics.median(t for t, _ in times[(n, c)])
            cpu = statistics.median(t for _, t in times[(n, c)])
            rows.append({"client": n, "concurrency": c, "ms": 1e3 * wall, "cpu_ms": 1e3 * cpu,
                         "mb_per_s": total / wall / 1e6})  # fmt: skip
            print(f"  {n:<14} {c:>9} {1e3 * wall:>8.1f} {total / wall / 1e6:>8.1f} {1e3 * cpu:>8.1f}")
    if a.json:
        with open(a.json, "w") as f:
            meta = {"ranges": a.ranges, "range_mb": a.range_mb, "objects": a.objects}
            json.dump({**meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
