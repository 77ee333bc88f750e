"""Sharded inference: train briefly, forecast on 1 rank and on a 2×2 mesh, compare the stores,
then run the notebook's code on them (so the notebook cannot drift from the API)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from jigsaw_earth.data.synth import SynthConfig, synth_store

from jigsaw_earth.config import parse_config
from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.inference.predict import run_prediction
from jigsaw_earth.training import run_training

NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "explore_predictions.ipynb"


def _config(tmp: Path, mesh: tuple[int, int], **extra) -> dict:
    return {
        "run": {"dir": str(tmp / "run"), "seed": 1},
        "mesh": {"data": 1, "lat": mesh[0], "lon": mesh[1]},
        "data": {
            "store": str(tmp / "data.zarr"),
            "upper_air": ["geopotential", "temperature"],
            "levels": [500],
            "surface": ["2m_temperature"],
            "train_period": ["2020-01-01", "2020-01-10"],
            "val_period": ["2020-01-11", "2020-01-14"],
        },
        "model": {"name": "weathermixer", "preset": "tiny", "overrides": {"patch": 2}},
        "training": {"steps": 3, "batch_size": 2},
        "validation": {
            "lead_hours": [6],
            "max_samples": 2,
            "variables": ["geopotential@500", "2m_temperature"],
        },
        "checkpoint": {"every": 0, "resume": "auto"},
        "logging": {"progress": False, "wandb": {"mode": "disabled"}},
        **extra,
    }


def _predict_on_mesh(mesh: DomainMesh, raw: dict, out: str) -> str:
    cfg = parse_config(raw)
    run_prediction(cfg, out, start="2020-01-11", end="2020-01-13", steps=3, max_inits=3)
    return out


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("predict")
    synth_store(
        tmp / "data.zarr",
        SynthConfig(
            n_lat=12,
            n_lon=24,
            start="2020-01-01",
            end="2020-01-16",
            levels=(500,),
            upper_air=("geopotential", "temperature"),
            surface=("2m_temperature",),
        ),
    )
    run_training(parse_config(_config(tmp, (1, 1))))
    one = tmp / "forecast_1x1.zarr"
    run_prediction(
        parse_config(_config(tmp, (1, 1))), one, start="2020-01-11", end="2020-01-13", steps=3, max_inits=3
    )
    four = spawn(MeshShape(1, 2, 2), _predict_on_mesh, _config(tmp, (2, 2)), str(tmp / "forecast_2x2.zarr"))[
        0
    ]
    return {"1x1": one, "2x2": Path(four), "truth": tmp / "data.zarr", "clim": tmp / "data-climatology.zarr"}


def test_forecast_store_is_wb2_layout_and_complete(stores: dict[str, Path]) -> None:
    ds = xr.open_zarr(stores["2x2"])
    assert ds["geopotential"].dims == ("time", "prediction_timedelta", "level", "latitude", "longitude")
    assert ds["2m_temperature"].dims == ("time", "prediction_timedelta", "latitude", "longitude")
    assert ds.sizes["time"] == 3 and ds.sizes["prediction_timedelta"] == 3
    assert list(ds.prediction_timedelta.values // np.timedelta64(1, "h")) == [6, 12, 18]
    assert ds.attrs["jigsaw_earth"]["complete"] is True
    assert not np.isnan(ds["geopotential"].values).any(), "every rank must have written its tile"
    assert ds["geopotential"].encoding["chunks"][-2:] == (6, 12), "chunks follow the 2x2 tiles"
    assert not list(stores["2x2"].parent.glob("forecast_2x2.zarr.tmp-*")), "no temporary store left"


def test_forecast_is_the_same_on_every_mesh(stores: dict[str, Path]) -> None:
    a, b = xr.open_zarr(stores["1x1"]), xr.open_zarr(stores["2x2"])
    for name in a.data_vars:
        x, y = a[name].values, b[name].values
        assert np.abs(x - y).max() <= 1e-5 * np.abs(x).max(), name


def test_forecast_differs_from_persistence(stores: dict[str, Path]) -> None:
    fc, truth = xr.open_zarr(stores["1x1"]), xr.open_zarr(stores["truth"])
    init = fc.time.values[0]
    z = fc["geopotential"].sel(time=init, level=500).values
    z0 = truth["geopotential"].sel(time=init, level=500).values
    assert np.abs(z - z0[None]).max() > 0, "the model must move the state"


def test_existing_store_is_not_overwritten(stores: dict[str, Path], tmp_path: Path) -> None:
    cfg = parse_config(_config(stores["truth"].parent, (1, 1)))
    with pytest.raises(ValueError, match="already exists"):
        run_prediction(cfg, stores["1x1"], start="2020-01-11", end="2020-01-13", steps=1)


def test_no_checkpoint_is_a_clear_error(stores: dict[str, Path], tmp_path: Path) -> None:
    raw = _config(stores["truth"].parent, (1, 1))
    raw["run"]["dir"] = str(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no checkpoint in run directory"):
        run_prediction(parse_config(raw), tmp_path / "x.zarr", start="2020-01-11", end="2020-01-13", steps=1)


def test_notebook_runs_in_a_jupyter_kernel(
    stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The notebook, executed cell by cell by a real IPython kernel (nbclient), on the forecast."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("JIGSAW_FORECAST", str(stores["2x2"]))
    monkeypatch.setenv("JIGSAW_TRUTH", str(stores["truth"]))
    monkeypatch.setenv("JIGSAW_CLIMATOLOGY", str(stores["clim"]))
    monkeypatch.setenv("JIGSAW_PLOTS", str(tmp_path / "plots"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "strip outputs"
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()  # raises CellExecutionError naming the cell on any error
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "global · geopotential @ 500 hPa [m2/s2]" in text and "tropics ·" in text
    images = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})
    ]
    assert len(images) == 4  # scorecards of 3 regions and the map of the first variable
    first = next(iter(xr.open_zarr(stores["2x2"]).data_vars))  # the notebook maps the store's first variable
    assert sorted(p.name for p in (tmp_path / "plots").glob("*.png")) == sorted(
        [f"map-{first}.png", "scorecard-extra-tropics.png", "scorecard-global.png", "scorecard-tropics.png"]
    )
