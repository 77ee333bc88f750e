"""ERA5 as users have it: numeric time, irregular and gappy axes, surface-only stores, hourly
accumulations, the CDS netCDF pair, truncated files, fsspec stores, mesh chunking, preflight."""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr
import yaml
from jigsaw_earth.data.batch import VariableSpec
from jigsaw_earth.data.preflight import store_preflight
from jigsaw_earth.data.prepare import TimeOptions, prepare_store
from jigsaw_earth.data.reader import TileReader
from jigsaw_earth.data.report import inspect_store, planned_fraction
from jigsaw_earth.data.store import StoreView
from jigsaw_earth.data.times import TimeAxis, resample_plan
from jigsaw_earth.data.writer import ChunkLayout

from jigsaw_earth.cli import main
from jigsaw_earth.config import load_config
from jigsaw_earth.distributed.halo import Halo
from jigsaw_earth.distributed.mesh import MeshShape
from jigsaw_earth.distributed.tiles import TileGrid
from jigsaw_earth.training.evaluate import format_table

N_LAT, N_LON = 7, 12
LAT = np.linspace(90, -90, N_LAT)
LON = np.arange(N_LON) * 30.0


def _open(path) -> xr.Dataset:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return xr.open_zarr(str(path), chunks=None, consolidated=False)


def surface_store(times: np.ndarray, *, seed: int = 0, extra: dict | None = None) -> xr.Dataset:
    """A surface-only store (no level dimension): t2m and msl, plus static lsm."""
    rng = np.random.default_rng(seed)
    shape = (len(times), N_LAT, N_LON)
    data = {
        "t2m": (("time", "latitude", "longitude"), rng.normal(280, 5, shape).astype(np.float32)),
        "msl": (("time", "latitude", "longitude"), rng.normal(1e5, 100, shape).astype(np.float32)),
        "lsm": (("latitude", "longitude"), rng.uniform(size=shape[1:]).astype(np.float32)),
    }
    data.update(extra or {})
    return xr.Dataset(data, coords={"time": times, "latitude": LAT, "longitude": LON})


def hours(start: str, offsets) -> np.ndarray:
    return np.datetime64(start, "ns") + np.asarray(offsets) * np.timedelta64(1, "h")


def write_zarr(ds: xr.Dataset, path) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(str(path), mode="w", consolidated=False)
    return str(path)


def fail(argv: list[str], capsys) -> str:
    """Run the CLI, expect exit 2 and one error line (no traceback); return stderr."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


# ---- 1. time ------------------------------------------------------------------------------
def test_integer_time_units_from_store_attribute_or_option(tmp_path, capsys):
    ds = surface_store(hours("2020-01-01", np.arange(8) * 6))
    raw = ds.assign_coords(time=np.arange(8) * 6 + 24)  # hours since 2019-12-31, units elsewhere
    bare = write_zarr(raw, tmp_path / "bare.zarr")
    err = fail(["data", "prepare", bare, "--out", str(tmp_path / "x.zarr")], capsys)
    assert "without units" in err and "--time-units" in err
    out = tmp_path / "opt.zarr"
    assert (
        main(
            [
                "data",
                "prepare",
                bare,
                "--out",
                str(out),
                "--no-progress",
                "--time-units",
                "hours since 2019-12-31",
            ]
        )
        == 0
    )
    np.testing.assert_array_equal(_open(out)["time"].values, ds["time"].values)
    attr = write_zarr(raw.assign_attrs(time_units="hours since 2019-12-31 00:00"), tmp_path / "attr.zarr")
    np.testing.assert_array_equal(StoreView.open(attr).times, ds["time"].values)
    floats = write_zarr(
        raw.assign_coords(time=(np.arange(8) * 0.25 + 1)).assign_attrs(time_units="days since 2019-12-31"),
        tmp_path / "days.zarr",
    )
    np.testing.assert_array_equal(StoreView.open(floats).times, ds["time"].values)


def test_irregular_axis_is_refused_with_histogram_and_fix(tmp_path, capsys):
    offsets = np.cumsum([0] + [7, 8] * 6)  # 7 h / 8 h alternating, as in the issue
    src = write_zarr(surface_store(hours("2020-01-01", offsets)), tmp_path / "irr.zarr")
    for extra in ([], ["--step-hours", "6"], ["--step-hours", "8"]):
        err = fail(["data", "prepare", src, "--out", str(tmp_path / "o.zarr"), *extra], capsys)
        assert "irregular" in err and "7 h ×6" in err and "8 h ×6" in err and "--resample 6h" in err, err
    assert not (tmp_path / "o.zarr").exists()
    r = inspect_store(src, nan_scan="none")
    assert r["time"]["gaps"] == [] and len(r["time"]["irregular"]) == 6
    assert main(["data", "inspect", src, "--nans", "none"]) == 0
    assert "IRREGULAR" in capsys.readouterr().out


def test_resample_nearest_and_linear(tmp_path):
    offsets = np.array([0, 7, 15, 22, 30, 37, 45, 52])
    ds = surface_store(hours("2020-01-01", offsets))
    ramp = (offsets[:, None, None] * np.ones((1, N_LAT, N_LON))).astype(np.float32)
    ds["t2m"] = (("time", "latitude", "longitude"), ramp)  # linear in time: interpolation is exact
    src = write_zarr(ds, tmp_path / "irr.zarr")
    out = tmp_path / "lin.zarr"
    prepare_store(src, out, progress=False, time=TimeOptions(resample_hours=6, resample_method="linear"))
    got = _open(out)
    want = hours("2020-01-01", np.arange(0, 49, 6))
    np.testing.assert_array_equal(got["time"].values, want)
    np.testing.assert_allclose(got["2m_temperature"].values[:, 0, 0], np.arange(0, 49, 6), rtol=1e-6)
    targets, i0, _, w = resample_plan(ds["time"].values, 6, "nearest", 1.0)
    # within 1 h: 0 (0), 6 (7), 24 (22? no, 2 h), 30 (30), 36 (37), 42? (45: 3 h) ...
    assert (np.abs(ds["time"].values[i0] - targets.astype("datetime64[ns]")) <= np.timedelta64(1, "h")).all()
    assert (w == 0).all() and TimeAxis.of(targets).gaps  # targets without a source nearby become gaps


def test_gaps_are_listed_kept_and_skipped_only_when_allowed(tmp_path, capsys):
    offsets = np.delete(np.arange(16) * 6, [5, 6])  # two missing times in a row: one gap
    src = write_zarr(surface_store(hours("2020-01-01", offsets)), tmp_path / "gap.zarr")
    r = inspect_store(src, nan_scan="none")
    assert r["time"]["gaps"] == [["2020-01-02T00:00:00", "2020-01-02T18:00:00"]]
    assert r["time"]["missing_times"] == 2 and r["time"]["irregular"] == []
    out = tmp_path / "p.zarr"
    prepare_store(src, out, progress=False)
    assert len(_open(out)["time"]) == 14
    cfg = _config(out, tmp_path, upper_air=[], surface=["2m_temperature"], static=["land_sea_mask"])
    problems = store_preflight(cfg)
    assert len(problems) == 2 and all("data.allow_gaps: true" in p for p in problems), problems
    cfg.data.allow_gaps = True
    assert store_preflight(cfg) == []


def _memory_data(times: np.ndarray, channels: list[str], **kw: Any) -> Callable[..., Any]:
    """``TrainData`` on one rank over random in-memory fields of ``channels`` at ``times``, every time for
    training: a factory taking ``TrainData``'s remaining arguments (``kw``'s are given)."""
    from jigsaw_earth.data.samples import MemorySource, TrainData

    from jigsaw_earth.distributed.mesh import DomainMesh

    shape = (len(times), len(channels), N_LAT, N_LON)
    fields = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    grid = TileGrid(N_LAT, N_LON, 1, 1)
    source = MemorySource(fields, fields[0], times, LAT, channels, ["s"], grid.tile_of(0))
    mesh = DomainMesh(MeshShape(1, 1, 1))
    return functools.partial(TrainData, source, mesh, grid, train_period=[], val_period=[], **kw)


def test_trainer_pairs_inputs_with_targets_by_time_across_gaps():
    """TrainData (training, validation and predict) finds targets by time, not index stride."""
    times = hours("2020-01-01", np.delete(np.arange(20) * 6, [7]))
    make = _memory_data(
        times, ["x"], mean=np.zeros(1), std=np.ones(1), global_batch=2, seed=0, step_hours=12, rollout_steps=2
    )
    with pytest.raises(ValueError, match=r"data\.allow_gaps: true"):
        make()
    data = make(allow_gaps=True)
    for step in range(5):
        batch = data.train_batch(step)
        lead = batch.target_times - batch.times[:, None]
        assert (lead == np.array([12, 24]) * np.timedelta64(1, "h")).all()
    assert len(data.train_index) == len(times) - 4 - 2  # 4 run past the end, 2 need the missing time
    np.testing.assert_array_equal(
        data.valid_inits(np.arange(len(times)), 1), data._inits(np.ones(len(times), bool), 1, "x")
    )


def test_prefetch_depth_never_changes_a_batch():
    """Batches read ahead (any depth, jumps as on resume) equal batches read on demand."""
    times = hours("2020-01-01", np.arange(30) * 6)
    make = _memory_data(times, ["x", "y"], mean=np.array([0.5, -1.0]), std=np.array([2.0, 3.0]),
                        global_batch=3, seed=1, step_hours=6, rollout_steps=1)  # fmt: skip
    plain = make(prefetch=0)
    for depth in (1, 3):
        ahead = make(prefetch=depth)
        for step in (0, 1, 2, 7, 8, 3):  # a jump forward and one back (resume, validation)
            a, b = ahead.train_batch(step), plain.train_batch(step)
            assert ahead.last_wait_s >= 0
            np.testing.assert_array_equal(a.inputs.numpy(), b.inputs.numpy())
            np.testing.assert_array_equal(a.targets.numpy(), b.targets.numpy())
    assert plain.batch_bytes() == 4 * 3 * 2 * N_LAT * N_LON * 2


# ---- 2. variables from the store ------------------------------------------------------------
def _config(store, tmp_path, **data):
    """A config file ``tmp_path/c.yaml`` for ``store`` (schema defaults unless given), parsed."""
    base = {"store": str(store), "train_period": [], "val_period": [], **data}
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            {"data": base, "validation": {"variables": [], "lead_hours": [6]}, "training": {"batch_size": 1}}
        )
    )
    return load_config(str(path), [])


def test_surface_only_store_end_to_end(tmp_path, capsys):
    src = write_zarr(surface_store(hours("2020-01-01", np.arange(12) * 6)), tmp_path / "sfc.zarr")
    out = tmp_path / "p.zarr"
    layout = ChunkLayout.for_mesh(N_LAT, N_LON, MeshShape(1, 2, 2))
    info = prepare_store(src, out, progress=False, layout=layout)
    assert info["variables"] == ["2m_temperature", "mean_sea_level_pressure", "land_sea_mask"]
    cfg = _config(out, tmp_path)  # default data.upper_air asks for geopotential, static for orography
    problems = store_preflight(cfg)
    text = "\n".join(problems)
    assert "set data.upper_air: []" in text and "set data.static: [land_sea_mask]" in text, text
    assert "recompute" not in text
    cfg = _config(out, tmp_path, upper_air=[], surface=["2m_temperature"], static=["land_sea_mask"])
    assert store_preflight(cfg) == []
    # io-report: defaults are the store's variables; '' means none
    report = tmp_path / "io.json"
    assert main(
        [
            "data",
            "io-report",
            str(out),
            "--upper-air",
            "",
            "--surface",
            "2m_temperature",
            "--json",
            str(report),
        ]
    ) in (0, 1)
    assert json.loads(report.read_text())[0]["channels"] == 1
    assert main(["data", "io-report", str(out), "--json", str(report)]) in (0, 1)
    assert json.loads(report.read_text())[0]["channels"] == 2
    nb = json.loads((Path(__file__).parents[1] / "notebooks" / "explore_predictions.ipynb").read_text())
    code = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert '"geopotential@500"' not in code and "'geopotential@500'" not in code


# ---- 3. accumulations -----------------------------------------------------------------------
def test_hourly_precipitation_is_never_relabelled(tmp_path):
    n = 25
    tp = np.arange(n, dtype=np.float32)[:, None, None] * np.ones((1, N_LAT, N_LON), np.float32)
    ds = surface_store(
        hours("2020-01-01", np.arange(n)), extra={"tp": (("time", "latitude", "longitude"), tp)}
    )
    src = write_zarr(ds, tmp_path / "hourly.zarr")
    plain = tmp_path / "plain.zarr"
    prepare_store(src, plain, progress=False, step_hours=6)
    got = _open(plain)
    assert "total_precipitation_6hr" not in got
    assert got["total_precipitation"].attrs["accumulation_hours"] == 1
    np.testing.assert_array_equal(got["total_precipitation"].values[:, 0, 0], [0, 6, 12, 18, 24])
    summed = tmp_path / "six.zarr"
    prepare_store(src, summed, progress=False, time=TimeOptions(step_hours=6, accumulate_hours=6))
    got = _open(summed)
    assert "total_precipitation" not in got
    assert got["total_precipitation_6hr"].attrs["accumulation_hours"] == 6
    np.testing.assert_array_equal(got["time"].values, hours("2020-01-01", [6, 12, 18, 24]))
    # the 6 h total ending at T sums the hourly values at T-5 h .. T
    np.testing.assert_array_equal(
        got["total_precipitation_6hr"].values[:, 0, 0], [sum(range(t - 5, t + 1)) for t in (6, 12, 18, 24)]
    )


# ---- 4. ERA5 as downloaded ------------------------------------------------------------------
def cds_pair(folder, n_time: int = 8) -> dict:
    """The CDS netCDF pair: pressure levels (z, t, u, v, q) and single levels (t2m, msl, tp, z, lsm)."""
    rng = np.random.default_rng(1)
    seconds = (np.arange(n_time) * 6 * 3600 + 1577836800).astype(np.int64)  # since 1970, as the CDS
    t_attrs = {"units": "seconds since 1970-01-01", "calendar": "proleptic_gregorian"}
    levels = np.array([1000.0, 850.0, 500.0])  # descending, as the CDS writes them
    coords = {
        "valid_time": ("valid_time", seconds, t_attrs),
        "latitude": LAT,
        "longitude": LON,
        "number": 0,
        "expver": ("valid_time", np.array(["0001"] * n_time)),
    }
    pl = {
        v: (
            ("valid_time", "pressure_level", "latitude", "longitude"),
            rng.normal(size=(n_time, 3, N_LAT, N_LON)).astype(np.float32),
        )
        for v in "ztuvq"
    }
    sl_dims = ("valid_time", "latitude", "longitude")
    sl = {
        v: (sl_dims, rng.normal(size=(n_time, N_LAT, N_LON)).astype(np.float32))
        for v in ("t2m", "msl", "tp", "z", "lsm")
    }
    a = xr.Dataset(pl, coords={**coords, "pressure_level": ("pressure_level", levels, {"units": "hPa"})})
    b = xr.Dataset(sl, coords=coords)
    for ds, kind in ((a, "pl"), (b, "sl")):
        ds.to_netcdf(folder / f"data_stream-oper_stepType-instant_{kind}.nc")
    return {"pl": a, "sl": b}


def test_cds_netcdf_pair_is_ingested_without_hand_work(tmp_path):
    folder = tmp_path / "cds"
    folder.mkdir()
    src = cds_pair(folder)
    out = tmp_path / "era5.zarr"
    assert main(["data", "prepare", str(folder), "--out", str(out), "--no-progress"]) == 0
    got = _open(out)
    assert {
        "geopotential",
        "temperature",
        "u_component_of_wind",
        "v_component_of_wind",
        "specific_humidity",
        "2m_temperature",
        "mean_sea_level_pressure",
        "total_precipitation",
        "land_sea_mask",
        "geopotential_at_surface",
    } == set(got.data_vars)
    assert got["level"].values.tolist() == [500, 850, 1000]
    np.testing.assert_array_equal(got["geopotential"].sel(level=1000).values, src["pl"]["z"].values[:, 0])
    np.testing.assert_array_equal(got["geopotential_at_surface"].values, src["sl"]["z"].values[0])
    assert got["time"].values[0] == np.datetime64("2020-01-01T00")


def test_truncated_netcdf_gets_one_message_naming_it(tmp_path, capsys):
    folder = tmp_path / "cds"
    folder.mkdir()
    cds_pair(folder)
    bad = folder / "data_stream-oper_stepType-instant_sl.nc"
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    err = fail(["data", "prepare", str(folder), "--out", str(tmp_path / "o.zarr")], capsys)
    assert str(bad) in err and "truncated" in err and err.count("\n") == 1, err


def test_wb2_zarr_through_fsspec_memory(tmp_path):
    ds = surface_store(hours("2020-01-01", np.arange(8) * 6))
    ds = ds.rename({"t2m": "2m_temperature", "msl": "mean_sea_level_pressure", "lsm": "land_sea_mask"})
    url = write_zarr(ds, "memory://wb2/era5-sfc.zarr")
    out = tmp_path / "p.zarr"
    prepare_store(url, out, progress=False)
    np.testing.assert_array_equal(_open(out)["2m_temperature"].values, ds["2m_temperature"].values)


def write_grib(path, values: np.ndarray, short_name: str, times: np.ndarray, levels=None) -> None:
    """GRIB 2 messages on the module's 30° grid, written with ecCodes (as the CDS delivers GRIB)."""
    import eccodes

    with open(path, "wb") as f:
        for k, t in enumerate(times.astype("datetime64[h]")):
            for j, level in enumerate(levels or [None]):
                sample = "regular_ll_pl_grib2" if level else "regular_ll_sfc_grib2"
                h = eccodes.codes_grib_new_from_samples(sample)
                keys = {
                    "Ni": N_LON,
                    "Nj": N_LAT,
                    "latitudeOfFirstGridPointInDegrees": 90.0,
                    "latitudeOfLastGridPointInDegrees": -90.0,
                    "longitudeOfFirstGridPointInDegrees": 0.0,
                    "longitudeOfLastGridPointInDegrees": 330.0,
                    "iDirectionIncrementInDegrees": 30.0,
                    "jDirectionIncrementInDegrees": 30.0,
                    "dataDate": int(str(t)[:10].replace("-", "")),
                    "dataTime": int(str(t)[11:13]) * 100,
                    "shortName": short_name,
                }
                for key, value in keys.items():
                    eccodes.codes_set(h, key, value)
                if level:
                    eccodes.codes_set(h, "level", int(level))
                eccodes.codes_set_values(h, (values[k, j] if level else values[k]).ravel().astype(float))
                eccodes.codes_write(h, f)
                eccodes.codes_release(h)


def test_grib_through_eccodes(tmp_path):
    pytest.importorskip("eccodes")
    folder = tmp_path / "grib"
    folder.mkdir()
    times = hours("2020-01-01", np.arange(4) * 6)
    rng = np.random.default_rng(2)
    t2m, t = rng.normal(280, 5, (4, N_LAT, N_LON)), rng.normal(250, 5, (4, 2, N_LAT, N_LON))
    write_grib(folder / "sfc.grib", t2m, "2t", times)
    write_grib(folder / "pl.grib", t, "t", times, levels=[850, 500])
    out = tmp_path / "g.zarr"
    prepare_store(folder, out, progress=False)
    got = _open(out)
    np.testing.assert_allclose(got["2m_temperature"].values, t2m, atol=1e-3)
    np.testing.assert_allclose(got["temperature"].sel(level=850).values, t[:, 0], atol=1e-3)
    assert not list(folder.glob("*.idx"))


# ---- 5. chunking for the mesh ---------------------------------------------------------------
@pytest.mark.parametrize("grid", [(721, 1440), (181, 360)])
def test_for_mesh_plans_large_grids_and_meets_the_read_bound(tmp_path, grid):
    n_lat, n_lon = grid
    layout = ChunkLayout.for_mesh(n_lat, n_lon, MeshShape(1, 2, 2))
    assert layout.lat_chunk >= 4 and layout.lon_chunk >= 4
    # an empty store with the layout: the plan (chunks touched per rank) needs only metadata
    import zarr

    root = zarr.open_group(str(tmp_path / "m.zarr"), mode="w", zarr_format=3)
    from jigsaw_earth.data.writer import create_variable, write_coords

    write_coords(
        root,
        hours("2020-01-01", [0, 6]),
        np.array([500, 850]),
        np.linspace(90, -90, n_lat),
        np.arange(n_lon) * 360.0 / n_lon,
    )
    dims = ["time", "level", "latitude", "longitude"]
    create_variable(root, "geopotential", (2, 2, n_lat, n_lon), dims, layout)
    create_variable(root, "2m_temperature", (2, n_lat, n_lon), ["time", "latitude", "longitude"], layout)
    view = StoreView.open(tmp_path / "m.zarr")
    spec = VariableSpec(("geopotential",), (500, 850), ("2m_temperature",), static=())
    grid_ = TileGrid(n_lat, n_lon, 2, 2)
    # what training reads (tiles, no halo) stays within 0.30 of a sample per rank, in whole-tile rows
    fractions = [
        planned_fraction(TileReader(view, spec, grid_, grid_.tile_of(k), Halo()), 1) for k in range(4)
    ]
    assert max(fractions) <= 0.3, fractions
    assert layout.lon_chunk == layout.lon_shard == n_lon // 2  # chunks as wide as a tile: one run per level
    whole = ChunkLayout()  # one chunk per field: every rank reads everything
    root2 = zarr.open_group(str(tmp_path / "w.zarr"), mode="w", zarr_format=3)
    write_coords(
        root2,
        hours("2020-01-01", [0, 6]),
        None,
        np.linspace(90, -90, n_lat),
        np.arange(n_lon) * 360.0 / n_lon,
    )
    create_variable(root2, "2m_temperature", (2, n_lat, n_lon), ["time", "latitude", "longitude"], whole)
    view2 = StoreView.open(tmp_path / "w.zarr")
    spec2 = VariableSpec((), (), ("2m_temperature",), static=())
    assert planned_fraction(TileReader(view2, spec2, grid_, grid_.tile_of(0), Halo.uniform(1)), 1) == 1.0


def test_io_report_warns_on_whole_field_chunks(tmp_path, capsys):
    src = write_zarr(surface_store(hours("2020-01-01", np.arange(4) * 6)), tmp_path / "wb2.zarr")
    assert main(["data", "io-report", src, "--mesh", "2x2"]) == 1
    out = capsys.readouterr().out
    assert "WARNING" in out and "--for-mesh 2x2" in out


# ---- 7. validation and preflight ------------------------------------------------------------
def test_no_climatology_is_not_beaten():
    nan = float("nan")
    table = format_table(
        {"z500@24h/model": 1.0, "z500@24h/persistence": 2.0, "z500@24h/climatology": nan},
        ["geopotential@500"],
        [24],
    )
    assert "both: yes" not in table and "persistence: yes (no climatology)" in table
    table = format_table(
        {"z500@24h/model": 3.0, "z500@24h/persistence": 2.0, "z500@24h/climatology": 4.0},
        ["geopotential@500"],
        [24],
    )
    assert "both: NO" in table


def test_config_validate_checks_the_store(tmp_path, capsys):
    src = write_zarr(surface_store(hours("2020-01-01", np.arange(12) * 6)), tmp_path / "sfc.zarr")
    out = tmp_path / "p.zarr"
    prepare_store(src, out, progress=False)
    cfg = _config(out, tmp_path)
    path = tmp_path / "c.yaml"
    err = fail(["config", "validate", str(path), "--quiet"], capsys)
    assert "data.upper_air" in err and "set data.upper_air: []" in err
    ok = [
        "config",
        "validate",
        str(path),
        "--quiet",
        "data.upper_air=[]",
        "data.static=[land_sea_mask]",
        "data.surface=[2m_temperature]",
        "data.step_hours=12",
        "validation.lead_hours=[12]",
    ]
    assert main(ok) == 0, capsys.readouterr().err
    assert "fits the config" in capsys.readouterr().out
    assert cfg.data.allow_gaps is False
