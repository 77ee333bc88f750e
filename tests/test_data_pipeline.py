"""synth, prepare, statistics, inspect and io-report."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import xarray as xr
from jigsaw_earth.data.batch import VariableSpec
from jigsaw_earth.data.prepare import prepare_store
from jigsaw_earth.data.stats import compute_statistics, read_statistics
from jigsaw_earth.data.synth import SynthConfig, climatology_path, synth_store
from jigsaw_earth.data.writer import ChunkLayout

from jigsaw_earth.cli import main

from .data_helpers import RENAME, dataset, synth_argv, truth

CFG = SynthConfig(n_lat=16, n_lon=32, start="2020-01-01", end="2020-01-08T18", levels=(850, 500))
SPEC = VariableSpec(("geopotential", "temperature"), (500, 850), ("2m_temperature",))


def _open(path) -> xr.Dataset:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return xr.open_zarr(str(path), chunks=None, consolidated=False)


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    path = tmp_path_factory.mktemp("synth") / "data.zarr"
    synth_store(path, CFG)
    return path


def test_synth_follows_wb2_conventions(synth):
    ds = _open(synth)
    assert ds["geopotential"].dims == ("time", "level", "latitude", "longitude")
    assert ds["2m_temperature"].dims == ("time", "latitude", "longitude")
    assert ds["level"].values.tolist() == [500, 850]
    assert (np.diff(ds["latitude"].values) < 0).all()
    assert (np.diff(ds["time"].values) == np.timedelta64(6, "h")).all()
    z500 = ds["geopotential"].sel(level=500).values
    t850 = ds["temperature"].sel(level=850).values
    assert 4.8e4 < z500.mean() < 6.0e4 and 250 < t850.mean() < 295
    assert 9e4 < ds["mean_sea_level_pressure"].values.mean() < 1.1e5
    assert set(np.unique(np.round(ds["land_sea_mask"].values))) <= {0.0, 1.0}
    clim = _open(climatology_path(synth))
    assert clim["temperature"].dims == ("hour", "dayofyear", "level", "latitude", "longitude")
    assert clim.sizes["dayofyear"] == 366 and clim["hour"].values.tolist() == [0, 6, 12, 18]


def test_synth_is_learnable_advection(synth):
    """24 h ahead, shifting the wave field by its travel beats persistence (the signal moves)."""
    z = _open(synth)["geopotential"].sel(level=500).values
    mid = slice(2, 6)  # northern mid-latitude rows of 16
    a, b = z[:-4, mid], z[4:, mid]
    persistence = np.sqrt(((a - b) ** 2).mean())
    shifted = min(np.sqrt(((np.roll(a, s, axis=-1) - b) ** 2).mean()) for s in range(1, 6))
    assert shifted < 0.8 * persistence


def test_synth_statistics_match_dask(synth):
    streamed = read_statistics(synth)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        recomputed = compute_statistics(synth)
    for v in ("geopotential", "2m_temperature", "specific_humidity"):
        np.testing.assert_allclose(streamed[v].values, recomputed[v].values, rtol=2e-4, atol=1e-9)


def test_prepare_from_netcdf_folder_normalises(tmp_path):
    t = truth(n_time=8)
    ds = dataset(t, ascending=True, swap=True, rename=True, levels_desc=True, pascal=True)
    folder = tmp_path / "nc"
    folder.mkdir()
    ds.isel(time=slice(0, 4)).to_netcdf(folder / "a.nc")
    ds.isel(time=slice(4, 8)).to_netcdf(folder / "b.nc")
    out = tmp_path / "p.zarr"
    names = {"latitude": "lat", "longitude": "lon", "level": "plev"}
    info = prepare_store(folder, out, names=names, layout=ChunkLayout(4, 8, 8, 16), progress=False)
    assert sorted(info["variables"]) == sorted([*RENAME, "geopotential_at_surface"])
    got = _open(out)
    np.testing.assert_array_equal(got["temperature"].sel(level=250).values, t["fields"]["temperature"][:, 0])
    np.testing.assert_array_equal(got["2m_temperature"].values, t["fields"]["2m_temperature"])
    assert got["latitude"].values[0] > got["latitude"].values[-1]
    assert got["temperature"].encoding["shards"] == (1, 3, 8, 16)
    assert "geopotential" in read_statistics(out)


def test_cli_synth_inspect_io_report(tmp_path, capsys):
    out = tmp_path / "t.zarr"
    assert main(synth_argv(out, "32x64", "2020-01-02")) == 0
    assert main(["data", "inspect", str(out), "--json", str(tmp_path / "i.json")]) == 0
    info = json.loads((tmp_path / "i.json").read_text())
    assert info["grid"]["latitude_order"] == "descending" and info["time"]["step_hours"] == 6.0
    assert all(v.get("nans", 0) == 0 for v in info["variables"])
    report = tmp_path / "io.json"
    main(
        [
            "data",
            "io-report",
            str(out),
            "--mesh",
            "2x2",
            "--mesh",
            "1x4",
            "--halo",
            "0",
            "--json",
            str(report),
        ]
    )
    records = json.loads(report.read_text())
    by_mesh = {r["mesh"]: r for r in records}
    # halo 0, tile-wide chunks for 2x2: every 2x2 rank reads about a quarter; a 1x4 rank's tile is half
    # a 2x2 chunk wide, so it reads its share twice over (the cost of rows as wide as the named tile)
    assert by_mesh["2x2"]["max_fraction"] < 0.25 + 0.05, by_mesh["2x2"]
    assert by_mesh["1x4"]["max_fraction"] <= 0.5 + 0.01, by_mesh["1x4"]
    for r in records:
        over = 1.2 if r["mesh"] == "2x2" else 2.01
        assert sum(k["bytes_read"] for k in r["ranks"]) < over * r["sample_bytes_read"]
