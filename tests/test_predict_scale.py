"""Forecast at benchmark scale: subset writes, scoring while forecasting, and their errors.

Two small stores: demo-like (12x24, cell-centred rows) and 1.5°-like (13x24: poles included, an odd
row count split unevenly over 2x2, latitude ascending in storage, as WB2's 1.5° ERA5). A tiny model
is trained once on each; ``predict --score`` must equal ``score`` of the written store to 1e-6 (RMSE,
ACC, bias, every region, with persistence and climatology) on 1x1 and 2x2.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr
from jigsaw_earth.data.synth import SynthConfig, climatology_path, synth_store

from jigsaw_earth.config import parse_config
from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.inference.predict import PredictRequest, run_prediction
from jigsaw_earth.inference.scoring import ScoreRequest
from jigsaw_earth.metrics.evaluate import evaluate, evaluate_statistics
from jigsaw_earth.metrics.statistics import Statistics
from jigsaw_earth.training import run_training

UPPER, LEVELS, SURFACE = (
    ("geopotential", "temperature", "u_component_of_wind"),
    (500, 700, 850),
    (
        "2m_temperature",
        "mean_sea_level_pressure",
    ),
)
PERIOD = {"first_init": "2020-01-11", "last_init": "2020-01-13", "max_inits": 3}


def _config(tmp: Path, mesh: tuple[int, int]) -> dict:
    return {
        "run": {"dir": str(tmp / "run"), "seed": 1},
        "mesh": {"data": 1, "lat": mesh[0], "lon": mesh[1]},
        "data": {
            "store": str(tmp / "data.zarr"),
            "upper_air": list(UPPER),
            "levels": list(LEVELS),
            "surface": list(SURFACE),
            "train_period": ["2020-01-01", "2020-01-10"],
            "val_period": ["2020-01-11", "2020-01-14"],
        },
        "model": {"name": "weathermixer", "preset": "tiny", "overrides": {"patch": 1}},
        "training": {"steps": 2, "batch_size": 2},
        "validation": {"lead_hours": [6], "max_samples": 1, "variables": ["geopotential@500"]},
        "checkpoint": {"every": 0, "resume": "auto"},
        "logging": {"progress": False, "wandb": {"mode": "disabled"}},
    }


def _make_store(tmp: Path, kind: str) -> None:
    n_lat = 12 if kind == "demo" else 13
    cfg = SynthConfig(n_lat=n_lat, n_lon=24, start="2020-01-01", end="2020-01-16", levels=LEVELS,
                      upper_air=UPPER, surface=SURFACE)  # fmt: skip
    synth_store(tmp / "data.zarr", cfg)
    if kind == "wb2":  # WB2's 1.5° grid: rows at the poles, ascending in storage
        lat = np.linspace(-90.0, 90.0, n_lat)
        for store in (tmp / "data.zarr", climatology_path(tmp / "data.zarr")):
            zarr.open_array(store / "latitude", mode="r+")[:] = lat
        stats = zarr.open_group(tmp / "data.zarr" / "statistics", mode="r+")
        stats.attrs["lat_range"] = [90.0, -90.0]


def train_tiny(tmp: Path, kind: str = "demo") -> Path:
    """A deterministic tiny model trained on the ``kind`` store (``_make_store``), both under ``tmp``."""
    _make_store(tmp, kind)
    run_training(parse_config(_config(tmp, (1, 1))))
    return tmp


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {kind: train_tiny(tmp_path_factory.mktemp(kind), kind) for kind in ("demo", "wb2")}


def _score_rows(store: Path, tmp: Path) -> dict[tuple, float]:
    fc = xr.open_zarr(store, chunks=None)
    truth = xr.open_zarr(tmp / "data.zarr", chunks=None)
    clim = xr.open_zarr(climatology_path(tmp / "data.zarr"), chunks=None)
    return _keyed(evaluate(fc, truth, clim, regions=["all"]))


def _keyed(rows: list[dict]) -> dict[tuple, float]:
    keys = ("model", "metric", "region", "variable", "level", "lead_hours")
    return {tuple(r[k] for k in keys): r["value"] for r in rows}


def _assert_same_scores(mine: dict[tuple, float], theirs: dict[tuple, float]) -> None:
    assert mine.keys() == theirs.keys()
    assert {k[1] for k in mine} == {"rmse", "mse", "bias", "acc"}
    assert {k[0] for k in mine} == {"forecast", "persistence", "climatology"}
    assert len({k[2] for k in mine}) > 5, "several regions"
    for key, value in theirs.items():
        assert math.isclose(mine[key], value, rel_tol=1e-6, abs_tol=1e-9), (key, mine[key], value)


# ---------------------------------------------------------------- subset writes
def test_subset_write_holds_exactly_the_selection(runs: dict[str, Path], tmp_path: Path, capsys) -> None:
    from jigsaw_earth.cli import main

    tmp = runs["demo"]
    cfg = parse_config(_config(tmp, (1, 1)))
    full, sub = tmp_path / "full.zarr", tmp_path / "sub.zarr"
    run_prediction(cfg, PredictRequest(out=full, steps=8, **PERIOD))
    run_prediction(
        cfg,
        PredictRequest(
            out=sub,
            steps=8,
            lead_every=4,
            variables=["geopotential", "temperature", "t2m"],
            levels=[850, 500],
            **PERIOD,
        ),
    )
    a, b = xr.open_zarr(full, chunks=None), xr.open_zarr(sub, chunks=None)
    assert sorted(b.data_vars) == ["2m_temperature", "geopotential", "temperature"]
    assert list(b.level.values) == [500, 850]
    assert list(b.prediction_timedelta.values // np.timedelta64(1, "h")) == [24, 48]
    assert b["geopotential"].dims == ("time", "prediction_timedelta", "level", "latitude", "longitude")
    want = a.sel(prediction_timedelta=b.prediction_timedelta, level=b.level)
    for name in b.data_vars:
        np.testing.assert_array_equal(b[name].values, want[name].values, err_msg=name)
    argv = [
        str(sub),
        "--truth",
        str(tmp / "data.zarr"),
        "--climatology",
        str(climatology_path(tmp / "data.zarr")),
    ]
    assert main(["score", *argv, "--out", str(tmp_path / "s")]) == 0, capsys.readouterr().err
    rows = __import__("json").loads((tmp_path / "s.json").read_text())["scores"]
    assert {(r["variable"], r["level"]) for r in rows} == {
        ("geopotential", 500), ("geopotential", 850), ("temperature", 500), ("temperature", 850),
        ("2m_temperature", None),
    }  # fmt: skip
    assert {r["lead_hours"] for r in rows} == {24.0, 48.0}


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"variables": ["geopotental"]}, "did you mean 'geopotential'"),
        ({"levels": [300]}, r"--levels \[300\] not predicted by this model; it has levels \[500, 700, 850\]"),
        ({"lead_hours": [6, 9]}, r"--lead-hours \[9\]: every lead must be a positive multiple"),
        ({"steps": 2, "lead_hours": [24]}, "beyond --steps 2"),
        ({"steps": 4, "lead_every": 5}, "--lead-every 5: must be between 1 and --steps 4"),
        ({"lead_every": 2, "lead_hours": [12]}, "not both"),
        ({"variables": ["2m_temperature"], "levels": [500]}, "none of the variables"),
    ],
)
def test_bad_selection_is_refused_before_anything_is_written(
    runs: dict[str, Path], tmp_path: Path, options: dict, fragment: str
) -> None:
    cfg = parse_config(_config(runs["demo"], (1, 1)))
    with pytest.raises(ValueError, match=fragment):
        run_prediction(cfg, PredictRequest(out=tmp_path / "fc.zarr", **PERIOD, **options))
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------- predict --score equals score
@pytest.mark.parametrize("kind", ["demo", "wb2"])
def test_predict_score_equals_score_of_the_written_store(
    runs: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    tmp = runs[kind]
    cfg = parse_config(_config(tmp, (1, 1)))
    store = tmp_path / "fc.zarr"
    result = run_prediction(
        cfg, PredictRequest(out=store, steps=3, score=ScoreRequest(regions=("all",)), **PERIOD)
    )
    _assert_same_scores(_keyed(result.rows), _score_rows(store, tmp))
    _assert_same_statistics(result.statistics, store, tmp)
    assert all(np.isfinite(r["se"]) for r in result.rows if r["metric"] == "rmse"), "intervals (ar2)"
    if kind == "wb2":
        assert xr.open_zarr(store).sizes["latitude"] == 13


def test_score_only_writes_nothing(runs: dict[str, Path], tmp_path: Path) -> None:
    cfg = parse_config(_config(runs["demo"], (1, 1)))
    before = sorted(p.name for p in runs["demo"].iterdir())
    result = run_prediction(
        cfg,
        PredictRequest(
            steps=2, lead_hours=[12], variables=["z"], levels=[500], score=ScoreRequest(), **PERIOD
        ),
    )
    assert result.path is None and {r["variable"] for r in result.rows} == {"geopotential"}
    assert {(r["level"], r["lead_hours"], r["region"]) for r in result.rows} == {(500, 12.0, "global")}
    assert sorted(p.name for p in runs["demo"].iterdir()) == before and not list(tmp_path.iterdir())


def _assert_same_statistics(stats, store: Path, tmp: Path) -> None:
    """``predict --score``'s per-init statistics equal ``score``'s of the written store (1e-6)."""
    fc = xr.open_zarr(store, chunks=None)
    truth = xr.open_zarr(tmp / "data.zarr", chunks=None)
    clim = xr.open_zarr(climatology_path(tmp / "data.zarr"), chunks=None)
    want = evaluate_statistics(fc, truth, clim, regions=["all"]).ds
    np.testing.assert_array_equal(stats.times, want.time.values)
    assert sorted(stats.ds.field.values) == sorted(want.field.values)
    assert sorted(stats.ds.region.values) == sorted(want.region.values)
    want = want.sel(field=stats.ds.field, region=stats.ds.region)  # the same cells, in predict's order
    assert sorted(stats.ds.data_vars) == sorted(want.data_vars)
    for name in want.data_vars:
        np.testing.assert_allclose(
            stats.ds[name].values, want[name].values, rtol=1e-6, atol=1e-9, err_msg=name
        )


def _score_on_data_axis(mesh: DomainMesh, raw: dict, store: str) -> str:
    """Each rank writes the statistics it holds (a file per rank); returns its path."""
    score = ScoreRequest(regions=("all",))
    result = run_prediction(
        parse_config(raw),
        PredictRequest(
            out=store, steps=2, score=score, first_init="2020-01-11", last_init="2020-01-13T12", max_inits=5
        ),
        mesh,
    )
    return str(result.statistics.write(Path(store).with_name(f"rank-{mesh.rank}-stats.nc")))


def test_predict_score_statistics_over_two_data_replicas(runs: dict[str, Path], tmp_path: Path) -> None:
    """Two data replicas forecast 3 and 2 of 5 inits; every rank holds every init's statistics, each
    where ``score`` of the written store has it."""
    raw = _config(runs["demo"], (1, 1))
    raw["mesh"]["data"] = 2
    store = tmp_path / "fc.zarr"
    per_rank = [Statistics.read(p) for p in spawn(MeshShape(2, 1, 1), _score_on_data_axis, raw, str(store))]
    assert len(per_rank) == 2 and per_rank[0].times.size == 5
    for stats in per_rank:
        _assert_same_statistics(stats, store, runs["demo"])


def _score_on_mesh(mesh: DomainMesh, cases: list[tuple[dict, str]]) -> list[list[dict]]:
    out = []
    for raw, store in cases:
        cfg = parse_config(raw)
        result = run_prediction(
            cfg, PredictRequest(out=store, steps=3, score=ScoreRequest(regions=("all",)), **PERIOD), mesh
        )
        out.append(result.rows)
    return out


@pytest.mark.slow
def test_predict_score_on_a_2x2_mesh_equals_score(runs: dict[str, Path], tmp_path: Path) -> None:
    """One 2x2 process group scores both stores (the 1.5°-like one split 7/6 rows) and writes them."""
    cases = [(_config(runs[k], (2, 2)), str(tmp_path / f"{k}.zarr")) for k in ("demo", "wb2")]
    per_rank = spawn(MeshShape(1, 2, 2), _score_on_mesh, cases)
    for (_, store), kind, rows in zip(cases, ("demo", "wb2"), per_rank[0]):
        _assert_same_scores(_keyed(rows), _score_rows(Path(store), runs[kind]))
    assert all(r == per_rank[0] for r in per_rank), "every rank returns the same scores"
