"""The tile reader's storage engine (data/chunks.py, data/placement.py) on every storage form:
sharded (zarr-python writes shard chunks in Morton order) and not, uncompressed, zstd, blosc,
gzip + crc32c, zarr v2, several times per shard, CF-packed integers, chunks never written, and
damaged shards. Each read is compared with the truth (pad_reference of the global fields)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import zarr
from jigsaw_earth.data import placement
from jigsaw_earth.data.batch import VariableSpec
from jigsaw_earth.data.placement import axis_plan
from jigsaw_earth.data.reader import Normalisation, TileReader
from jigsaw_earth.data.store import StoreView
from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, ZstdCodec

from jigsaw_earth.distributed.halo import Halo
from jigsaw_earth.distributed.tiles import TileGrid

from .data_helpers import SURFACE, UPPER, channels_global, dataset, padded_window, synth_argv, truth

T = truth(n_lat=13, n_lon=16, n_time=6)
SPEC = VariableSpec(UPPER, (250, 850), SURFACE, static=("land_sea_mask",))
CASES = [
    ((2, 2), Halo.uniform(1, "pole")),
    ((3, 2), Halo((2, 1), (1, 3), "pole")),
    ((1, 3), Halo.uniform(2, "replicate")),
    ((2, 1), Halo()),
]


def _write(
    ds, path: Path, fmt: int, chunks: dict, shards: dict | None = None, compressors=None, **extra
) -> str:
    enc = {}
    for v, da in ds.data_vars.items():
        c = tuple(min(chunks.get(d, 1 if d == "time" else n), n) for d, n in zip(da.dims, da.shape))
        enc[v] = {"chunks": c, **extra}
        if shards is not None:
            enc[v]["shards"] = tuple(
                max(ci, min(shards.get(d, ci), n) // ci * ci) for d, ci, n in zip(da.dims, c, da.shape)
            )
        if compressors is not None:
            enc[v]["compressors"] = compressors
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(path, mode="w", encoding=enc, consolidated=False, zarr_format=fmt)
    return str(path)


def _sharded(chunk: tuple[int, int], shard: tuple[int, int], times: int = 1, compressors=None, **kw) -> dict:
    """A zarr v3 layout of ``chunk`` (latitude, longitude) points in shards of ``shard`` points and
    ``times`` times, uncompressed unless ``compressors`` are given."""
    shards = {"latitude": shard[0], "longitude": shard[1], **({"time": times} if times > 1 else {})}
    chunks = {"latitude": chunk[0], "longitude": chunk[1]}
    return dict(
        fmt=3, chunks=chunks, shards=shards, compressors=[] if compressors is None else compressors, **kw
    )


LAYOUTS = {
    "sharded_raw_morton": _sharded((3, 5), (9, 15)),
    "sharded_zstd_ascending": _sharded((2, 4), (6, 16), compressors=ZstdCodec(level=1), ascending=True),
    "sharded_time_shard_3": _sharded((4, 4), (8, 8), times=3),
    "v3_gzip_crc": dict(
        fmt=3, chunks={"latitude": 5, "longitude": 6}, compressors=[GzipCodec(level=1), Crc32cCodec()]
    ),
    "v3_blosc": dict(fmt=3, chunks={"latitude": 7, "longitude": 16}, compressors=BloscCodec()),
    "v2_blosc_swapped": dict(
        fmt=2, chunks={"latitude": 4, "longitude": 3}, compressors=numcodecs.Blosc(cname="lz4"), swap=True
    ),
    "v2_zstd": dict(fmt=2, chunks={"latitude": 13, "longitude": 16}, compressors=numcodecs.Zstd(level=1)),
    # what prepare --for-mesh writes: chunks as wide as the shard, shards in row order (read with preadv)
    "sharded_raw_rows": _sharded((3, 16), (9, 16)),
    # two times per shard, one chunk per time: C order, so read (and replayed) directly
    "sharded_raw_time_shard_2": _sharded((9, 16), (9, 16), times=2),
    "sharded_raw_rows_ascending_swapped": _sharded((2, 8), (6, 8), ascending=True, swap=True),
}


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def store(request, tmp_path_factory) -> tuple[str, StoreView]:
    kw = dict(LAYOUTS[request.param])
    ds = dataset(T, ascending=kw.pop("ascending", False), swap=kw.pop("swap", False))
    path = _write(ds, tmp_path_factory.mktemp("c") / "s.zarr", **kw)
    return request.param, StoreView.open(path)


def _check_truth(name: str, view: StoreView) -> None:
    levels = sorted(SPEC.levels)
    for mesh, halo in CASES:
        grid = TileGrid(13, 16, *mesh)
        for k in range(grid.n_tiles):
            tile = grid.tile_of(k)
            reader = TileReader(view, SPEC, grid, tile, halo, threads=2)
            x, y = reader.read_batch(np.array([1, 4]), np.array([[2, 3], [5, 0]]))
            for i, (t, ts) in enumerate(((1, (2, 3)), (4, (5, 0)))):
                np.testing.assert_array_equal(
                    x[i],
                    padded_window(channels_global(T, t, levels), tile, halo),
                    err_msg=f"{name} {mesh} {halo} {k}",
                )
                for j, tt in enumerate(ts):
                    want = channels_global(T, tt, levels)[(Ellipsis, *tile.slices)]
                    np.testing.assert_array_equal(y[i, j], want)
            s, _ = reader.read_static()
            np.testing.assert_array_equal(s[0], padded_window(T["static"]["land_sea_mask"], tile, halo))


def test_reads_equal_the_truth(store):
    _check_truth(*store)


def test_direct_reads_equal_the_truth(store, monkeypatch):
    """Every run read straight into place with preadv (no minimum length): still the truth, and
    the uncompressed row-ordered shards do take that path."""
    name, view = store
    calls, real = [], os.preadv

    def preadv(fd, bufs, pos):
        calls.append(len(bufs))
        return real(fd, bufs, pos)

    monkeypatch.setattr(placement, "DIRECT_MIN_BYTES", 0)
    monkeypatch.setattr(placement.os, "preadv", preadv)
    _check_truth(name, view)
    if name.startswith(("sharded_raw_rows", "sharded_raw_time")) or name == "sharded_time_shard_3":
        assert calls, f"{name}: no direct read"


def test_normalisation_is_numpy_arithmetic(store):
    _, view = store
    grid = TileGrid(13, 16, 2, 2)
    reader = TileReader(view, SPEC, grid, grid.tile_of(1), Halo.uniform(1, "pole"))
    rng = np.random.default_rng(1)
    mean = rng.normal(size=SPEC.n_channels).astype(np.float32)
    std = rng.uniform(0.5, 2, size=SPEC.n_channels).astype(np.float32)
    x, y = reader.read_batch(np.array([2]), np.array([[3]]), Normalisation(mean, std))
    x0, y0 = reader.read_batch(np.array([2]), np.array([[3]]))
    np.testing.assert_array_equal(x, (x0 - mean[:, None, None]) / std[:, None, None])
    np.testing.assert_array_equal(y, (y0 - mean[:, None, None]) / std[:, None, None])


def test_packed_integers_and_fill_values(tmp_path):
    """CF-packed int16 (scale, offset, _FillValue) decodes as xarray does (in float32, not xarray's
    float64); a fill value is a NaN error."""
    ds = dataset(T)[["2m_temperature"]]
    path = tmp_path / "packed.zarr"
    enc = {
        "2m_temperature": {
            "dtype": "int16",
            "scale_factor": 0.01,
            "add_offset": 1.0,
            "_FillValue": -32768,
            "chunks": (1, 4, 8),
        }
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(path, mode="w", encoding=enc, consolidated=False)
    import xarray as xr

    want = xr.open_zarr(path, consolidated=False)["2m_temperature"].values
    view = StoreView.open(str(path))
    spec = VariableSpec((), (), ("2m_temperature",), static=())
    grid = TileGrid(13, 16, 2, 2)
    for k in range(4):
        tile = grid.tile_of(k)
        got = TileReader(view, spec, grid, tile, Halo()).read_inputs(3)
        np.testing.assert_allclose(got[0], want[3][tile.slices], rtol=0, atol=2e-7)
    arr = zarr.open_array(path / "2m_temperature", mode="r+")
    arr[5, 0, 0] = -32768  # the fill value: a missing value
    with pytest.raises(ValueError, match="NaN values"):
        TileReader(StoreView.open(str(path)), spec, grid, grid.tile_of(0), Halo()).read_inputs(5)


def test_chunks_never_written_and_damaged_shards(tmp_path):
    ds = dataset(T)[["2m_temperature"]]
    path = _write(
        ds, tmp_path / "s.zarr", 3, {"latitude": 4, "longitude": 4}, {"latitude": 8, "longitude": 8}
    )
    spec = VariableSpec((), (), ("2m_temperature",), static=())
    grid = TileGrid(13, 16, 2, 2)
    shard = Path(path) / "2m_temperature" / "c" / "2" / "0" / "0"
    size = shard.stat().st_size
    with open(shard, "r+b") as f:  # cut into the chunk data: the index no longer fits the file
        f.truncate(size // 2)
    with pytest.raises(ValueError, match=r"2m_temperature.*damaged"):
        TileReader(StoreView.open(path), spec, grid, grid.tile_of(0), Halo()).read_inputs(2)
    os.remove(shard)  # a shard never written reads as the fill value (NaN): a clear NaN error
    with pytest.raises(ValueError, match="NaN values in tile"):
        TileReader(StoreView.open(path), spec, grid, grid.tile_of(0), Halo()).read_inputs(2)
    np.testing.assert_array_equal(  # other times are untouched
        TileReader(StoreView.open(path), spec, grid, grid.tile_of(0), Halo()).read_inputs(1)[0],
        T["fields"]["2m_temperature"][1][grid.tile_of(0).slices],
    )


def test_axis_plan_runs_repeats_and_zeros():
    p = axis_plan(np.array([5, 4, 3, -1, 9, 10, 3]))
    assert [(r.start, r.stop, r.dst, r.step) for r in p.runs] == [(3, 6, 2, -1), (9, 11, 4, 1)]
    assert p.zeros.tolist() == [3] and p.repeats == [(6, 2)]


def test_bytes_read_are_the_tiles_chunks(tmp_path):
    """A sharded store: each rank reads its own shard's chunks (and halo chunks), never all."""
    ds = dataset(T)[["2m_temperature"]]
    path = _write(
        ds,
        tmp_path / "s.zarr",
        3,
        {"latitude": 7, "longitude": 8},
        {"latitude": 7, "longitude": 16},
        compressors=[],
    )
    spec = VariableSpec((), (), ("2m_temperature",), static=())
    grid = TileGrid(13, 16, 2, 2)
    reader = TileReader(StoreView.open(path), spec, grid, grid.tile_of(0), Halo())
    reader.reset_counts()
    reader.read_inputs(0)
    assert reader.bytes_read == 7 * 8 * 4 + 2 * 16 + 4  # one chunk + its shard's index (1x2 chunks)


def test_synth_compression_choices_read_the_same(tmp_path):
    """``--compression none|zstd|lz4`` change the bytes on disk, never the values read."""
    from jigsaw_earth.cli import main

    reads = {}
    for comp in ("none", "zstd", "lz4"):
        out = tmp_path / f"{comp}.zarr"
        assert main(synth_argv(out, "16x32", "2020-01-01T18", "--compression", comp)) == 0
        view = StoreView.open(str(out))
        codecs = str(view.array("temperature").metadata.codecs)
        assert ("Zstd" in codecs) == (comp == "zstd") and ("Blosc" in codecs) == (comp == "lz4")
        grid = TileGrid(16, 32, 2, 2)
        spec = VariableSpec(("temperature",), (500, 850), ("2m_temperature",), static=())
        reads[comp] = TileReader(view, spec, grid, grid.tile_of(3), Halo.uniform(1, "pole")).read_sample(
            1, np.array([2])
        )
    for comp in ("zstd", "lz4"):
        for a, b in zip(reads[comp], reads["none"]):
            np.testing.assert_array_equal(a, b)


def test_repeated_reads_replay_and_equal_the_truth(store, monkeypatch):
    """A reader reads field after field and time after time: the direct reads it remembers are
    repeated from other times' shards (row-ordered and time-sharded stores), and every read still
    equals the truth, into reused buffers and fresh ones alike. Every run is read directly (no
    minimum length), so uncompressed local shards of every layout are replayed, the time-sharded
    ones across shards (two or three times each)."""
    from jigsaw_earth.data import reader as reader_module

    name, view = store
    monkeypatch.setattr(placement, "DIRECT_MIN_BYTES", 0)
    monkeypatch.setattr(placement, "FEW_RUNS", 10**6)
    replays, real = [], reader_module.replay
    monkeypatch.setattr(reader_module, "replay", lambda file, calls: (replays.append(1), real(file, calls)))
    monkeypatch.setattr(reader_module._Remembered, "BUFFERS", 2)  # calls per buffer forgotten often
    levels = sorted(SPEC.levels)
    grid = TileGrid(13, 16, 3, 2)
    for k in (0, 3):
        tile = grid.tile_of(k)
        reader = TileReader(view, SPEC, grid, tile, Halo(), threads=1)
        ring = [None, None]  # training's ring of reused batch buffers, between fresh outputs
        for i, t in enumerate((0, 1, 2, 3, 4, 5, 2, 0)):
            out = ring[i % 2] if i % 3 else None
            x, y = ring[i % 2] = reader.read_batch(np.array([t]), np.array([[(t + 1) % 6]]), out=out)
            np.testing.assert_array_equal(x[0], channels_global(T, t, levels)[(Ellipsis, *tile.slices)])
            want = channels_global(T, (t + 1) % 6, levels)[(Ellipsis, *tile.slices)]
            np.testing.assert_array_equal(y[0, 0], want, err_msg=f"{name} tile {k} t={t}")
    if name.startswith("sharded_raw"):
        assert replays, f"{name}: nothing replayed"


def test_replay_notices_a_missing_shard(tmp_path):
    """A shard that is absent at a later time is not replayed from an earlier time's reads: the
    read goes the general way (fill value: NaN here, so a clear error)."""
    ds = dataset(T)
    path = _write(ds, tmp_path / "s.zarr", **LAYOUTS["sharded_raw_rows"])
    view = StoreView.open(path)
    grid = TileGrid(13, 16, 2, 1)
    reader = TileReader(view, SPEC, grid, grid.tile_of(0), Halo(), threads=1)
    reader.read_batch(np.array([1]), np.array([[2]]))
    assert reader._replays
    for shard in (Path(path) / "2m_temperature" / "c" / "4").rglob("*"):
        if shard.is_file():
            shard.unlink()
    with pytest.raises(ValueError, match=r"2m_temperature.*NaN"):
        reader.read_batch(np.array([4]), np.array([[2]]))
