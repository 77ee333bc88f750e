"""``predict --members N``: one forecast store with a member dimension ``number`` (WB2's convention),
each member's noise stream kept through the rollout, and ``predict --score`` of an ensemble equal to
``score`` of the written store (WB2's ensemble metrics beside RMSE, bias and ACC of the ensemble mean).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from jigsaw_earth.config import parse_config
from jigsaw_earth.inference.predict import run_prediction
from jigsaw_earth.inference.scoring import ScoreRequest
from jigsaw_earth.metrics.ensemble import ENSEMBLE_METRICS
from jigsaw_earth.training import run_training
from tests.test_predict_scale import PERIOD, _config, _keyed, _make_store, _score_rows


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A deterministic tiny model trained on the demo-like store."""
    tmp = tmp_path_factory.mktemp("members")
    _make_store(tmp, "demo")
    run_training(parse_config(_config(tmp, (1, 1))))
    return tmp


def _same_scores(mine: dict[tuple, float], theirs: dict[tuple, float]) -> None:
    assert mine.keys() == theirs.keys()
    assert {k[1] for k in mine} == {"rmse", "bias", "acc", *ENSEMBLE_METRICS}
    for key, value in theirs.items():
        assert math.isclose(mine[key], value, rel_tol=1e-6, abs_tol=1e-9), (key, mine[key], value)


def test_one_member_of_a_deterministic_model_is_its_forecast_and_crps_its_mae(
    run: Path, tmp_path: Path
) -> None:
    cfg = parse_config(_config(run, (1, 1)))
    plain, ens = tmp_path / "plain.zarr", tmp_path / "ens.zarr"
    run_prediction(cfg, plain, steps=3, **PERIOD)
    result = run_prediction(cfg, ens, steps=3, members=1, score=ScoreRequest(regions=("all",)), **PERIOD)
    a, b = xr.open_zarr(plain, chunks=None), xr.open_zarr(ens, chunks=None)
    assert b["geopotential"].dims == (
        "time",
        "prediction_timedelta",
        "number",
        "level",
        "latitude",
        "longitude",
    )
    assert b["2m_temperature"].dims == ("time", "prediction_timedelta", "number", "latitude", "longitude")
    assert list(b["number"].values) == [0] and result.members == 1
    for name in a.data_vars:
        np.testing.assert_array_equal(b[name].isel(number=0).values, a[name].values, err_msg=name)
    mine = _keyed(result.rows)
    _same_scores(mine, _score_rows(ens, run))
    for key, value in mine.items():
        if key[1] in ("crps_spread", "ensemble_stddev"):
            assert value == 0, key
        if key[1] == "crps":
            assert value == mine[(key[0], "crps_skill", *key[2:])], key  # WB2: CRPS = MAE


def test_members_of_a_deterministic_model_are_refused(run: Path, tmp_path: Path) -> None:
    cfg = parse_config(_config(run, (1, 1)))
    with pytest.raises(ValueError, match=r"--members 3: the model is deterministic \(model.noise_channels=0"):
        run_prediction(cfg, tmp_path / "fc.zarr", steps=2, members=3, **PERIOD)
    with pytest.raises(ValueError, match="--members 0: give at least 1"):
        run_prediction(cfg, tmp_path / "fc.zarr", steps=2, members=0, **PERIOD)
    assert not list(tmp_path.iterdir())


def test_predict_command_members_flag(run: Path, tmp_path: Path, capsys) -> None:
    import yaml

    from jigsaw_earth.cli import main

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(_config(run, (1, 1))))
    argv = ["predict", str(config), "training.steps=1000", "--start", PERIOD["start"], "--end", PERIOD["end"]]
    argv += [
        "--max-inits",
        "2",
        "--steps",
        "2",
        "--members",
        "1",
        "--score",
        "--out",
        str(tmp_path / "fc.zarr"),
    ]
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert (
        "2 inits × 1 member × 2 steps" in out and "an ensemble of 1 member:" in out and "spread/skill" in out
    )
    assert xr.open_zarr(tmp_path / "fc.zarr").sizes["number"] == 1
    assert main([*argv[:3], "--seed", "3", "--score"]) == 2
    assert "--seed 3 is the ensemble's noise seed; add --members N" in capsys.readouterr().err
