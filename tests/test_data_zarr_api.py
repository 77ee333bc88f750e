"""The storage engine's view of zarr (data/zarr_api.py, data/chunks.py) under the installed zarr
release: codec settings that zarr 3.1 holds as enums and zarr 3.2+ as strings (byte order, shard
index location), numcodecs codecs inside zarr v3 arrays, and no deprecated zarr name touched."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import zarr
from jigsaw_earth.data import zarr_api
from jigsaw_earth.data.chunks import ChunkFormat, ChunkSource
from jigsaw_earth.data.store import open_store
from jigsaw_earth.data.writer import COMPRESSIONS
from zarr.codecs import BytesCodec, ShardingCodec, ZstdCodec

SHAPE, CHUNKS, SHARDS = (10, 12), (2, 3), (4, 6)
VALUES = np.arange(np.prod(SHAPE), dtype="f4").reshape(SHAPE)


COMPRESSORS = {
    "none": lambda: [],
    "zstd": lambda: [ZstdCodec(level=1)],
    "numcodecs.zstd": lambda: [zarr.codecs.numcodecs.Zstd(level=1)],
}


def _array(path, *, endian: str, index_location: str, compression: str) -> zarr.Array:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numcodecs codecs in v3 arrays warn on zarr 3.1
        a = zarr.create_array(
            store=str(path),
            shape=SHAPE,
            chunks=CHUNKS,
            shards={"shape": SHARDS, "index_location": index_location},
            dtype="f4",
            serializer=BytesCodec(endian=endian),
            compressors=COMPRESSORS[compression](),
        )
        a[:] = VALUES
        return zarr.open_array(open_store(path), mode="r")


def _read(fmt: ChunkFormat, array: zarr.Array, box: tuple[tuple[int, int], ...]) -> np.ndarray:
    """The box assembled from ``ChunkSource.blocks`` (each chunk at its grid position)."""
    out = np.full([b - a for a, b in box], np.nan, np.float32)
    source = ChunkSource(array.store)
    for block in source.blocks(fmt, array, box):
        for g in np.ndindex(*block.grid.shape):
            chunk = block.chunks[block.grid[g]]
            start = [o + i * c for o, i, c in zip(block.origin, g, chunk.shape)]
            src, dst = [], []
            for s, c, (a, b) in zip(start, chunk.shape, box):
                lo, hi = max(s, a), min(s + c, b)
                src.append(slice(lo - s, max(lo, hi) - s))
                dst.append(slice(lo - a, max(lo, hi) - a))
            out[tuple(dst)] = chunk[tuple(src)]
    return out


@pytest.mark.parametrize("endian", ["little", "big"])
@pytest.mark.parametrize("index_location", ["end", "start"])
@pytest.mark.parametrize("compression", sorted(COMPRESSORS))
def test_sharded_arrays_read_directly(tmp_path, endian, index_location, compression):
    array = _array(tmp_path / "a.zarr", endian=endian, index_location=index_location, compression=compression)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # no deprecated zarr name is read
        fmt = ChunkFormat.of(array)
    assert fmt.supported, f"{fmt} read through zarr instead of directly"
    assert fmt.dtype == np.dtype("<f4" if endian == "little" else ">f4")
    assert fmt.index_at_end == (index_location == "end")
    assert fmt.index_crc  # zarr's default shard index codecs: bytes + crc32c
    assert len(fmt.decoders) == (0 if compression == "none" else 1)
    for box in (((0, 10), (0, 12)), ((3, 9), (2, 11)), ((5, 6), (7, 8))):
        want = VALUES[tuple(slice(a, b) for a, b in box)]
        np.testing.assert_array_equal(_read(fmt, array, box), want, err_msg=str(box))


def test_codec_settings_are_the_specification_strings():
    sharding = ShardingCodec(chunk_shape=(2, 2), index_location="start")
    assert zarr_api.codec_config(sharding)["index_location"] == "start"
    assert not zarr_api.index_at_end(sharding)
    assert zarr_api.index_at_end(ShardingCodec(chunk_shape=(2, 2)))
    assert zarr_api.little_endian(BytesCodec(endian="little"))
    assert not zarr_api.little_endian(BytesCodec(endian="big"))
    assert zarr_api.little_endian(BytesCodec(endian=None))
    assert zarr_api.numcodecs_codec(ZstdCodec(level=1)) is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inner = zarr_api.numcodecs_codec(zarr.codecs.numcodecs.Zstd(level=3))
    assert inner is not None and inner.codec_id == "zstd" and inner.level == 3


@pytest.mark.parametrize("name", sorted(COMPRESSIONS))
def test_written_codecs_use_no_deprecated_zarr_name(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        codecs = COMPRESSIONS[name]()
    assert all(zarr_api.codec_config(c) is not None for c in codecs)
