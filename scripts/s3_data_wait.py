"""How long a training step waits for its batch from a bucket: p50 and p99, with and without hedging.

One rank's tile reader (``--mesh``, ``--rank``) reads batches of ``--batch`` random samples as training
does (``data.prefetch`` batches read ahead on background threads while a step "computes": a sleep of
``--step-ms``, the demo's step on this machine from local disk); the wait is the time the step blocks
for its batch. Each ``--endpoint`` (e.g. the plain and the straggling proxies of ``scripts/s3_link.py``)
is measured with hedging on and off, interleaved over ``--repeats`` runs of ``--steps`` steps::

    . link.env && python scripts/s3_data_wait.py s3://bench/demo.zarr \\
        --endpoint plain=$AWS_ENDPOINT_URL --endpoint delayed=$DELAYED_ENDPOINT_URL
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def _run(url: str, endpoint: str, hedge: bool, a: argparse.Namespace) -> list[float]:
    from jigsaw_earth.data.batch import VariableSpec
    from jigsaw_earth.data.reader import TileReader
    from jigsaw_earth.data.store import StoreView

    from jigsaw_earth.distributed.halo import Halo

    os.environ["AWS_ENDPOINT_URL"] = endpoint
    view = StoreView.open(url)
    upper, surface, _ = view.known_variables()
    spec = VariableSpec(tuple(upper), tuple(int(x) for x in view.levels), tuple(surface), static=())
    lat, lon = (int(x) for x in a.mesh.split("x"))
    reader = TileReader.for_rank(view, spec, lat, lon, a.rank, Halo(), threads="auto")
    reader.source.remote.hedge = hedge
    rng = np.random.default_rng(a.seed)
    n = len(view.times) - 1
    inits = [rng.integers(0, n, a.batch) for _ in range(a.steps + a.prefetch)]
    read = lambda s: reader.read_batch(inits[s], inits[s][:, None] + 1)  # noqa: E731
    reader.read_batch(inits[0], inits[0][:, None] + 1)  # metadata, connections, shard indexes warm
    pool = ThreadPoolExecutor(max(1, a.prefetch))
    queued = {s: pool.submit(read, s) for s in range(a.prefetch)}
    waits = []
    for s in range(a.steps):
        t0 = time.perf_counter()
        queued.pop(s).result() if a.prefetch else read(s)  # prefetch 0: read in the step
        waits.append(time.perf_counter() - t0)
        if a.prefetch:
            queued[s + a.prefetch] = pool.submit(read, s + a.prefetch)
        time.sleep(a.step_ms / 1e3)
    for f in queued.values():
        f.result()
    pool.shutdown()
    return waits


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url", help="the training store in the bucket")
    p.add_argument("--endpoint", action="append", required=True, metavar="NAME=URL")
    p.add_argument("--mesh", default="2x2")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--batch", type=int, default=8, help="samples per step (the demo's global batch)")
    p.add_argument("--prefetch", type=int, default=2, help="data.prefetch (0: the step reads its batch)")
    p.add_argument("--step-ms", type=float, default=390.0, help="the step's compute, slept")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write every wait here")
    a = p.parse_args(argv)
    endpoints = dict(e.split("=", 1) for e in a.endpoint)
    waits: dict[str, list[float]] = {}
    for rep in range(a.repeats):
        for name, url in endpoints.items():
            for hedge in (True, False) if rep % 2 == 0 else (False, True):
                key = f"{name} {'hedged' if hedge else 'not hedged'}"
                waits.setdefault(key, []).extend(_run(a.url, url, hedge, a))
    print(f"data wait per step, {a.url}, mesh {a.mesh} rank {a.rank}, batch {a.batch}, prefetch "
          f"{a.prefetch}, step {a.step_ms:g} ms, {a.repeats} x {a.steps} steps")  # fmt: skip
    print(f"  {'endpoint':<24} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for key, w in waits.items():
        ms = 1e3 * np.asarray(w)
        print(f"  {key:<24} {np.percentile(ms, 50):>8.1f} {np.percentile(ms, 99):>8.1f} {ms.max():>8.1f}")
    if a.json:
        with open(a.json, "w") as f:
            settings = {k: v for k, v in vars(a).items() if k not in ("json", "endpoint")}
            json.dump({"settings": {**settings, "endpoints": list(endpoints)}, "waits_s": waits}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
