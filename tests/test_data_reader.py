"""Tile reader against plain xarray/pad_reference, in every layout the issue lists."""

from __future__ import annotations

import numpy as np
import pytest
from jigsaw_earth.data.batch import Batch, VariableSpec, channel_names
from jigsaw_earth.data.geometry import latitude_weights, tile_latitude_weights, time_features
from jigsaw_earth.data.reader import TileReader
from jigsaw_earth.data.store import StoreView

from jigsaw_earth.distributed.halo import Halo
from jigsaw_earth.distributed.tiles import TileGrid

from .data_helpers import (
    LEVELS,
    RENAME,
    SURFACE,
    UPPER,
    channels_global,
    dataset,
    padded_window,
    truth,
    write,
)

T = truth()
SPEC = VariableSpec(UPPER, (500, 850, 250), SURFACE, static=("land_sea_mask", "geopotential_at_surface"))
HALOS = [
    Halo(),
    Halo.uniform(1),
    Halo((2, 1), (3, 2), "pole"),
    Halo.uniform(2, "replicate"),
    Halo((3, 3), (1, 1), "pole"),
    Halo((1, 0), (0, 2), "zeros", "zeros"),
]
MESHES = [(1, 1), (2, 2), (3, 2), (1, 3), (4, 1)]  # 13 x 16 grid: uneven rows and columns

LAYOUTS = {
    "descending": ({}, {"latitude": 4, "longitude": 4}),
    "ascending_swapped_renamed_pa": (
        {"ascending": True, "swap": True, "rename": True, "levels_desc": True, "pascal": True},
        {"lat": 5, "lon": 3},
    ),
}


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def view(request, tmp_path_factory) -> StoreView:
    kwargs, chunks = LAYOUTS[request.param]
    path = write(dataset(T, **kwargs), tmp_path_factory.mktemp("s") / "s.zarr", chunks)
    names = {v: RENAME[v] for v in RENAME} if kwargs.get("rename") else None
    if names:
        names["geopotential_at_surface"] = "geopotential_at_surface"
    return StoreView.open(path, names=names)


def test_view_normalises_coordinates(view):
    np.testing.assert_allclose(view.lat, T["lat"])
    np.testing.assert_allclose(view.lon, T["lon"])
    assert sorted(view.levels.tolist()) == sorted(LEVELS)
    assert view.grid_shape == (13, 16)


def test_inputs_targets_static_equal_pad_reference(view):
    levels = sorted(SPEC.levels)
    want_in = channels_global(T, 3, levels)
    want_tg = np.stack([channels_global(T, 4, levels), channels_global(T, 7, levels)])
    static = np.stack([T["static"]["land_sea_mask"], T["static"]["geopotential_at_surface"]])
    for mesh in MESHES:
        grid = TileGrid(13, 16, *mesh)
        for halo in HALOS:
            for k in range(grid.n_tiles):
                tile = grid.tile_of(k)
                reader = TileReader(view, SPEC, grid, tile, halo)
                x, y = reader.read_sample(3, np.array([4, 7]))
                np.testing.assert_array_equal(
                    x, padded_window(want_in, tile, halo), err_msg=f"{mesh} {halo} {k}"
                )
                rows, cols = tile.slices
                np.testing.assert_array_equal(y, want_tg[..., rows, cols])
                s, names = reader.read_static()
                np.testing.assert_array_equal(s[:2], padded_window(static, tile, halo))
                lat = np.deg2rad(T["lat"])[:, None] * np.ones((1, 16))
                np.testing.assert_allclose(
                    s[names.index("cos_latitude")], padded_window(np.cos(lat), tile, halo), atol=1e-6
                )


def test_fsspec_memory_store():
    path = write(dataset(T, ascending=True), "memory://jigsaw-test/s.zarr", {"latitude": 4, "longitude": 8})
    view = StoreView.open(path)
    grid = TileGrid(13, 16, 2, 2)
    halo = Halo.uniform(2, "pole")
    reader = TileReader(view, SPEC, grid, grid.tile_of(3), halo)
    want = padded_window(channels_global(T, 5, sorted(SPEC.levels)), grid.tile_of(3), halo)
    np.testing.assert_array_equal(reader.read_inputs(5), want)


def _needed_chunks(tile, halo, chunk):
    """Chunks (row block, column block) holding the cells a padded tile copies (via pad_reference)."""
    ids = np.arange(13 * 16, dtype=np.float64).reshape(13, 16) + 1
    cells = padded_window(ids, tile, halo)
    cells = cells[cells > 0].astype(int) - 1
    return {(c // 16 // chunk[0], c % 16 // chunk[1]) for c in cells}


def test_reads_only_needed_chunks(tmp_path):
    """Bytes read = exactly the chunks holding needed cells (zeros: one block group per tile)."""
    chunk = (2, 4)
    path = write(
        dataset(T), tmp_path / "c.zarr", {"latitude": chunk[0], "longitude": chunk[1]}, zarr_format=3
    )
    spec = VariableSpec((), (), ("2m_temperature",), static=())
    grid = TileGrid(13, 16, 3, 2)
    for halo in (Halo.uniform(1), Halo((2, 1), (1, 3), "pole")):
        for k in range(grid.n_tiles):
            view = StoreView.open(path, count=True)
            reader = TileReader(view, spec, grid, grid.tile_of(k), halo)
            reader.reset_counts()
            reader.read_inputs(2)
            chunk_bytes = reader.bytes_read / max(reader.requests, 1)
            need = _needed_chunks(grid.tile_of(k), halo, chunk)
            assert reader.requests >= len(need)
            if halo.lat_mode == "zeros":
                assert reader.requests == len(need), (halo, k)
            assert reader.requests <= len(need) + 4
            assert chunk_bytes > 0
            full = -(-13 // chunk[0]) * (16 // chunk[1])
            assert reader.requests < full


def test_channel_order_and_batch_checks():
    assert channel_names(["z", "t"], [850, 500], ["t2m"]) == ["z@500", "z@850", "t@500", "t@850", "t2m"]
    import torch

    from jigsaw_earth.distributed.tiles import Tile

    tile = Tile(0, 4, 0, 6)
    ok = {
        "inputs": torch.zeros(2, 3, 6, 8),
        "targets": torch.zeros(2, 1, 3, 4, 6),
        "static": torch.zeros(1, 6, 8),
        "time_features": torch.zeros(2, 4),
        "channels": ["a", "b", "c"],
        "static_channels": ["s"],
        "times": np.zeros(2),
        "target_times": np.zeros((2, 1)),
        "tile": tile,
        "halo": Halo.uniform(1),
    }
    assert Batch(**ok).lead_steps == 1
    with pytest.raises(ValueError, match="needs 6x8"):
        Batch(**{**ok, "inputs": torch.zeros(2, 3, 4, 6)})


def test_latitude_weights_wb2():
    lat = np.array([90.0, 45.0, 0.0, -45.0, -90.0])
    edges = np.array([90.0, 67.5, 22.5, -22.5, -67.5, -90.0])
    raw = np.sin(np.deg2rad(edges[:-1])) - np.sin(np.deg2rad(edges[1:]))
    np.testing.assert_allclose(latitude_weights(lat), raw / raw.mean())
    np.testing.assert_allclose(latitude_weights(lat[::-1]), (raw / raw.mean())[::-1])
    assert latitude_weights(lat)[0] > 0
    lat32 = 90 - (np.arange(32) + 0.5) * 180 / 32
    w = latitude_weights(lat32)
    cos = np.cos(np.deg2rad(lat32))
    np.testing.assert_allclose(w / w[10], cos / cos[10], rtol=1e-3)
    grid = TileGrid(32, 64, 3, 1)
    parts = [tile_latitude_weights(lat32, grid.tile_of(k)) for k in range(3)]
    np.testing.assert_allclose(np.concatenate(parts), w)


def test_time_features():
    f = time_features(np.array(["2020-01-01T06", "2020-07-01T18"], dtype="datetime64[ns]"))
    np.testing.assert_allclose(f[0, :2], [1.0, 0.0], atol=1e-6)  # 06 UTC: sin(pi/2), cos(pi/2)
    np.testing.assert_allclose(f[1, :2], [-1.0, 0.0], atol=1e-6)
