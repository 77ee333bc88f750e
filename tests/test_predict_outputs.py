"""predict's way out: chunks that a batch's writes fill whole, host slots and the writer pool, the
truth read ahead, a failed write stopping the records, and the account of the loop's time.

Everything here runs in-process on the CPU with a real ``ForecastWriter`` (no model): known fields go
through ``ForecastOutput`` batch by batch, lead by lead, and the store must hold exactly them, written
without reading a chunk back (every write covers whole chunks, so concurrent writers never share one).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
from zarr.storage import LocalStore

from jigsaw_earth.distributed.tiles import TileGrid
from jigsaw_earth.inference.forecast_store import ForecastLayout, ForecastWriter, StoreChunks, store_chunks
from jigsaw_earth.inference.progress import Progress
from jigsaw_earth.inference.readahead import ReadAhead
from jigsaw_earth.inference.timing import LoopTimes
from jigsaw_earth.inference.write_pool import SLOTS, ForecastOutput, WriterPool

N_LAT, N_LON, LEVELS = 6, 8, (500, 850)


def _layout(inits: int, leads: int, members: int | None = None, first: int = 0) -> ForecastLayout:
    return ForecastLayout(
        init_times=np.datetime64("2020-01-01T00") + np.arange(inits) * np.timedelta64(12, "h"),
        leads=np.arange(1, leads + 1) * np.timedelta64(6, "h"),
        upper_air=("geopotential", "temperature"),
        levels=LEVELS,
        surface=("2m_temperature",),
        latitude=np.linspace(80, -80, N_LAT),
        longitude=np.arange(N_LON) * 45.0,
        members=members,
        first_member=first,
    )


def _field(init: int, lead: int, member: int, channels: int) -> np.ndarray:
    """A field that names its init, lead, member and channel: (channels, N_LAT, N_LON)."""
    base = 1000 * init + 100 * lead + 10 * member + np.arange(channels)[:, None, None]
    return (base + np.zeros((channels, N_LAT, N_LON))).astype(np.float32)


def test_store_chunks_cover_a_batch_of_inits_and_fill_the_rest_with_leads() -> None:
    grid = TileGrid(32, 64, 2, 2)  # 16x32 tiles, 2 levels: 4 kB per init and lead
    demo = _layout(182, 4)
    assert store_chunks(demo, grid, batch=182, replicas=1) == StoreChunks(182, 4, 1)
    assert store_chunks(demo, grid, batch=182, replicas=1, target=4096 * 182 * 2) == StoreChunks(182, 2, 1)
    assert store_chunks(demo, grid, batch=60, replicas=2).inits == 1, "replicas take every R-th init"
    assert store_chunks(demo, grid, batch=64, replicas=1, target=4096 * 48).inits == 32, (
        "a divisor of the batch"
    )
    one = _layout(1, 40)
    assert store_chunks(one, TileGrid(128, 256, 2, 1), batch=1, replicas=1) == StoreChunks(1, 40, 1)
    big = TileGrid(721, 1440, 1, 1)  # 0.25°, one tile: a field alone is over the target
    assert store_chunks(_layout(1, 40), big, batch=1, replicas=1) == StoreChunks(1, 1, 1)
    ens = _layout(4, 4, members=6)
    assert store_chunks(ens, grid, batch=4, replicas=1, members_per_rank=3).members == 3


@pytest.mark.parametrize("members", [None, (4, 2)], ids=["deterministic", "ensemble"])
def test_batches_go_out_through_the_slots_into_whole_chunks(tmp_path: Path, monkeypatch, members) -> None:
    """7 inits in batches of 2 (the last of 1), 5 leads in chunks of 2: more slot fills than slots,
    so every slot is reused while its writes may still run; the store equals the fields, and no
    write read a chunk back."""
    total, mine = (None, range(0, 1)) if members is None else (members[0], range(2, 2 + members[1]))
    lay = _layout(7, 5, total)
    grid = TileGrid(N_LAT, N_LON, 1, 1)
    chunks = StoreChunks(inits=2, leads=2, members=1 if members is None else members[1])
    writer = ForecastWriter(tmp_path / "fc.zarr", lay, grid, chunks=chunks)
    reads: list[str] = []
    get = LocalStore.get

    async def counting(self, key, *args, **kwargs):
        if "/c/" in key:  # a chunk, not metadata
            reads.append(key)
        return await get(self, key, *args, **kwargs)

    monkeypatch.setattr(LocalStore, "get", counting)
    pool = WriterPool(threads=3)
    out = ForecastOutput(
        writer, grid.tile_of(0), torch.device("cpu"), 2, None if members is None else mine, pool
    )
    channels, jobs = len(lay.channels), []
    for start in range(0, 7, 2):
        positions = np.arange(start, min(start + 2, 7))
        out.begin(positions)
        for lead in range(5):
            rows = [_field(i, lead, m, channels) for m in mine for i in positions]  # member-major
            out.put(lead, torch.from_numpy(np.stack(rows)))
        jobs += out.end_batch()
    for job in jobs:
        job.result()
    pool.close()
    writer.close()
    assert reads == [], "a write read a chunk back: blocks must cover whole chunks"
    assert len(jobs) // 3 > SLOTS, "more slot fills (one job per variable each) than slots: reused"
    ds = xr.open_zarr(tmp_path / "fc.zarr", chunks=None)
    for i in range(7):
        for lead in range(5):
            for k, m in enumerate(mine):
                want = _field(i, lead, m, channels)
                at = {"time": i, "prediction_timedelta": lead}
                if members is not None:
                    at["number"] = k + 2
                got = np.concatenate([ds["geopotential"][at].values, ds["temperature"][at].values,
                                      ds["2m_temperature"][at].values[None]])  # fmt: skip
                np.testing.assert_array_equal(got, want)
    assert pool.bytes == 7 * 5 * len(mine) * channels * N_LAT * N_LON * 4
    if members is not None:
        assert np.isnan(ds["geopotential"].isel(number=[0, 1]).values).all(), "other groups' members"


def test_a_block_that_is_not_whole_chunks_is_refused(tmp_path: Path) -> None:
    lay = _layout(4, 4)
    grid = TileGrid(N_LAT, N_LON, 1, 1)
    writer = ForecastWriter(tmp_path / "fc.zarr", lay, grid, chunks=StoreChunks(inits=2, leads=2))
    fields = np.zeros((1, 2, len(lay.channels), N_LAT, N_LON), np.float32)
    with pytest.raises(ValueError, match="not whole chunks of 2"):
        writer.write(slice(1, 2), slice(0, 2), fields, grid.tile_of(0))
    writer.write(slice(0, 2), 3, fields[0, :1].repeat(2, 0), grid.tile_of(0))  # one lead: fine at any chunk


def test_a_failed_write_stops_every_later_record() -> None:
    progress = Progress(None)
    failed: Future = Future()
    failed.set_exception(OSError(28, "No space left on device"))
    done: Future = Future()
    done.set_result(None)
    progress.record(0, None, [done])
    with pytest.raises(OSError, match="No space left"):
        progress.record(1, None, [done, failed])
    with pytest.raises(RuntimeError, match="an earlier batch failed"):
        progress.record(2, None, [done])


def test_reads_run_ahead_in_order_and_never_more_than_the_depth() -> None:
    running, most, lock = [0], [0], threading.Lock()

    def read(k: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1
        return k * k

    with ThreadPoolExecutor(4) as pool:
        ahead = ReadAhead(pool, read, 10, depth=3)
        time.sleep(0.1)  # the first three are read before anyone asks
        assert [ahead.take(k) for k in range(10)] == [k * k for k in range(10)]
        assert most[0] <= 3 and ahead.waited_s < 0.5
        with pytest.raises(RuntimeError, match="out of order"):
            ahead.take(3)


def test_the_loop_says_where_its_time_went_and_when_the_disk_is_the_limit() -> None:
    fine = LoopTimes(loop_s=2.0, forward_s=1.8, write_stall_s=0.1, written_bytes=2e8, writers_busy_s=0.5)
    assert fine.disk_limit() is None
    line = fine.line()
    assert line.startswith("forecast loop 2.00 s: forward 1.80 s, copy-out 0.00 s, write stall 0.10 s")
    assert "wrote 200.00 MB at 400.00 MB/s (writers busy 0.50 s)" in line
    slow = LoopTimes(loop_s=10.0, forward_s=2.0, write_stall_s=7.5, written_bytes=1e10, writers_busy_s=9.9)
    assert "the disk is the limit: the forecast waited 7.50 s of 10.00 s" in slow.disk_limit()
    assert "1.01 GB/s" in slow.disk_limit()
