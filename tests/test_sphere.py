"""The sphere module: the pole rule against pad_reference, weights against their closed forms, and
the numpy and torch coordinate channels against each other."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from jigsaw_earth import sphere
from jigsaw_earth.distributed.halo import Halo, pad_reference


@pytest.mark.parametrize(
    "halo",
    [Halo.uniform(2, "pole"), Halo((3, 1), (2, 0), "replicate"), Halo((1, 2), (1, 1), "zeros", "zeros")],
)
def test_source_maps_index_pad_reference(halo: Halo) -> None:
    """Indexing a field by ``row_sources`` × ``col_sources`` is the serial padding, pole included."""
    n_lat, n_lon = 7, 10
    x = torch.arange(n_lat * n_lon, dtype=torch.float64).reshape(n_lat, n_lon) + 1
    want = pad_reference(x, halo)
    rows = sphere.row_sources(n_lat, -halo.lat[0], n_lat + halo.lat[1], halo.lat_mode)
    got = torch.zeros_like(want)
    for i, (g, across) in enumerate(rows):
        cols = sphere.col_sources(n_lon, -halo.lon[0], n_lon + halo.lon[1], halo.lon_mode, across)
        for j, c in enumerate(cols):
            got[i, j] = 0.0 if g < 0 or c < 0 else x[g, c]
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_latitude_weights() -> None:
    """WB2 weights are the cell areas (a pole row gets half a cell), WB1's are cos(lat)."""
    lat = sphere.grid_latitudes(5)  # 90, 45, 0, -45, -90: edges at ±90, ±67.5, ±22.5
    edges = np.deg2rad([90, 67.5, 22.5, -22.5, -67.5, -90])
    area = np.sin(edges[:-1]) - np.sin(edges[1:])
    np.testing.assert_allclose(sphere.latitude_weights(lat), area / area.mean(), rtol=1e-12)
    np.testing.assert_allclose(sphere.latitude_weights(lat[::-1]), (area / area.mean())[::-1], rtol=1e-12)
    cos = np.cos(np.deg2rad(lat))
    np.testing.assert_allclose(sphere.cos_latitude_weights(lat), cos / cos.mean(), rtol=1e-12)
    with pytest.raises(ValueError, match="distinct values in"):
        sphere.latitude_weights(np.array([10.0, 10.0]))


def test_grid_latitudes_match_row_latitudes() -> None:
    for centred in (False, True):
        np.testing.assert_allclose(
            np.deg2rad(sphere.grid_latitudes(9, centred)),
            sphere.row_latitudes(9, centred=centred),
            atol=1e-15,
        )
    assert sphere.grid_latitudes(4, centred=True).tolist() == [67.5, 22.5, -22.5, -67.5]


def test_coordinate_channels_numpy_and_torch() -> None:
    lat, lon = sphere.row_latitudes(6), sphere.column_longitudes(8, centred=True)
    a = sphere.coordinate_channels(lat, lon)
    b = sphere.coordinate_channels(torch.from_numpy(lat), torch.from_numpy(lon))
    assert a.shape == (sphere.N_COORD_CHANNELS, 6, 8) and b.dtype == torch.float64
    np.testing.assert_allclose(b.numpy(), a, rtol=0, atol=1e-15)
    np.testing.assert_allclose(a[0] ** 2 + a[1] ** 2, 1.0, atol=1e-15)
    np.testing.assert_allclose(a[2, 3], np.sin(lon), atol=0)
