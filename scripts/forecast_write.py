"""How fast predict's forecast store goes into a bucket, against the same store written to a local disk.

The same store (``--grid``, ``--inits`` × ``--leads`` of 2 upper-air variables on 2 levels and one
surface variable, float32, predict's chunks for ``--batch`` inits) is written by ``ForecastWriter`` as
predict writes it: blocks of whole chunks on predict's writer threads (``write_pool.WriterPool``),
then the commit (the marker and the consolidated metadata; a local store's rename). Timed from the
template to the commit, into ``URL/rep-K`` and ``--local DIR/rep-K.zarr`` in turn (interleaved,
``--repeats``, medians), each removed after. Endpoint and credentials come from the standard
variables (``AWS_ENDPOINT_URL`` …, as ``scripts/s3_clients.py``)::

    python scripts/forecast_write.py s3://bench/forecast --local runs/forecast-write --repeats 3

docs/metrics.md has the figure.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def _write(out: str | Path, layout, grid, batch: int, data: np.ndarray) -> float:
    from jigsaw_earth.inference.forecast_store import ForecastWriter, store_chunks
    from jigsaw_earth.inference.write_pool import WriterPool

    chunks = store_chunks(layout, grid, batch, 1)
    tile = grid.tile(0, 0)
    t0 = time.perf_counter()
    writer = ForecastWriter(out, layout, grid, 0, chunks=chunks)
    pool = WriterPool()
    jobs = []
    n_i, n_l = len(layout.init_times), len(layout.leads)
    for a in range(0, n_i, chunks.inits):
        for b in range(0, n_l, chunks.leads):
            i, j = slice(a, min(a + chunks.inits, n_i)), slice(b, min(b + chunks.leads, n_l))
            block = data[: i.stop - i.start, : j.stop - j.start]
            jobs.append(pool.submit(lambda i=i, j=j, x=block: writer.write(i, j, x, tile), block.nbytes))
    for job in jobs:
        job.result()
    pool.close()
    writer.close()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url", help="s3://BUCKET/PREFIX to write the stores under")
    p.add_argument("--local", required=True, help="a local folder to write the same stores in")
    p.add_argument("--grid", default="181x360")
    p.add_argument("--inits", type=int, default=8)
    p.add_argument("--leads", type=int, default=20)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", help="write the results here")
    a = p.parse_args(argv)
    import obstore
    from jigsaw_earth.data.objects import object_store

    from jigsaw_earth.distributed.tiles import TileGrid
    from jigsaw_earth.inference.campaign import store_bytes
    from jigsaw_earth.inference.forecast_store import ForecastLayout

    n_lat, n_lon = map(int, a.grid.split("x"))
    layout = ForecastLayout(
        init_times=np.datetime64("2020-01-01T00") + np.arange(a.inits) * np.timedelta64(12, "h"),
        leads=np.arange(1, a.leads + 1) * np.timedelta64(6, "h"),
        upper_air=("geopotential", "temperature"), levels=(500, 850), surface=("2m_temperature",),
        latitude=np.linspace(90, -90, n_lat), longitude=np.arange(n_lon) * 360.0 / n_lon,
    )  # fmt: skip
    grid = TileGrid(n_lat, n_lon)
    rng = np.random.default_rng(0)
    data = rng.standard_normal((a.batch, a.leads, len(layout.channels), n_lat, n_lon), dtype=np.float32)
    size = store_bytes(layout)
    local = Path(a.local)
    local.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, list[float]] = {"bucket": [], "local": []}
    for k in range(a.repeats):
        for where in ("bucket", "local"):
            out = f"{a.url.rstrip('/')}/rep-{k}" if where == "bucket" else local / f"rep-{k}.zarr"
            seconds[where].append(_write(out, layout, grid, a.batch, data))
            if where == "bucket":
                store = object_store(str(out))
                obstore.delete(store, [o["path"] for o in obstore.list(store).collect()])
            else:
                shutil.rmtree(out)
    result = {
        "store_mb": size / 1e6,
        **{f"{w}_mb_s": size / 1e6 / statistics.median(s) for w, s in seconds.items()},
        "seconds": seconds,
    }
    result["bucket_over_local"] = result["bucket_mb_s"] / result["local_mb_s"]
    print(json.dumps(result, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
