"""``bench io``: reading one training sample per rank through the tile reader, against its limits.

For each rank of a ``lat × lon`` mesh, one sample (inputs with halo at ``t``, targets at the next
``lead_steps`` times, tile only) is read, interleaved over repeats, by:

- ``reader``: the project's ``TileReader`` as training reads (into preallocated output as
  training's ring of batch buffers, no NaN pass: training names NaNs from a non-finite loss);
- ``checked``: the same with the reader's NaN pass, as validation and predict read;
- ``raw``: the same byte ranges of the same files (the reader's own trace) read with plain
  ``os.preadv`` into one preallocated buffer, the limit of the storage; from a bucket (``s3://``,
  ``gs://``) ``raw1``, ``raw4``, ``raw16`` and ``raw64``: the same ranges fetched by the plain client
  (obstore) with that many requests in flight, and ``x raw`` is against the fastest of them (the
  limit of the link at its best concurrency);
- ``tensorstore``: Google's C++ array store reading the same lat × lon boxes (if installed);
- ``zarr``: zarr-python slicing of the same boxes.

Warm: page cache as left by the previous reads. Cold: every file the sample touches is dropped
from the page cache (``posix_fadvise(DONTNEED)``) before each read. ``ranks="all"`` runs one
process per rank, all reading at once (a barrier starts each repeat together); otherwise one
rank reads alone. Medians over repeats; CPU time (``process_time``) beside wall time.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
import os
import statistics
import time
from typing import Any

import numpy as np

from ..argtypes import parse_list
from ..data.batch import VariableSpec
from ..data.reader import TileReader
from ..data.store import StoreView
from ..data.times import sample_index
from ..data.zarr_api import sync
from ..distributed.halo import Halo

__all__ = ["METHODS", "bench_io", "format_io"]

METHODS = ("reader", "checked", "raw", "tensorstore", "zarr")
RAW_CONCURRENCY = (1, 4, 16, 64)  # requests in flight of a bucket's raw reads


def _boxes(reader: TileReader, t: int, ts: np.ndarray) -> list[tuple[str, tuple]]:
    """(store name, storage index tuple) of every box the reader reads for a sample."""
    view, out = reader.view, []
    for f in reader._fields:
        dims = view.dims(f.store_name)
        for times, plans in (([t], reader._padded_plans), (list(ts), reader._tile_plans)):
            for _, rows, cols in plans:
                for rr, cc in itertools.product(rows.runs, cols.runs):
                    pick = {
                        "time": slice(min(times), max(times) + 1),
                        "level": slice(None)
                        if f.levels is None
                        else slice(int(min(f.levels)), int(max(f.levels)) + 1),
                        "latitude": slice(rr.start, rr.stop),
                        "longitude": slice(cc.start, cc.stop),
                    }
                    out.append((f.store_name, tuple(pick[d] for d in dims)))
    return out


class _Methods:
    """The four ways of reading one rank's sample, set up once (files opened, buffers allocated)."""

    def __init__(
        self,
        path: str,
        spec: VariableSpec,
        mesh: tuple[int, int],
        rank: int,
        halo: Halo,
        lead_steps: int,
        threads: int | str,
        hedge: bool = True,
    ):
        view = StoreView.open(path)
        self.reader = TileReader.for_rank(view, spec, *mesh, rank, halo, threads=threads)
        if self.reader.source.remote is not None:
            self.reader.source.remote.hedge = hedge
        times = view.times
        inits, targets = sample_index(
            times,
            np.arange(len(times)),
            int(self._step_hours(times)),
            lead_steps,
            True,
            f"store {path!r}",
            "bench io",
        )
        if not len(inits):
            raise ValueError(
                f"store {path!r} has no time with {lead_steps} target(s) after it; "
                f"lower --lead-steps or use a store with more times"
            )
        self.samples = list(zip(inits.tolist(), targets))
        self.boxes = _boxes(self.reader, *self.samples[0])
        src = self.reader.source
        self.reader.read_sample(*self.samples[0])  # shard indexes are cached from here on
        src.trace = []
        self.reader.read_sample(*self.samples[0])
        self.ranges, src.trace = list(src.trace), None
        local = self.reader.source.root is not None
        self.files = sorted({f for f, _, _ in self.ranges}) if local else []  # page cache: local files
        self.bytes = sum(b - a for _, a, b in self.ranges)  # as stored (compressed or not)
        t, ts = self.samples[0]
        self.out = self.reader.read_batch(np.array([t]), np.asarray(ts)[None])  # reused, as training's ring
        self.delivered = sum(a.nbytes for a in self.out)  # float32 values the reader returns
        self.buffer = np.empty(max(1, self.bytes), np.uint8)
        self.group = view.group
        self.path = path
        self._ts = self._open_tensorstore(path)

    @staticmethod
    def _step_hours(times: np.ndarray) -> float:
        if len(times) < 2:
            return 6
        return float((times[1] - times[0]) / np.timedelta64(1, "h"))

    def _open_tensorstore(self, path: str) -> dict[str, Any] | None:
        try:
            import tensorstore as ts
        except ImportError:
            return None
        if "://" in path:
            return None
        fmt = self.group.metadata.zarr_format
        driver = "zarr3" if fmt == 3 else "zarr"
        ctx = ts.Context(
            {"data_copy_concurrency": {"limit": os.cpu_count() or 1}, "cache_pool": {"total_bytes_limit": 0}}
        )
        return {
            name: ts.open(
                {"driver": driver, "kvstore": {"driver": "file", "path": os.path.join(path, name)}},
                read=True,
                context=ctx,
            ).result()
            for name in {n for n, _ in self.boxes}
        }

    def available(self) -> list[str]:
        out = ["reader", "checked"]
        if self.files and self.reader.source.root is not None:
            out.append("raw")
        if self.reader.source.remote is not None:
            out += [f"raw{c}" for c in RAW_CONCURRENCY]
        if self._ts is not None:
            out.append("tensorstore")
        return [*out, "zarr"]

    def _fetch_raw(self, in_flight: int) -> None:
        """The traced ranges from the bucket with the plain client, ``in_flight`` at a time."""
        import obstore

        store = self.reader.source.remote.store  # type: ignore[union-attr]

        async def fetch() -> None:
            gate = asyncio.Semaphore(in_flight)

            async def one(key: str, a: int, b: int) -> None:
                async with gate:
                    await obstore.get_range_async(store, key, start=a, end=b)

            await asyncio.gather(*(one(*r) for r in self.ranges))

        sync(fetch())

    def drop_cache(self) -> None:
        for f in self.files:
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)

    def run(self, method: str) -> None:
        t, ts = self.samples[0]
        if method in ("reader", "checked"):  # into preallocated output, as raw into its buffer
            self.reader.read_batch(
                np.array([t]), np.asarray(ts)[None], out=self.out, check_nan=method == "checked"
            )
        elif method == "raw":
            mv, k, fds = memoryview(self.buffer), 0, {}
            try:
                for f, a, b in self.ranges:
                    fd = fds.get(f)
                    if fd is None:
                        fd = fds[f] = os.open(f, os.O_RDONLY)
                    os.preadv(fd, [mv[k : k + b - a]], a)
                    k += b - a
            finally:
                for fd in fds.values():
                    os.close(fd)
        elif method.startswith("raw"):
            self._fetch_raw(int(method[3:]))
        elif method == "tensorstore":
            futures = [self._ts[name][sel].read() for name, sel in self.boxes]  # type: ignore[index]
            for fut in futures:
                fut.result()
        else:
            for name, sel in self.boxes:
                np.asarray(self.group[name][sel])


def _measure(methods: _Methods, repeats: int, cold: bool, barrier: Any = None) -> dict[str, dict]:
    names = methods.available()
    for m in names:  # warm-up: metadata, thread pools, page cache for warm runs
        methods.run(m)
    times: dict[str, list[tuple[float, float]]] = {m: [] for m in names}
    for rep in range(repeats):
        order = names[rep % len(names) :] + names[: rep % len(names)]  # rotate: A B C, B C A, ...
        for m in order:
            if cold:
                methods.drop_cache()
            if barrier is not None:
                barrier.wait()
            w0, c0 = time.perf_counter(), time.process_time()
            methods.run(m)
            times[m].append((time.perf_counter() - w0, time.process_time() - c0))
    out = {}
    for m, tv in times.items():
        wall = statistics.median(a for a, _ in tv)
        out[m] = {
            "ms": 1e3 * wall,
            "cpu_ms": 1e3 * statistics.median(b for _, b in tv),
            "gbps": methods.bytes / wall / 1e9,
            "delivered_gbps": methods.delivered / wall / 1e9,
            "ms_all": [1e3 * a for a, _ in tv],
        }
    return out


def _one_rank(args: tuple, barrier: Any = None, queue: Any = None) -> dict[str, Any]:
    path, spec, mesh, rank, halo, lead, threads, repeats, cold, hedge = args
    import torch

    torch.set_num_threads(1)
    if barrier is not None:  # every rank of the mesh on this host, as torchrun would say
        os.environ["LOCAL_WORLD_SIZE"] = str(mesh[0] * mesh[1])
    methods = _Methods(path, spec, mesh, rank, halo, lead, threads, hedge)
    res = {
        "rank": rank,
        "read_threads": methods.reader.threads,
        "hedged": None if methods.reader.source.remote is None else methods.reader.source.remote.hedged,
        "bytes": methods.bytes,
        "delivered": methods.delivered,
        "requests": len(methods.ranges),
        "files": len(methods.files),
        "methods": _measure(methods, repeats, cold, barrier),
    }
    if queue is not None:
        queue.put(res)
    return res


def bench_io(
    path: str,
    spec: VariableSpec,
    mesh: tuple[int, int],
    *,
    ranks: str = "0",
    halo: Halo,
    lead_steps: int = 1,
    threads: int | str = 2,
    repeats: int = 5,
    cold: bool = False,
    hedge: bool = True,
) -> dict[str, Any]:
    """Per-rank timings (see the module docstring); ``ranks``: "all", or comma-separated ranks
    each measured alone."""
    n = mesh[0] * mesh[1]
    base = (path, spec, mesh, 0, halo, lead_steps, threads, repeats, cold, hedge)
    if ranks == "all":
        ctx = mp.get_context("spawn")
        barrier, queue = ctx.Barrier(n), ctx.Queue()
        procs = [
            ctx.Process(target=_one_rank, args=((*base[:3], k, *base[4:]), barrier, queue)) for k in range(n)
        ]
        for p in procs:
            p.start()
        results = [queue.get() for _ in procs]
        for p in procs:
            p.join()
            if p.exitcode:
                raise RuntimeError(f"bench io: a rank's process exited with code {p.exitcode}")
    else:
        wanted = parse_list(ranks, "--ranks", int, example="0,3 or all")
        bad = [k for k in wanted if not 0 <= k < n]
        if bad or not wanted:
            raise ValueError(
                f"--ranks {ranks!r}: ranks {bad} are not in a {mesh[0]}x{mesh[1]} mesh "
                f"(0..{n - 1}); give 'all' or ranks in that range"
            )
        results = [_one_rank((*base[:3], k, *base[4:])) for k in wanted]
    results.sort(key=lambda r: r["rank"])
    for r in results:
        ms = r["methods"]
        raws = [m for name, m in ms.items() if name.startswith("raw")]
        best = min((m["ms"] for m in raws), default=None)  # the link's limit at its best concurrency
        for m in ms.values():
            m["x_raw"] = m["ms"] / best if best else None
            m["x_tensorstore"] = m["ms"] / ms["tensorstore"]["ms"] if "tensorstore" in ms else None
    return {
        "store": path,
        "mesh": f"{mesh[0]}x{mesh[1]}",
        "ranks": ranks,
        "cache": "cold" if cold else "warm",
        "halo": [list(halo.lat), list(halo.lon), halo.lat_mode],
        "lead_steps": lead_steps,
        "read_threads": threads,
        "repeats": repeats,
        "channels": spec.n_channels,
        "results": results,
    }


def _used_threads(r: dict[str, Any]) -> str:
    """The reader threads the ranks used (at most the host's cores per rank)."""
    used = sorted({str(x.get("read_threads", r["read_threads"])) for x in r["results"]})
    return "/".join(used)


def format_io(r: dict[str, Any]) -> str:
    """The table of one ``bench_io`` result."""
    lines = [
        f"bench io {r['store']}: mesh {r['mesh']}, ranks {r['ranks']} "
        f"({'all reading at once' if r['ranks'] == 'all' else 'each alone'}), {r['cache']} cache, "
        f"{r['channels']} channels, halo {r['halo'][0]}x{r['halo'][1]}, "
        f"{r['lead_steps']} target step(s), "
        f"reader threads {r['read_threads']} asked, {_used_threads(r)} used, median of {r['repeats']}",
        "  (MB and GB/s: bytes as stored; plan --io-json prices the float32 values delivered)",
        f"  {'rank':>4} {'method':<12} {'MB':>8} {'ms':>9} {'cpu ms':>9} {'GB/s':>7} {'x raw':>7} "
        f"{'x tensorstore':>13}",
    ]
    for res in r["results"]:
        for name, m in res["methods"].items():
            xr_ = "-" if m["x_raw"] is None else f"{m['x_raw']:.2f}"
            xt = "-" if m["x_tensorstore"] is None else f"{m['x_tensorstore']:.2f}"
            lines.append(
                f"  {res['rank']:>4} {name:<12} {res['bytes'] / 1e6:>8.1f} {m['ms']:>9.1f} "
                f"{m['cpu_ms']:>9.1f} {m['gbps']:>7.2f} {xr_:>7} {xt:>13}"
            )
    return "\n".join(lines)
