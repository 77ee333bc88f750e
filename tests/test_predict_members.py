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
from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.inference.predict import PredictRequest, run_prediction
from jigsaw_earth.inference.scoring import ScoreRequest
from jigsaw_earth.metrics.ensemble import ENSEMBLE_METRICS
from jigsaw_earth.training import run_training
from tests.test_predict_scale import PERIOD, _config, _keyed, _score_rows, train_tiny


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A deterministic tiny model trained on the demo-like store."""
    return train_tiny(tmp_path_factory.mktemp("members"))


def _same_scores(mine: dict[tuple, float], theirs: dict[tuple, float]) -> None:
    assert mine.keys() == theirs.keys()
    assert {k[1] for k in mine} == {"rmse", "mse", "bias", "acc", *ENSEMBLE_METRICS}
    for key, value in theirs.items():
        assert math.isclose(mine[key], value, rel_tol=1e-6, abs_tol=1e-9), (key, mine[key], value)


def test_one_member_of_a_deterministic_model_is_its_forecast_and_crps_its_mae(
    run: Path, tmp_path: Path
) -> None:
    cfg = parse_config(_config(run, (1, 1)))
    plain, ens = tmp_path / "plain.zarr", tmp_path / "ens.zarr"
    run_prediction(cfg, PredictRequest(out=plain, steps=3, **PERIOD))
    result = run_prediction(
        cfg, PredictRequest(out=ens, steps=3, members=1, score=ScoreRequest(regions=("all",)), **PERIOD)
    )
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
        run_prediction(cfg, PredictRequest(out=tmp_path / "fc.zarr", steps=2, members=3, **PERIOD))
    with pytest.raises(ValueError, match="--members 0: give at least 1"):
        run_prediction(cfg, PredictRequest(out=tmp_path / "fc.zarr", steps=2, members=0, **PERIOD))
    assert not list(tmp_path.iterdir())


def test_predict_command_members_flag(run: Path, tmp_path: Path, capsys) -> None:
    import yaml

    from jigsaw_earth.cli import main

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(_config(run, (1, 1))))
    argv = [
        "predict",
        str(config),
        "training.steps=1000",
        "--start",
        PERIOD["first_init"],
        "--end",
        PERIOD["last_init"],
    ]
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


# ---------------------------------------------------------------- a stochastic model's ensemble
STOCHASTIC = {"model_noise": 2, "members": 2}


def _stochastic_config(tmp: Path, ensemble: int = 1, lat_lon: tuple[int, int] = (1, 1)) -> dict:
    raw = _config(tmp, lat_lon)
    raw["run"]["dir"] = str(tmp / "run-ens")
    raw["mesh"]["ensemble"] = ensemble
    raw["model"]["noise_channels"] = STOCHASTIC["model_noise"]
    raw["training"]["members"] = STOCHASTIC["members"]
    raw["loss"] = {"kind": "fair_crps"}
    return raw


@pytest.fixture(scope="module")
def stochastic(run: Path) -> Path:
    """A tiny stochastic model (2 noise channels) trained with fair CRPS on the same store."""
    run_training(parse_config(_stochastic_config(run)))
    return run


def test_ensemble_store_members_and_scores(stochastic: Path, tmp_path: Path) -> None:
    cfg = parse_config(_stochastic_config(stochastic))
    three, two, one_by_one = tmp_path / "three.zarr", tmp_path / "two.zarr", tmp_path / "b1.zarr"
    score = ScoreRequest(regions=("all",))
    result = run_prediction(cfg, PredictRequest(out=three, steps=3, members=3, score=score, **PERIOD))
    run_prediction(cfg, PredictRequest(out=two, steps=3, members=2, **PERIOD))
    run_prediction(cfg, PredictRequest(out=one_by_one, steps=3, members=3, batch_size=1, **PERIOD))
    a, b, c = (xr.open_zarr(p, chunks=None) for p in (three, two, one_by_one))
    assert list(a["number"].values) == [0, 1, 2] and not np.isnan(a["geopotential"].values).any()
    z = a["geopotential"].values  # members differ, at every lead
    assert all(np.abs(z[:, lead, 0] - z[:, lead, 1]).max() > 0 for lead in range(3))
    for name in a.data_vars:  # a member is the same whatever the ensemble size or the batch
        np.testing.assert_array_equal(b[name].values, a[name].isel(number=[0, 1]).values, err_msg=name)
        np.testing.assert_array_equal(c[name].values, a[name].values, err_msg=name)
    _same_scores(_keyed(result.rows), _score_rows(three, stochastic))
    other = run_prediction(
        cfg, PredictRequest(out=tmp_path / "seed.zarr", steps=1, members=2, seed=7, **PERIOD)
    )
    d = xr.open_zarr(other.path, chunks=None)
    assert (
        np.abs(d["geopotential"].values - b["geopotential"].isel(prediction_timedelta=[0]).values).max() > 0
    )


def test_a_stochastic_model_or_an_ensemble_mesh_needs_members_that_split(
    stochastic: Path, tmp_path: Path
) -> None:
    cfg = parse_config(_stochastic_config(stochastic, ensemble=2))
    with pytest.raises(ValueError, match=r"mesh.ensemble=2 spreads ensemble members .* give --members N"):
        run_prediction(cfg, PredictRequest(out=tmp_path / "fc.zarr", steps=1, **PERIOD))
    with pytest.raises(ValueError, match=r"--members 3 must split evenly over mesh.ensemble=2 groups"):
        run_prediction(cfg, PredictRequest(out=tmp_path / "fc.zarr", steps=1, members=3, **PERIOD))
    with pytest.raises(ValueError, match=r"model.noise_channels=2: a stochastic model's forecasts are"):
        run_prediction(
            parse_config(_stochastic_config(stochastic)),
            PredictRequest(out=tmp_path / "fc.zarr", steps=1, **PERIOD),
        )
    assert not list(tmp_path.iterdir())


def _predict_members_on_mesh(mesh: DomainMesh, raw: dict, out: str) -> list[dict]:
    cfg = parse_config(raw)
    result = run_prediction(
        cfg, PredictRequest(out=out, steps=2, members=4, score=ScoreRequest(regions=("all",)), **PERIOD), mesh
    )
    return result.rows


@pytest.mark.parametrize("lat_lon", [(1, 1), pytest.param((1, 2), marks=pytest.mark.slow)])
def test_members_over_the_ensemble_axis_equal_batched(
    stochastic: Path, tmp_path: Path, lat_lon: tuple[int, int]
) -> None:
    """Members split over ensemble=2 groups (each 1×1, or 1×2) give the store of all members batched
    on one rank, and every rank scores the whole ensemble as ``score`` scores the written store."""
    cfg = parse_config(_stochastic_config(stochastic))
    serial = tmp_path / "serial.zarr"
    run_prediction(cfg, PredictRequest(out=serial, steps=2, members=4, **PERIOD))
    raw, store = _stochastic_config(stochastic, 2, lat_lon), tmp_path / "mesh.zarr"
    per_rank = spawn(MeshShape(1, *lat_lon, ensemble=2), _predict_members_on_mesh, raw, str(store))
    a, b = xr.open_zarr(serial, chunks=None), xr.open_zarr(store, chunks=None)
    for name in a.data_vars:
        x, y = a[name].values, b[name].values
        assert np.abs(x - y).max() <= 1e-5 * np.abs(x).max(), name
    theirs = _score_rows(store, stochastic)
    for mine in per_rank:
        _same_scores(_keyed(mine), theirs)


def test_further_members_join_into_the_ensemble_and_repeats_are_refused(
    stochastic: Path, tmp_path: Path, capsys
) -> None:
    """``--first-member 2`` draws members 2 and 3 of the ensemble whose members 0 and 1 a first run
    drew: joined, they are the 4-member run. Joining the first run with itself (a second run that
    forgot ``--first-member``) is refused by ``score``, by member number or, renumbered, by value."""
    from jigsaw_earth.cli import main

    cfg = parse_config(_stochastic_config(stochastic))
    four, first, more = tmp_path / "four.zarr", tmp_path / "a.zarr", tmp_path / "b.zarr"
    run_prediction(cfg, PredictRequest(out=four, steps=2, members=4, **PERIOD))
    run_prediction(cfg, PredictRequest(out=first, steps=2, members=2, **PERIOD))
    run_prediction(cfg, PredictRequest(out=more, steps=2, members=2, first_member=2, **PERIOD))
    a, b, c = (xr.open_zarr(p, chunks=None) for p in (four, first, more))
    assert list(c["number"].values) == [2, 3]
    joined = xr.concat([b, c], "number")
    for name in a.data_vars:
        np.testing.assert_array_equal(joined[name].values, a[name].values, err_msg=name)
    twice = xr.concat([b, b], "number").load()
    renumbered = twice.assign_coords(number=[0, 1, 2, 3])
    truth = _stochastic_config(stochastic)["data"]["store"]
    cases = [("twice", twice, "forecast members [0, 1] appear 2 times"),
             ("renumbered", renumbered, "forecast members 0 and 2 are identical")]  # fmt: skip
    for name, ds, words in cases:
        for v in ds.variables.values():
            v.encoding = {}
        ds.to_zarr(tmp_path / f"{name}.zarr", zarr_format=3, consolidated=False)
        code = main(
            ["score", str(tmp_path / f"{name}.zarr"), "--truth", truth, "--out", str(tmp_path / name)]
        )
        err = capsys.readouterr().err
        assert code == 2 and words in err and "--first-member K" in err, err
        assert not (tmp_path / f"{name}.json").exists()
    with pytest.raises(ValueError, match=r"--first-member -1: member numbers start at 0"):
        run_prediction(
            cfg, PredictRequest(out=tmp_path / "x.zarr", steps=1, members=2, first_member=-1, **PERIOD)
        )
