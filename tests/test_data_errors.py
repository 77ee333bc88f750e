"""Bad input: every error names the item, the value and the fix; nothing half-written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from jigsaw_earth.data import prepare_write
from jigsaw_earth.data.batch import VariableSpec
from jigsaw_earth.data.climatology import open_climatology
from jigsaw_earth.data.prepare import prepare_store
from jigsaw_earth.data.reader import TileReader
from jigsaw_earth.data.stats import Normalizer, read_statistics
from jigsaw_earth.data.store import StoreView
from jigsaw_earth.data.times import sample_index

from jigsaw_earth.cli import main
from jigsaw_earth.distributed.halo import Halo
from jigsaw_earth.distributed.tiles import TileGrid

from .data_helpers import SURFACE, UPPER, dataset, truth, write

T = truth(n_time=8)
SPEC = VariableSpec(UPPER, (500,), SURFACE, static=())


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    return write(dataset(T), tmp_path_factory.mktemp("e") / "s.zarr", {"latitude": 13, "longitude": 16})


def _reader(path: str, spec: VariableSpec = SPEC, **kw) -> TileReader:
    view = StoreView.open(path, **kw)
    grid = TileGrid(*view.grid_shape, 2, 2)
    return TileReader(view, spec, grid, grid.tile_of(0), Halo.uniform(1))


def test_missing_variable_lists_the_store(store):
    with pytest.raises(ValueError, match=r"'specific_humidity'.*store has .*geopotential\[level\].*--name"):
        _reader(store, VariableSpec(("specific_humidity",), (500,), (), static=()))


def test_missing_level_lists_levels(store):
    with pytest.raises(ValueError, match=r"level 700 hPa of 'geopotential'.*\[250, 500, 850\]"):
        _reader(store, VariableSpec(("geopotential",), (700,), (), static=()))


def test_unmapped_coordinate_and_mapping_fix(tmp_path):
    ds = dataset(T).rename({"latitude": "nlat_coord"})
    path = write(ds, tmp_path / "c.zarr")
    with pytest.raises(ValueError, match=r"no latitude coordinate.*nlat_coord.*--name latitude=NAME"):
        StoreView.open(path)
    assert StoreView.open(path, names={"latitude": "nlat_coord"}).grid_shape == (13, 16)


def test_renamed_variable_needs_mapping_or_alias(tmp_path):
    path = write(dataset(T).rename({"2m_temperature": "T_2M"}), tmp_path / "r.zarr")
    with pytest.raises(ValueError, match=r"'2m_temperature'.*T_2M"):
        _reader(path)
    _reader(path, names={"2m_temperature": "T_2M"}).read_inputs(0)


def test_time_gap_is_named(tmp_path):
    times = T["times"]
    gappy = np.delete(times, 4)
    every = np.arange(len(gappy))
    gap = r"1 time gap.*2020-01-01T18:00:00 and 2020-01-02T06:00:00.*data.allow_gaps: true"
    with pytest.raises(ValueError, match=gap):
        sample_index(gappy, every, 6, 1, False, "s", "training")
    inits, targets = sample_index(gappy, every, 6, 1, True, "s", "training")
    assert 3 not in inits.tolist() and len(inits) == 5
    assert (gappy[targets[:, 0]] - gappy[inits] == np.timedelta64(6, "h")).all()
    with pytest.raises(ValueError, match="step_hours=5 is not a multiple"):
        sample_index(times, every, 5, 1, False, "s", "training")


def test_nans_are_named(tmp_path):
    ds = dataset(T)
    ds["2m_temperature"][2, 0, 0] = np.nan
    path = write(ds, tmp_path / "n.zarr")
    reader = _reader(path)
    reader.read_inputs(1)
    with pytest.raises(ValueError, match=r"'2m_temperature' has 1 NaN.*2020-01-01T12.*inspect"):
        reader.read_inputs(2)
    # training's reads leave the check to its non-finite loss (``TrainData.nan_report``)
    x, _ = reader.read_batch(np.array([2]), np.zeros((1, 0), np.int64), check_nan=False)
    assert int(np.isnan(x).sum()) == 1


def test_unreadable_chunk_is_named(tmp_path):
    path = write(dataset(T), tmp_path / "u.zarr", zarr_format=3)
    chunk = Path(path, "temperature", "c", "3", "0", "0", "0")
    assert chunk.exists()
    chunk.write_bytes(b"this is not zstd")
    reader = _reader(path)
    with pytest.raises(ValueError, match=r"could not read variable 'temperature' at .*T18.*damaged"):
        reader.read_inputs(3)


def test_missing_chunk_reads_as_nan_and_is_named(tmp_path):
    path = write(dataset(T), tmp_path / "m.zarr", zarr_format=3)
    Path(path, "geopotential", "c", "5", "0", "0", "0").unlink()
    with pytest.raises(ValueError, match=r"'geopotential' has .* NaN"):
        _reader(path).read_inputs(5)


def test_statistics_and_climatology_on_another_grid(tmp_path, store):
    small = truth(n_lat=8, n_lon=16, n_time=8)
    other = write(dataset(small), tmp_path / "o.zarr")
    out = tmp_path / "o-prepared.zarr"
    prepare_store(other, out, progress=False)
    view = StoreView.open(store)
    with pytest.raises(ValueError, match=r"statistics are for a 8x16 grid but store .* 13x16.*recompute"):
        Normalizer.from_stats(read_statistics(out), SPEC, view, 4)
    clim = xr.Dataset(
        {
            "2m_temperature": (
                ("hour", "dayofyear", "latitude", "longitude"),
                np.zeros((4, 366, 8, 16), np.float32),
            )
        },
        coords={
            "hour": [0, 6, 12, 18],
            "dayofyear": np.arange(1, 367),
            "latitude": small["lat"],
            "longitude": small["lon"],
        },
    )
    cpath = write(clim, tmp_path / "clim.zarr")
    with pytest.raises(ValueError, match=r"climatology .* 8x16 grid .* store .* 13x16.*regrid"):
        open_climatology(cpath, view)


def test_prepare_crash_leaves_an_unfinished_store_that_the_next_run_finishes(tmp_path, store, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(prepare_write, "write_statistics", boom)
    out = tmp_path / "out.zarr"
    with pytest.raises(RuntimeError):
        prepare_store(store, out, progress=False)
    assert not out.exists()
    (unfinished,) = tmp_path.glob("out.zarr*")
    assert unfinished.name == "out.zarr.tmp-prepare"
    with pytest.raises(ValueError, match="incomplete write"):
        StoreView.open(unfinished)
    monkeypatch.undo()
    prepare_store(store, out, progress=False)
    assert StoreView.open(out).times.size and not unfinished.exists()


def test_incomplete_store_is_refused(tmp_path, store):
    import shutil

    tmp = tmp_path / "x.zarr.tmp-123"
    shutil.copytree(store, tmp)
    with pytest.raises(ValueError, match="incomplete write"):
        StoreView.open(tmp)


def test_cli_exit_code_2_with_message(tmp_path, capsys, store):
    assert main(["data", "inspect", str(tmp_path / "nowhere.zarr")]) == 2
    assert "does not exist" in capsys.readouterr().err
    code = main(
        ["data", "io-report", store, "--upper-air", "vertical_velocity", "--surface", "2m_temperature"]
    )
    assert code == 2
    assert "'vertical_velocity'" in capsys.readouterr().err
