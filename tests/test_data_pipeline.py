"""synth, prepare, statistics, inspect, io-report and the sharded loader (one spawn)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import xarray as xr
from jigsaw_earth.data.batch import VariableSpec
from jigsaw_earth.data.loader import ShardedLoader
from jigsaw_earth.data.prepare import prepare_store
from jigsaw_earth.data.stats import compute_statistics, read_statistics
from jigsaw_earth.data.synth import SynthConfig, climatology_path, synth_store
from jigsaw_earth.data.writer import ChunkLayout

from jigsaw_earth.cli import main
from jigsaw_earth.distributed.halo import Halo
from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.distributed.spawn import spawn

from .data_helpers import RENAME, dataset, padded_window, truth

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
    assert main(["data", "synth", "--out", str(out), "--grid", "32x64", "--start", "2020-01-01",
                 "--end", "2020-01-02", "--levels", "500,850", "--for-mesh", "2x2", "--no-climatology"]) == 0
    assert main(["data", "inspect", str(out), "--json", str(tmp_path / "i.json")]) == 0
    info = json.loads((tmp_path / "i.json").read_text())
    assert info["grid"]["latitude_order"] == "descending" and info["time"]["step_hours"] == 6.0
    assert all(v.get("nans", 0) == 0 for v in info["variables"])
    report = tmp_path / "io.json"
    main(["data", "io-report", str(out), "--mesh", "2x2", "--mesh", "1x4", "--halo", "0",
          "--json", str(report)])
    records = json.loads(report.read_text())
    for r in records:  # halo 0, tile-aligned shards: every rank reads about a quarter
        assert r["max_fraction"] < 0.25 + 0.05, r
        assert sum(k["bytes_read"] for k in r["ranks"]) < 1.2 * r["sample_bytes_read"]


def _loader_rank(mesh, path, period):
    loader = ShardedLoader(path, mesh, spec=SPEC, halo=Halo.uniform(1, "pole"), batch_size=2,
                           lead_steps=2, period=period, seed=3)
    it = iter(loader)
    first = next(it)
    second = next(it)
    return {"coord": list(mesh.coord), "tile": list(loader.tile.slices[0].indices(99)[:2])
            + list(loader.tile.slices[1].indices(99)[:2]),
            "times": [str(t) for t in first.times] + [str(t) for t in second.times],
            "inputs": first.inputs.numpy().tolist(), "targets_shape": list(first.targets.shape),
            "n_batches": len(loader)}


def test_loader_multi_rank(synth):
    """2 data-parallel groups × 1x2 domain: same times within a group, different across groups,
    each rank's normalised inputs equal the pad_reference window of the xarray field."""
    period = ("2020-01-01", "2020-01-06")
    results = spawn(MeshShape(2, 1, 2), _loader_rank, str(synth), period)
    ds = _open(synth)
    stats = read_statistics(synth)
    by_group = {}
    for r in results:
        by_group.setdefault(r["coord"][0], []).append(r)
    assert all(len({tuple(r["times"]) for r in g}) == 1 for g in by_group.values())
    assert not set(by_group[0][0]["times"]) & set(by_group[1][0]["times"])
    for r in results:
        t0 = np.datetime64(r["times"][0])
        fields = [ds[v].sel(time=t0, level=[500, 850]).values for v in SPEC.upper_air]
        fields.append(ds["2m_temperature"].sel(time=t0).values[None])
        raw = np.concatenate(fields)
        mean = np.concatenate([stats[v].sel(stat="mean", level=[500, 850]).values for v in SPEC.upper_air]
                              + [[float(stats["2m_temperature"].sel(stat="mean"))]])
        std = np.concatenate([stats[v].sel(stat="std", level=[500, 850]).values for v in SPEC.upper_air]
                             + [[float(stats["2m_temperature"].sel(stat="std"))]])
        norm = (raw - mean[:, None, None]) / std[:, None, None]
        from jigsaw_earth.distributed.tiles import TileGrid

        tile = TileGrid(16, 32, 1, 2).tile_of(r["coord"][2])
        want = padded_window(norm.astype(np.float32), tile, Halo.uniform(1, "pole"))
        np.testing.assert_allclose(np.array(r["inputs"][0]), want, rtol=1e-5, atol=1e-5)
        assert r["targets_shape"] == [2, 2, 5, 16, 16]


def test_loader_resume_mid_epoch(synth):
    mesh = DomainMesh(MeshShape(1, 2, 2), rank=3)
    kw = {"spec": SPEC, "batch_size": 3, "lead_steps": 1, "period": ("2020-01-01", "2020-01-07"), "seed": 7}
    a = ShardedLoader(synth, mesh, **kw)
    it = iter(a)
    next(it)
    state = a.state_dict()
    expected = next(it)
    it.close()
    b = ShardedLoader(synth, mesh, **kw)
    b.load_state_dict(state)
    got = next(iter(b))
    np.testing.assert_array_equal(got.times, expected.times)
    np.testing.assert_array_equal(got.inputs.numpy(), expected.inputs.numpy())
    epoch = list(ShardedLoader(synth, mesh, **kw))
    assert len(epoch) == len(a) and len({str(t) for b in epoch for t in b.times}) == 3 * len(epoch)
    with pytest.raises(ValueError, match="batch_size"):
        b.load_state_dict({**state, "batch_size": 5})
