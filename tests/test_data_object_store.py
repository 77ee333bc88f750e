"""Training data in an S3 bucket: a real SeaweedFS started once for this module (``object_store.py``).

Tiles are read with range requests (the same bytes as from the local copy, bit for bit, shard
indexes fetched once), slow requests are hedged through a delaying proxy, ``data prepare`` turns an
ARCO-like store (one time, all levels, the whole globe per chunk) in the bucket into the tile layout
in the bucket, equal to the local prepare and resumed after an interruption, and an unfinished store
is refused naming it. Skipped, with the reason, where ``weed`` is not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from jigsaw_earth.data.batch import VariableSpec
from jigsaw_earth.data.objects import Latencies, object_store
from jigsaw_earth.data.prepare import prepare_store
from jigsaw_earth.data.prepare_write import PROGRESS_KEY
from jigsaw_earth.data.reader import TileReader
from jigsaw_earth.data.report import planned_fraction
from jigsaw_earth.data.store import StoreView
from jigsaw_earth.data.writer import ChunkLayout

from jigsaw_earth.cli import main
from jigsaw_earth.distributed.halo import Halo
from jigsaw_earth.distributed.mesh import MeshShape
from jigsaw_earth.ownership import check_output, check_run_dir
from tests.data_helpers import dataset, truth, write
from tests.object_store import WHY_MISSING, S3Server, upload, weed_binary

pytestmark = pytest.mark.skipif(weed_binary() is None, reason=WHY_MISSING)
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """The server, its variables set in this process for the module's tests."""
    server = S3Server.start(tmp_path_factory.mktemp("seaweedfs"))
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    yield server
    server.stop()
    for k, v in saved.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope="module")
def tiles(s3, tmp_path_factory):
    """A tile-sharded store (synth, 16x32, written for 2x2), local and in the bucket."""
    local = tmp_path_factory.mktemp("tiles") / "tiles.zarr"
    argv = ["data", "synth", "--out", str(local), "--grid", "16x32", "--start", "2020-01-01T00"]
    assert main([*argv, "--end", "2020-01-03T18", "--for-mesh", "2x2", "--no-climatology"]) == 0
    return local, upload(local, "s3://train/tiles.zarr")


def _spec(view: StoreView) -> VariableSpec:
    upper, surface, _ = view.known_variables()
    return VariableSpec(tuple(upper), (500, 850), tuple(surface), static=())


@pytest.mark.parametrize("mesh,halo", [("2x2", 0), ("1x3", 1)])
def test_bucket_tiles_are_the_local_tiles_from_their_chunks_only(tiles, mesh, halo):
    """Every rank's tile equals the local read, each shard index fetched once; on the mesh the store
    was written for, a rank fetches exactly its share of the sample (the local read's bytes, the
    chunks ``planned_fraction`` counts). Whole inner chunks are fetched: another mesh or a halo
    fetches the chunks it touches, where a local read takes only their rows (``preadv``)."""
    local, url = tiles
    a, b = StoreView.open(local), StoreView.open(url)
    spec = _spec(a)
    m = MeshShape(1, *map(int, mesh.split("x")))
    whole = 4 * spec.n_channels * 2 * 16 * 32  # a sample: inputs and one target, float32, uncompressed
    for k in range(m.lat * m.lon):
        ra = TileReader.for_rank(a, spec, m.lat, m.lon, k, Halo.uniform(halo, lat_mode="pole"))
        rb = TileReader.for_rank(b, spec, m.lat, m.lon, k, Halo.uniform(halo, lat_mode="pole"))
        assert rb.source.remote is not None and ra.source.remote is None
        counts = []
        for t in (2, 2, 5):  # again at 2: the shard indexes come from the cache
            ra.reset_counts(), rb.reset_counts()
            indexes = len(rb.source._indexes._cache)
            xa, ya = ra.read_sample(t, np.array([t + 1]))
            xb, yb = rb.read_sample(t, np.array([t + 1]))
            np.testing.assert_array_equal(xa, xb)
            np.testing.assert_array_equal(ya, yb)
            counts.append(
                (rb.requests, len(rb.source._indexes._cache) - indexes, rb.bytes_read, ra.bytes_read)
            )
        assert counts[1][:2] == (counts[0][0] - counts[0][1], 0), counts  # no index fetched twice
        if halo == 0:  # the store's own mesh: the tile's share, as the local read, as planned
            assert counts[1][2] == counts[1][3] == whole // (m.lat * m.lon), counts
            assert counts[1][2] == pytest.approx(planned_fraction(rb, 1) * whole, rel=1e-9), counts


def test_latencies_hedge_at_the_percentile_of_their_size_class():
    lat = Latencies(95.0)
    assert lat.threshold(1 << 20) is None  # too few seen
    for i in range(100):
        lat.add(1 << 20, 0.010 + 0.0001 * i)
        lat.add(100, 0.001)
    assert 0.0190 < lat.threshold(1 << 20) < 0.0200
    assert lat.threshold(120) == pytest.approx(0.005)  # small requests: the floor, not 1 ms
    assert lat.threshold(64 << 20) is None  # another size class


def _proxy(endpoint: str, fraction: float, delay_ms: int) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "delay_proxy.py"), "--target", endpoint.removeprefix("http://"),
         "--delay-fraction", str(fraction), "--delay-ms", str(delay_ms), "--seed", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    port = proc.stdout.readline().strip()
    assert port.isdigit(), proc.stderr.read()
    return proc, f"http://127.0.0.1:{port}"


def test_slow_requests_are_hedged_through_a_delaying_proxy(s3, tiles, monkeypatch):
    """A fifth of the responses held 400 ms: with hedging, requests are sent again and the tiles are
    exact; without, none is."""
    local, url = tiles
    proxy, endpoint = _proxy(s3.endpoint, 0.2, 400)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)  # the bucket's store through the proxy
        a = StoreView.open(local)
        spec = _spec(a)
        ra = TileReader.for_rank(a, spec, 2, 2, 0, Halo())
        counts = {}
        for hedge in (True, False):
            rb = TileReader.for_rank(StoreView.open(url), spec, 2, 2, 0, Halo(), threads=4)
            rb.source.remote.hedge = hedge
            for t in range(8):
                xa, ya = ra.read_sample(t, np.array([t + 1]))
                xb, yb = rb.read_sample(t, np.array([t + 1]))
                np.testing.assert_array_equal(xa, xb)
                np.testing.assert_array_equal(ya, yb)
            counts[hedge] = rb.source.remote.hedged
        assert counts[True] > 0 and counts[False] == 0, counts
    finally:
        proxy.terminate()
        proxy.wait(10)


@pytest.fixture(scope="module")
def arco(s3, tmp_path_factory):
    """An ARCO-ERA5-like store (one time, all levels, the whole globe per chunk), local and in the bucket."""
    local = tmp_path_factory.mktemp("arco") / "arco.zarr"
    write(dataset(truth(n_lat=16, n_lon=32, n_time=12)), local, zarr_format=2)  # ARCO-ERA5 is Zarr v2
    return local, upload(local, "s3://era5/arco.zarr")


def _arrays(path: str | Path) -> dict[str, np.ndarray]:
    group = zarr.open_group(StoreView.open(path).store, mode="r")
    out = {name: np.asarray(a[...]) for name, a in group.arrays()}
    out.update({f"statistics/{n}": np.asarray(a[...]) for n, a in group["statistics"].arrays()})
    return out


def test_prepare_from_a_bucket_into_a_bucket_equals_the_local_prepare(arco, tmp_path, caplog):
    """One pass, one time per block (the memory bound): an interruption (a damaged source chunk)
    leaves a store refused on open, and the same command resumes where it stopped."""
    local_src, url_src = arco
    layout = ChunkLayout.for_mesh(16, 32, MeshShape(1, 2, 2))
    prepare_store(local_src, tmp_path / "local.zarr", layout=layout, progress=False)
    src_store = object_store(url_src)
    import obstore

    key = "temperature/6.0.0.0"
    good = bytes(obstore.get(src_store, key).bytes())
    obstore.put(src_store, key, b"not a chunk" * 10)
    out = "s3://era5/tiles.zarr"
    with pytest.raises(ValueError, match=r"at 2020-01-02T12.*6 of 12 times are written; run the same"):
        prepare_store(url_src, out, layout=layout, progress=False, memory_mb=0.001)
    with pytest.raises(ValueError, match=rf"store '{out}' is an incomplete write"):
        StoreView.open(out)
    recorded = json.loads(bytes(obstore.get(object_store(out), PROGRESS_KEY).bytes()))
    assert recorded["done"] == 6
    obstore.put(src_store, key, good)
    with caplog.at_level("INFO"):
        prepare_store(url_src, out, layout=layout, progress=False, memory_mb=0.001)
    assert "resuming at time 6 of 12" in caplog.text
    mine, theirs = _arrays(out), _arrays(tmp_path / "local.zarr")
    assert mine.keys() == theirs.keys()
    for name, x in theirs.items():
        np.testing.assert_array_equal(mine[name], x, err_msg=name)
    assert StoreView.open(out).store is not None  # complete: opens
    with pytest.raises(ValueError, match="already holds a complete store; pass --overwrite"):
        prepare_store(url_src, out, layout=layout, progress=False)


def test_io_report_and_bench_io_for_a_bucket_count_what_the_local_store_counts(tiles, tmp_path, capsys):
    local, url = tiles
    reports = {}
    for where, path in (("local", str(local)), ("bucket", url)):
        out = tmp_path / f"{where}.json"
        assert main(["data", "io-report", path, "--mesh", "2x2", "--json", str(out)]) == 0
        (reports[where],) = json.loads(out.read_text())  # one record per mesh
    for mine, theirs in zip(reports["bucket"]["ranks"], reports["local"]["ranks"]):
        assert mine["bytes_read"] == theirs["bytes_read"] > 0, (mine, theirs)
    argv = ["bench", "io", url, "--mesh", "2x2", "--repeats", "1", "--cache", "warm", "--json"]
    assert main([*argv, str(tmp_path / "bench.json")]) == 0
    (result,) = json.loads((tmp_path / "bench.json").read_text())
    (rank,) = result["results"]
    assert {"reader", "raw1", "raw64"} <= rank["methods"].keys()
    assert rank["bytes"] == 4 * 14 * 2 * 16 * 32 // 4  # its share of a sample (indexes cached)
    assert min(m["x_raw"] for n, m in rank["methods"].items() if n.startswith("raw")) == 1.0


def test_prepare_refuses_nans_of_a_bucket_source_as_it_reads_and_keeps_nothing(s3, tmp_path):
    t = truth(n_lat=8, n_lon=16, n_time=6)
    t["fields"]["temperature"][4, 0, 2, 3] = np.nan
    local = tmp_path / "nan.zarr"
    write(dataset(t), local, zarr_format=2)
    url = upload(local, "s3://era5/nan.zarr")
    with pytest.raises(
        ValueError, match=r"temperature: 1 NaNs in the times from 2020-01-02T00.*Nothing was kept"
    ):
        prepare_store(url, "s3://era5/nan-tiles.zarr", progress=False, memory_mb=0.001)
    import obstore

    assert not list(obstore.list(object_store("s3://era5/nan-tiles.zarr")).collect())


@pytest.mark.parametrize(
    "check",
    [
        lambda: check_output("s3://clim/clim.zarr", "climatology", overwrite=False),  # renamed stores
        lambda: check_run_dir("s3://runs/demo"),  # run.dir: its checkpoints
    ],
)
def test_renamed_outputs_and_checkpoints_refuse_a_bucket_naming_what_buckets_serve(check):
    """What is written under a temporary name and renamed stays local (a bucket forecast is
    ``predict``'s: ``test_predict_bucket.py``)."""
    with pytest.raises(
        ValueError, match=r"must be (a )?local.*object stores.*data prepare --out.*predict --out"
    ):
        check()
