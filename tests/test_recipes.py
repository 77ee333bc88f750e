"""The benchmark recipes (configs/benchmarks/*.yaml) run end to end — prepare, train, predict,
score with pictures — on a tiny synthetic WB2-layout store with each recipe's variables, levels,
latitude order and pole rows; only the grid, the periods, the model size and the steps shrink."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml

from jigsaw_earth.cli import main
from jigsaw_earth.config import parse_config
from jigsaw_earth.inference.predict import PredictRequest, run_prediction
from jigsaw_earth.training import run_training
from jigsaw_earth.validation.checks_models import PAPER_TINY

RECIPES = Path(__file__).parents[1] / "configs" / "benchmarks"
# the real stores' latitude layouts, at a tiny size: (rows, poles, ascending)
LAYOUTS = {
    "wb1-5.625deg": (16, False, True),
    "wb2-1.5deg": (17, True, True),
    "jigsaw-0.25deg": (17, True, False),
}


def _latitudes(rows: int, poles: bool, ascending: bool) -> np.ndarray:
    lat = np.linspace(-90, 90, rows) if poles else -90 + (np.arange(rows) + 0.5) * 180 / rows
    return lat if ascending else lat[::-1]


def _wb2_source(path: Path, recipe: dict, layout: tuple[int, bool, bool]) -> tuple[Path, Path]:
    """A WB2-layout ERA5-like store (and its climatology) with the recipe's variables."""
    d = recipe["data"]
    lat, lon = _latitudes(*layout), np.arange(32) * 360 / 32
    times = pd.date_range("2020-01-01", "2020-01-06T18", freq="6h").values
    rng = np.random.default_rng(0)
    t = np.arange(times.size)[:, None, None]
    wave = np.cos(np.deg2rad(lat))[:, None] * np.sin(np.deg2rad(lon) + 0.3 * t)  # (time, lat, lon)
    scale = {"geopotential": (5e4, 500.0), "temperature": (260.0, 5.0), "specific_humidity": (5e-3, 1e-3)}
    data = {}
    for name in d["upper_air"]:
        mean, amp = scale.get(name, (0.0, 10.0))
        field = mean + amp * (
            wave[:, None] + 0.1 * rng.normal(size=(times.size, len(d["levels"]), lat.size, lon.size))
        )
        data[name] = (("time", "level", "latitude", "longitude"), field.astype(np.float32))
    for name in d["surface"]:
        mean, amp = {"2m_temperature": (285.0, 8.0), "mean_sea_level_pressure": (1.01e5, 800.0)}.get(
            name, (0.0, 5.0)
        )
        field = mean + amp * (wave + 0.1 * rng.normal(size=(times.size, lat.size, lon.size)))
        data[name] = (("time", "latitude", "longitude"), field.astype(np.float32))
    data["land_sea_mask"] = (
        ("latitude", "longitude"),
        (rng.random((lat.size, lon.size)) > 0.7).astype(np.float32),
    )
    data["geopotential_at_surface"] = (
        ("latitude", "longitude"),
        rng.random((lat.size, lon.size)).astype(np.float32),
    )
    ds = xr.Dataset(data, coords={"time": times, "level": d["levels"], "latitude": lat, "longitude": lon})
    ds.to_zarr(path, mode="w")
    dynamic = ds[[*d["upper_air"], *d["surface"]]]
    clim = dynamic.mean("time").expand_dims(hour=[0, 6, 12, 18], dayofyear=np.arange(1, 367))
    clim_path = path.with_name("climatology.zarr")
    clim.chunk({"dayofyear": 61}).to_zarr(clim_path, mode="w")
    return path, clim_path


@pytest.mark.parametrize(
    "name",
    [
        "wb1-5.625deg",
        pytest.param("wb2-1.5deg", marks=pytest.mark.slow),
        pytest.param("jigsaw-0.25deg", marks=pytest.mark.slow),
    ],
)
def test_recipe_end_to_end(name: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    recipe = yaml.safe_load((RECIPES / f"{name}.yaml").read_text())
    d = recipe["data"]
    src, clim = _wb2_source(tmp_path / "source.zarr", recipe, LAYOUTS[name])
    store = tmp_path / "era5.zarr"
    prepare = ["data", "prepare", str(src), "--out", str(store), "--no-progress"]
    prepare += ["--upper-air", ",".join(d["upper_air"]), "--levels", ",".join(map(str, d["levels"]))]
    assert main([*prepare, "--surface", ",".join(d["surface"])]) == 0
    # the recipe with a tiny model, grid-independent settings kept; periods inside the synthetic week
    recipe["run"]["dir"] = str(tmp_path / "run")
    recipe["mesh"] = {"data": 1, "lat": 1, "lon": 1}
    recipe["data"].update(
        store=str(store),
        climatology=str(clim),
        train_period=["2020-01-01", "2020-01-03T18"],
        val_period=["2020-01-04", "2020-01-05T18"],
    )
    overrides = {k: v for k, v in recipe["model"].get("overrides", {}).items() if k == "patch"}
    if recipe["model"]["preset"].startswith("paper"):  # the paper's arrangement at tiny size
        overrides = {k: list(v) if isinstance(v, tuple) else v for k, v in PAPER_TINY.items()}
    recipe["model"].update(preset="tiny", overrides=overrides)
    recipe["training"].update(steps=2, batch_size=2, precision="fp32", compile=False)  # no CPU compile
    recipe["validation"].update(every=0, lead_hours=[6], max_samples=1, batch_size=1)
    recipe["checkpoint"].update(every=0)
    recipe["logging"] = {"every": 1, "progress": False, "wandb": {"mode": "disabled"}}
    cfg = parse_config(recipe)
    run_training(cfg)
    forecast = tmp_path / "forecast.zarr"
    run_prediction(
        parse_config(recipe),
        PredictRequest(out=forecast, first_init="2020-01-04", last_init="2020-01-05", steps=2, max_inits=2),
    )
    capsys.readouterr()
    code = main(
        [
            "score", str(forecast), "--truth", str(store), "--climatology", str(clim),
            "--regions", "global", "europe", "--out", str(tmp_path / "scores"),
            "--plot", str(tmp_path / "plots"),
        ]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "global · geopotential @ 500 hPa [m2/s2]" in out
    fc = xr.open_zarr(forecast)
    assert fc.sizes["latitude"] == LAYOUTS[name][0] and len(fc.data_vars) == len(d["upper_air"]) + len(
        d["surface"]
    )
    assert fc["temperature"].attrs["units"] == "K"
    assert (tmp_path / "plots" / "scorecard-global.png").is_file()
    assert (tmp_path / "plots" / "map-geopotential.png").is_file()
