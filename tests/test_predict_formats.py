"""``predict --init`` from an operational analysis, ``--format grib2|netcdf`` out.

The demo's config (its model, variables and levels) trained for 2 steps on a short synthetic store on the
demo's grid; an IFS-open-data-like GRIB 2 file of two of the store's times (``grib_helpers``) is the
analysis. ``predict CONFIG --init that.grib2 --steps 4 --format grib2 --out F`` must write messages that
ecCodes and cfgrib read back with the keys a centre's tools look for, equal to the same forecast written
as Zarr within the stated packing bound; netCDF likewise (CF, exactly equal); a 2×2 mesh writes the
same files; a stop, or a failure while converting, resumes to byte-identical files.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.distributed.spawn import spawn

from .grib_helpers import write_centre_file

pytest.importorskip("eccodes", reason="GRIB needs the grib extra: pip install -e '.[grib]'")

DEMO = Path(__file__).parents[1] / "configs" / "demo.yaml"
INITS = np.array(["2020-01-05T00", "2020-01-05T12"], "datetime64[ns]")
SHORT = {"z": "geopotential", "t": "temperature", "u": "u_component_of_wind", "v": "v_component_of_wind",
         "2t": "2m_temperature"}  # fmt: skip


def _demo(root: Path) -> dict:
    """configs/demo.yaml on this test's store and run directory, 2 training steps on one rank."""
    raw = yaml.safe_load(DEMO.read_text())
    raw["run"]["dir"] = str(root / "run")
    raw["mesh"] = {"data": 1, "lat": 1, "lon": 1}
    raw["data"].update(store=str(root / "data.zarr"), train_period=["2020-01-01", "2020-01-03T18"],
                       val_period=["2020-01-04", "2020-01-06"])  # fmt: skip
    raw["training"]["steps"], raw["optim"]["warmup_steps"] = 2, 1
    raw["validation"]["max_samples"] = 2
    raw["checkpoint"]["every"] = 2
    raw["logging"] = {"progress": False, "wandb": {"mode": "disabled"}}
    return raw


def _main(argv: list[str], capsys) -> tuple[int, str]:
    from jigsaw_earth.cli import main

    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from jigsaw_earth.data.synth import SynthConfig, synth_store

    from jigsaw_earth.config import parse_config
    from jigsaw_earth.training import run_training

    root = tmp_path_factory.mktemp("formats")
    synth_store(root / "data.zarr", SynthConfig(start="2020-01-01", end="2020-01-06T18"))
    raw = _demo(root)
    run_training(parse_config(raw))
    config = root / "demo.yaml"
    config.write_text(yaml.safe_dump(raw))
    analysis = root / "analysis"
    analysis.mkdir()
    grib = write_centre_file(analysis / "ifs.grib2", xr.open_zarr(root / "data.zarr"), INITS, [500, 850])
    from jigsaw_earth.config import load_config
    from jigsaw_earth.inference.predict import run_prediction

    cfg = load_config(config)
    for fmt, out in (("grib2", "F"), ("zarr", "F.zarr"), ("netcdf", "N")):
        run_prediction(cfg, root / out, start="", end="", steps=4, init=str(grib), fmt=fmt)
    return {"root": root, "config": config, "grib": grib}


def _messages(path: Path) -> list[tuple[dict, np.ndarray]]:
    import eccodes as ec

    keys = ("shortName", "paramId", "typeOfLevel", "level", "dataDate", "dataTime", "stepRange", "gridType",
            "Ni", "Nj", "latitudeOfFirstGridPointInDegrees", "longitudeOfFirstGridPointInDegrees",
            "jScansPositively", "centre", "typeOfProcessedData", "edition")  # fmt: skip
    out = []
    with open(path, "rb") as f:
        while (h := ec.codes_grib_new_from_file(f)) is not None:
            out.append(({k: ec.codes_get(h, k) for k in keys}, ec.codes_get_values(h).reshape(32, 64)))
            ec.codes_release(h)
    return out


def test_grib2_messages_have_a_centres_keys_and_the_zarr_forecast(demo: dict[str, Path]) -> None:
    folder, zarr = demo["root"] / "F", xr.open_zarr(demo["root"] / "F.zarr")
    info = json.loads((folder / "jigsaw_earth.json").read_text())
    names = [f"20200105{t}_{h:03d}.grib2" for t in ("0000", "1200") for h in (6, 12, 18, 24)]
    assert info["files"] == names
    assert sorted(p.name for p in folder.iterdir()) == sorted([*names, "jigsaw_earth.json"])
    bound = info["packing_bound"]
    assert bound == {"geopotential": 0.1, "temperature": 0.01, "u_component_of_wind": 0.01,
                     "v_component_of_wind": 0.01, "2m_temperature": 0.01}  # fmt: skip
    for name in names:
        init, lead = np.datetime64(f"{name[:4]}-{name[4:6]}-{name[6:8]}T{name[8:10]}", "ns"), int(name[13:16])
        messages = _messages(folder / name)
        assert [(k["shortName"], k["level"]) for k, _ in messages] == [
            (s, lev) for s in "ztuv" for lev in (500, 850)] + [("2t", 2)]  # fmt: skip
        for keys, values in messages:
            variable = SHORT[keys["shortName"]]
            assert keys["typeOfLevel"] == (
                "heightAboveGround" if variable == "2m_temperature" else "isobaricInhPa"
            )
            assert keys["paramId"] == {"z": 129, "t": 130, "u": 131, "v": 132, "2t": 167}[keys["shortName"]]
            assert (keys["dataDate"], keys["dataTime"], keys["stepRange"]) == (
                20200105,
                int(name[8:12]),
                str(lead),
            )
            assert (keys["gridType"], keys["Ni"], keys["Nj"], keys["jScansPositively"]) == (
                "regular_ll",
                64,
                32,
                0,
            )
            assert keys["latitudeOfFirstGridPointInDegrees"] == 87.1875 and keys["edition"] == 2
            assert keys["longitudeOfFirstGridPointInDegrees"] == 0 and keys["typeOfProcessedData"] == "fc"
            want = zarr[variable].sel(time=init, prediction_timedelta=np.timedelta64(lead, "h"))
            if variable != "2m_temperature":
                want = want.sel(level=keys["level"])
            assert np.abs(values - want.values).max() <= bound[variable], (name, keys["shortName"])


def test_cfgrib_reads_the_grib2_files_as_the_forecast(demo: dict[str, Path]) -> None:
    cfgrib = pytest.importorskip("cfgrib")
    folder = demo["root"] / "F"
    path = folder / "202001051200_018.grib2"
    parts = {
        str(v): d
        for d in cfgrib.open_datasets(str(path), backend_kwargs={"indexpath": ""})
        for v in d.data_vars
    }
    assert sorted(parts) == ["t", "t2m", "u", "v", "z"]
    upper = parts["z"]
    assert sorted(upper["isobaricInhPa"].values.tolist()) == [500, 850]
    assert upper["time"].values == INITS[1] and upper["step"].values == np.timedelta64(18, "h")
    assert upper["valid_time"].values == INITS[1] + np.timedelta64(18, "h")
    assert float(parts["t2m"]["heightAboveGround"]) == 2.0
    zarr = xr.open_zarr(demo["root"] / "F.zarr").sel(
        time=INITS[1], prediction_timedelta=np.timedelta64(18, "h")
    )
    np.testing.assert_allclose(
        upper["z"].sel(isobaricInhPa=500).values, zarr["geopotential"].sel(level=500), atol=0.1
    )
    np.testing.assert_allclose(parts["t2m"]["t2m"].values, zarr["2m_temperature"].values, atol=0.01)
    assert not list(folder.glob("*.idx")) and not list(demo["grib"].parent.glob("*.idx"))


def test_netcdf_files_follow_cf_and_equal_the_zarr_forecast(demo: dict[str, Path]) -> None:
    import netCDF4

    folder = demo["root"] / "N"
    assert sorted(p.name for p in folder.iterdir()) == [
        "202001050000.nc",
        "202001051200.nc",
        "jigsaw_earth.json",
    ]
    zarr = xr.open_zarr(demo["root"] / "F.zarr")
    got = xr.open_mfdataset(sorted(folder.glob("*.nc")))
    for name in zarr.data_vars:
        assert np.array_equal(got[name].values, zarr[name].values), name
    with netCDF4.Dataset(folder / "202001051200.nc") as nc:
        assert nc.Conventions == "CF-1.8"
        assert nc["time"].standard_name == "forecast_reference_time" and nc["time"].units.startswith(
            "hours since"
        )
        assert (
            nc["prediction_timedelta"].standard_name == "forecast_period"
            and nc["prediction_timedelta"].units == "hours"
        )
        assert nc["valid_time"].standard_name == "time" and nc["valid_time"].dimensions == (
            "time",
            "prediction_timedelta",
        )
        assert nc["level"].units == "hPa" and nc["level"].positive == "down"
        assert nc["latitude"].units == "degrees_north" and nc["longitude"].units == "degrees_east"
        assert nc["geopotential"].standard_name == "geopotential" and nc["geopotential"].units == "m2/s2"
        assert (
            nc["2m_temperature"].standard_name == "air_temperature"
            and "valid_time" in nc["2m_temperature"].coordinates
        )


def test_an_analysis_gives_the_forecast_of_the_same_state_in_the_store(
    demo: dict[str, Path], tmp_path: Path
) -> None:
    """A netCDF analysis of the store's own state (longitudes −180…180, latitudes upward) forecasts exactly
    what predict forecasts from the store at that time: the model's statistics, static fields, times;
    and ``--score`` scores it as it scores the store's."""
    from jigsaw_earth.config import load_config
    from jigsaw_earth.inference.predict import run_prediction
    from jigsaw_earth.inference.scoring import ScoreRequest

    store = xr.open_zarr(demo["root"] / "data.zarr").sel(time=INITS[:1])
    turned = store.roll(longitude=32, roll_coords=True).isel(latitude=slice(None, None, -1))
    turned = turned.assign_coords(longitude=(turned["longitude"] + 180) % 360 - 180)
    turned = turned.drop_vars(["land_sea_mask", "geopotential_at_surface"]).drop_attrs()
    turned.to_netcdf(tmp_path / "analysis.nc")
    cfg = load_config(demo["config"])
    init = str(tmp_path / "analysis.nc")
    one = run_prediction(cfg, tmp_path / "a.zarr", start="", end="", steps=4, init=init, score=ScoreRequest())
    two = run_prediction(cfg, tmp_path / "b.zarr", start="2020-01-05T00", end="2020-01-05T00", steps=4,
                         score=ScoreRequest())  # fmt: skip
    a, b = xr.open_zarr(tmp_path / "a.zarr"), xr.open_zarr(tmp_path / "b.zarr")
    for name in b.data_vars:
        assert np.array_equal(a[name].values, b[name].values), name
    assert json.dumps(one.rows) == json.dumps(two.rows) and len(one.rows) > 0  # NaN intervals: one init


def _predict_on_mesh(mesh: DomainMesh, raw: dict, root: str, grib: str) -> str:
    from jigsaw_earth.config import parse_config
    from jigsaw_earth.inference.predict import run_prediction

    cfg = parse_config(raw)
    for fmt in ("grib2", "netcdf"):  # on the spawned mesh, which stays up between the two
        out = Path(root) / f"mesh-{fmt}"
        at = [str(INITS[1])[:13]]
        run_prediction(cfg, out, start="", end="", steps=4, init=grib, init_times=at, fmt=fmt, mesh=mesh)
    return root


def test_a_2x2_mesh_writes_the_same_files(demo: dict[str, Path], tmp_path: Path) -> None:
    """Four ranks, each its tile, the files shared out among them: every message and netCDF file holds the
    whole field, as on one rank."""
    raw = yaml.safe_load(demo["config"].read_text())
    raw["mesh"] = {"data": 1, "lat": 2, "lon": 2}
    spawn(MeshShape(1, 2, 2), _predict_on_mesh, raw, str(tmp_path), str(demo["grib"]))
    one, four = demo["root"] / "F", tmp_path / "mesh-grib2"
    names = sorted(p.name for p in four.glob("*.grib2"))
    assert names == [f"202001051200_{h:03d}.grib2" for h in (6, 12, 18, 24)]
    for path in [one / name for name in names]:
        for (k1, v1), (k4, v4) in zip(_messages(path), _messages(four / path.name), strict=True):
            assert k1 == k4
            assert np.abs(v1 - v4).max() <= 0.1 + 1e-5 * np.abs(v1).max(), (path.name, k1["shortName"])
    a = xr.open_dataset(demo["root"] / "N" / "202001051200.nc")
    b = xr.open_dataset(tmp_path / "mesh-netcdf" / "202001051200.nc")
    for name in a.data_vars:
        x, y = a[name].values, b[name].values
        assert np.abs(x - y).max() <= 1e-5 * np.abs(x).max(), name


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_stopped_grib2_forecast_resumes_to_the_same_files(
    demo: dict[str, Path], tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped before its second batch, then failing while converting: each rerun of the same command goes
    on, and the files are byte for byte those of a run never stopped."""
    from jigsaw_earth.inference import formats, progress
    from jigsaw_earth.inference.unfinished import find_unfinished, foreign_files

    base = ["predict", demo["config"], "--init", demo["grib"], "--steps", "4", "--format", "grib2",
            "--batch-size", "1"]  # fmt: skip
    assert _main([*base, "--out", tmp_path / "ref"], capsys)[0] == 0
    out = tmp_path / "fc"
    folder = Path(f"{out}.in-progress")
    boundary = progress.Progress.boundary

    def stop_second(self, i: int, pipe) -> None:  # a stop asked for just before batch 2
        if self.first + i == 1:
            self.signals.received = "SIGTERM"
        boundary(self, i, pipe)

    monkeypatch.setattr(progress.Progress, "boundary", stop_second)
    code, text = _main([*base, "--out", out], capsys)
    assert code == 75 and "stopped on SIGTERM before batch 2 of 2" in text, text
    assert folder.is_dir() and not out.exists()
    monkeypatch.undo()

    write, written = formats.write_messages, []

    def broken(*args, **kwargs) -> int:
        written.append(1)
        if len(written) == 3:
            raise OSError(28, "No space left on device")
        return write(*args, **kwargs)

    monkeypatch.setattr(formats, "write_messages", broken)
    code, text = _main([*base, "--out", out], capsys)
    assert code == 2 and "No space left on device" in text and folder.is_dir() and not out.exists(), text
    assert len(list((folder / "_output").iterdir())) == 3  # two files and the third's part: predict's own
    assert foreign_files(folder) == [] and find_unfinished(tmp_path)[0].path == folder
    monkeypatch.undo()
    assert _main([*base, "--out", out], capsys)[0] == 0
    assert _files(out) == _files(tmp_path / "ref") and not folder.exists()


def test_refusals_come_before_the_model_loads(demo: dict[str, Path], tmp_path: Path, capsys) -> None:
    store = xr.open_zarr(demo["root"] / "data.zarr")
    lacking = write_centre_file(
        tmp_path / "gfs.grib2", store, INITS[:1], [500, 850], "gfs", skip=(("u", 850),)
    )
    base = ["predict", demo["config"], "--steps", "4"]
    cases = [
        (
            ["--init", lacking, "--out", tmp_path / "a"],
            "lacks u_component_of_wind (u isobaricInhPa) level 850 hPa",
        ),
        (
            ["--init", demo["grib"], "--start", "2020-01-05", "--out", tmp_path / "b"],
            "with --init choose its times",
        ),
        (["--init", demo["grib"], "--time", "2020-01-07T00", "--out", tmp_path / "c"], "is not in --init"),
        (
            [
                "--init",
                demo["grib"],
                "--format",
                "grib2",
                "--template",
                "{day}.grib2",
                "--out",
                tmp_path / "d",
            ],
            "--template '{day}.grib2': KeyError",
        ),
        (
            [
                "--init",
                demo["grib"],
                "--format",
                "netcdf",
                "--template",
                "../{step}.nc",
                "--out",
                tmp_path / "e",
            ],
            "file names must stay inside --out",
        ),
        (["--init", demo["grib"], "--out", demo["grib"]], "is the --init source"),
    ]
    for extra, message in cases:
        code, text = _main([*base, *extra], capsys)
        assert code == 2 and message in text, (extra, text)
    assert "gh isobaricInhPa 500,850; t isobaricInhPa 500,850; u isobaricInhPa 500;" in _main(
        [*base, *cases[0][0]], capsys)[1]  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gfs.grib2"], "nothing written"
    code, text = _main(["score", demo["root"] / "F", "--truth", demo["root"] / "data.zarr"], capsys)
    assert code == 2 and "is a folder of grib2 files (predict --format grib2); score reads a" in text, text


def test_grib_packing_keeps_each_variable_within_its_bound() -> None:
    import eccodes as ec

    from jigsaw_earth.inference.write_grib import PACKING_BOUND, GribField, check_grib, encode

    lat, lon = 90 - (np.arange(32) + 0.5) * 180 / 32, np.arange(64) * 360 / 64
    rng = np.random.default_rng(0)
    scale = {
        "geopotential": 5e4,
        "temperature": 250,
        "specific_humidity": 0.02,
        "mean_sea_level_pressure": 1e5,
    }
    for name, bound in PACKING_BOUND.items():
        level = 850 if name in ("geopotential", "temperature", "u_component_of_wind", "v_component_of_wind",
                                "specific_humidity", "vertical_velocity") else None  # fmt: skip
        values = (scale.get(name, 20) * (1 + rng.standard_normal((32, 64)))).astype(np.float32)
        values[3, :5] = np.nan  # missing points go through a bitmap
        h = ec.codes_new_from_message(encode(GribField(name, level, INITS[0], 6), values, lat, lon))
        back = ec.codes_get_values(h).reshape(32, 64)
        missing = back == ec.codes_get(h, "missingValue")
        ec.codes_release(h)
        assert np.array_equal(missing, np.isnan(values)), name
        assert np.abs(back - values)[~missing].max() <= bound, name
    member = GribField("temperature", 500, INITS[1], 12, member=3, members=10)
    h = ec.codes_new_from_message(encode(member, np.full((32, 64), 250, np.float32), lat, lon))
    keys = {k: ec.codes_get(h, k) for k in ("number", "typeOfProcessedData", "numberOfForecastsInEnsemble",
                                            "stepRange", "dataTime", "shortName")}  # fmt: skip
    ec.codes_release(h)
    assert keys == {"number": 3, "typeOfProcessedData": "pf", "numberOfForecastsInEnsemble": 10,
                    "stepRange": "12", "dataTime": 1200, "shortName": "t"}  # fmt: skip
    with pytest.raises(ValueError, match=r"no GRIB parameter for \['total_precipitation_6hr'\]"):
        check_grib(["2m_temperature", "total_precipitation_6hr"], lat, lon)
    with pytest.raises(ValueError, match="not evenly spaced"):
        check_grib(["2m_temperature"], np.array([80.0, 10.0, -20.0]), lon)
