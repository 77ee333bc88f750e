"""``predict --members N --perturb SCHEME`` of a deterministic model: every scheme's members are the
same on 1 rank, 1×4 and 2×2 (each member's perturbation a function of seed, member, init and global grid
index only) — their initial states (default run) and their forecasts through ``predict`` (slow) — and
± pairs, the control member and ``--first-member`` are what they say."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
from jigsaw_earth.data.sources import build_data
from jigsaw_earth.models.run import build_run_model

from jigsaw_earth.config import parse_config
from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.inference.members import Members
from jigsaw_earth.inference.perturb import Perturbation
from jigsaw_earth.inference.predict import PredictRequest, _perturber, run_prediction, select_inits
from tests.test_predict_scale import PERIOD, _config, _make_store, train_tiny

#: every scheme, with the options that change its fields (pairs and the control where it has them)
SCHEMES = {
    "gaussian": Perturbation("gaussian", 2.0, pairs=True, control=True),
    "correlated": Perturbation("correlated", 0.2, pairs=True, scale="std", length_scale_km=2000.0),
    "bred": Perturbation("bred", 4.0, control=True, bred_cycles=2),
    "lagged": Perturbation("lagged", 1.0, lag_hours=12),
}
MEMBERS = {"gaussian": 5, "correlated": 4, "bred": 3, "lagged": 3}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A deterministic tiny model trained on the demo-like 12 × 24 store."""
    return train_tiny(tmp_path_factory.mktemp("perturb"))


@torch.no_grad()
def _initial_states(mesh: DomainMesh, raw: dict) -> dict:
    """This rank's tile and every scheme's perturbed initial states ``(members · inits, C, h, w)`` there,
    from a model initialised by seed (the same weights on every mesh)."""
    cfg = parse_config(raw)
    data = build_data(cfg, mesh, training=False)
    model = build_run_model(cfg, mesh, data).eval()
    tendency = data.tendency_std if cfg.loss.tendency_scaling else None
    inits = select_inits(data, PERIOD["first_init"], PERIOD["last_init"], 1, 12, PERIOD["max_inits"])
    inputs = data._batch(inits, 0).inputs
    out = {
        "tile": list(data.tile.slices[0].indices(10**6)[:2]) + list(data.tile.slices[1].indices(10**6)[:2])
    }
    for name, p in SCHEMES.items():
        ens = Members.plan(cfg, mesh, MEMBERS[name], None, 0, perturbed=True)
        perturber = _perturber(p.with_defaults(cfg.data.step_hours), ens, data, model, False, tendency)
        out[name] = perturber.apply(ens.expand(inputs), inits, data.times[inits]).tolist()
    return out


def _assembled(ranks: list[dict], name: str) -> np.ndarray:
    tiles = [(r["tile"], np.asarray(r[name])) for r in ranks]
    n_lat, n_lon = max(t[0][1] for t in tiles), max(t[0][3] for t in tiles)
    full = np.full((*tiles[0][1].shape[:2], n_lat, n_lon), np.nan)
    for (r0, r1, c0, c1), x in tiles:
        full[..., r0:r1, c0:c1] = x
    return full


@pytest.mark.slow
def test_every_scheme_perturbs_the_same_on_every_mesh(tmp_path: Path) -> None:
    """The members' initial states (each scheme, pairs and control included) on 1×4 and 2×2 equal the
    serial ones within 1e-6 of their size, and the perturbations within 1e-5 of theirs."""
    _make_store(tmp_path, "demo")
    serial = spawn(MeshShape(), _initial_states, _config(tmp_path, (1, 1)))
    unperturbed = _assembled(serial, "gaussian")[:3]  # member 0: the control
    for lat_lon in ((1, 4), (2, 2)):
        ranks = spawn(MeshShape(1, *lat_lon), _initial_states, _config(tmp_path, lat_lon))
        for name in SCHEMES:
            x, y = _assembled(serial, name), _assembled(ranks, name)
            assert not np.isnan(y).any()
            assert np.abs(x - y).max() <= 1e-6 * np.abs(x).max(), (name, lat_lon)
            dx, dy = (
                x - np.tile(unperturbed, (MEMBERS[name], 1, 1, 1)),
                y - np.tile(unperturbed, (MEMBERS[name], 1, 1, 1)),
            )
            assert np.abs(dx).max() > 0.01, name
            assert np.abs(dx - dy).max() <= 1e-5 * np.abs(dx).max(), (name, lat_lon, np.abs(dx - dy).max())


def _every_scheme(mesh: DomainMesh | None, raw: dict, folder: str) -> list[str]:
    cfg = parse_config(raw)
    for name, p in SCHEMES.items():
        run_prediction(
            cfg,
            PredictRequest(
                out=Path(folder) / f"{name}.zarr",
                steps=2,
                members=MEMBERS[name],
                perturb=p.with_defaults(cfg.data.step_hours),
                **PERIOD,
            ),
            mesh,
        )
    return list(SCHEMES)


def _open(path: Path) -> xr.Dataset:
    return xr.open_zarr(path, chunks=None)


@pytest.mark.slow
def test_every_scheme_gives_the_same_forecast_on_every_mesh(run: Path, tmp_path: Path) -> None:
    serial = tmp_path / "1x1"
    serial.mkdir()
    _every_scheme(None, _config(run, (1, 1)), str(serial))
    for lat_lon in ((1, 4), (2, 2)):
        folder = tmp_path / f"{lat_lon[0]}x{lat_lon[1]}"
        folder.mkdir()
        spawn(MeshShape(1, *lat_lon), _every_scheme, _config(run, lat_lon), str(folder))
        for name in SCHEMES:
            a, b = _open(serial / f"{name}.zarr"), _open(folder / f"{name}.zarr")
            for var in a.data_vars:
                x, y = a[var].values, b[var].values
                scale = np.abs(x).max()
                assert np.abs(x - y).max() <= 1e-6 * scale, (name, lat_lon, var, np.abs(x - y).max() / scale)
                # the members' differences themselves (what the perturbation made) agree closely too
                dx, dy = x - x.mean(axis=2, keepdims=True), y - y.mean(axis=2, keepdims=True)
                assert np.abs(dx - dy).max() <= 1e-3 * np.abs(dx).max(), (name, lat_lon, var)


def test_pairs_control_further_members_and_the_paired_crps(run: Path, tmp_path: Path, capsys) -> None:
    """Member 0 is the unperturbed forecast with ``--control``; a ± pair's perturbations are opposite (so
    their first steps nearly so); ``--first-member`` draws the same members as one larger run. ``score``
    compares the ensemble's CRPS with the deterministic forecast's, which it scores as one member: its
    MAE, paired on the inits."""
    from jigsaw_earth.cli import main
    from jigsaw_earth.sphere import latitude_weights

    cfg = parse_config(_config(run, (1, 1)))
    plain, five = tmp_path / "plain.zarr", tmp_path / "five.zarr"
    run_prediction(cfg, PredictRequest(out=plain, steps=1, **PERIOD))
    p = Perturbation("gaussian", 0.01, pairs=True, control=True, scale="std").with_defaults(6)
    run_prediction(cfg, PredictRequest(out=five, steps=1, members=5, perturb=p, **PERIOD))
    more = tmp_path / "more.zarr"
    run_prediction(cfg, PredictRequest(out=more, steps=1, members=2, first_member=3, perturb=p, **PERIOD))
    a, b, c = _open(plain), _open(five), _open(more)
    assert list(c["number"].values) == [3, 4]
    for var in a.data_vars:
        np.testing.assert_array_equal(b[var].isel(number=0).values, a[var].values, err_msg=var)
        np.testing.assert_array_equal(c[var].values, b[var].isel(number=[3, 4]).values, err_msg=var)
    z = b["geopotential"].values[:, 0]  # (time, number, level, lat, lon) at 6 h
    plus, minus = z[:, 1] - z[:, 0], z[:, 2] - z[:, 0]
    assert np.abs(plus).max() > 0 and np.abs(z[:, 3] - z[:, 1]).max() > 0  # two different draws
    assert np.abs(plus + minus).max() < 0.05 * np.abs(plus).max(), np.abs(plus + minus).max()

    truth = run / "data.zarr"
    assert (
        main(
            ["score", str(five), "--truth", str(truth), "--against", str(plain), "--out", str(tmp_path / "s")]
        )
        == 0
    )
    assert "forecast against plain" in capsys.readouterr().out
    rows = json.loads((tmp_path / "s.json").read_text())
    crps = {(r["variable"], r["level"]): r for r in rows["comparisons"] if r["metric"] == "crps"}
    mine = {(r["variable"], r["level"]): r["value"] for r in rows["scores"]
            if r["metric"] == "crps" and r["model"] == "forecast" and r["region"] == "global"}  # fmt: skip
    row = crps[("geopotential", 500)]
    assert row["against"] == "plain" and row["lower"] <= row["value"] <= row["upper"]
    t = xr.open_zarr(truth, chunks=None)["geopotential"].sel(level=500)
    fc = a["geopotential"].sel(level=500).isel(prediction_timedelta=0)
    valid = fc["time"].values + fc["prediction_timedelta"].values
    w = latitude_weights(fc["latitude"].values)[:, None]
    mae = np.mean([(np.abs(fc.values[i] - t.sel(time=v).values) * w).mean() for i, v in enumerate(valid)])
    assert math.isclose(row["value"], mine[("geopotential", 500)] - mae, rel_tol=1e-5), (row["value"], mae)


def _write_config(run: Path, tmp_path: Path) -> Path:
    import yaml

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(_config(run, (1, 1))))
    return config


def _predict_argv(config: Path, out: Path, *extra: str, period: bool = True) -> list[str]:
    argv = ["predict", str(config), "training.steps=1000", "--steps", "1", "--out", str(out)]
    if period:
        argv += ["--first-init", PERIOD["first_init"], "--last-init", PERIOD["last_init"], "--max-inits", "2"]
    return argv + list(extra)


LAGGED = ["--members", "4", "--perturb", "lagged"]
BAD = [
    (["--members", "4", "--perturb", "gaussian", "--amplitude", "-0.1"], "--amplitude -0.1: must be"),
    ([*LAGGED, "--first-init", "2020-01-01T00", "--last-init", "2020-01-01T06"],
     "member 1 is the forecast from 1 × 6 h before init 2020-01-01T00"),
    ([*LAGGED, "--first-member", "60"], "member 60 is the forecast from 60 × 6 h before init 2020-01-11T00"),
    (["--members", "3", "--first-member", "1", "--perturb", "correlated", "--pairs"],
     "--pairs: perturbed members come in ± pairs from member 0; --members 3 --first-member 1 would split"),
    (["--members", "2", "--perturb", "bred", "--init", "analysis.nc"], "--perturb bred makes its members"),
    (["--members", "3"], "or perturb their initial states (--perturb gaussian|correlated|bred|lagged"),
    (["--members", "2", "--amplitude", "0.1"], "--amplitude is a setting of --perturb; add --perturb"),
    (["--perturb", "gaussian"], "--perturb gaussian perturbs an ensemble's members; add --members N"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "words"), BAD)
def test_bad_requests_get_one_line_and_write_nothing(run: Path, tmp_path: Path, capsys, extra, words) -> None:
    from jigsaw_earth.cli import main

    out = tmp_path / "fc.zarr"
    argv = _predict_argv(_write_config(run, tmp_path), out, *extra, period="--init" not in extra)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not list(tmp_path.glob("fc.zarr*"))


def test_calibrate_writes_the_settings_predict_reads(run: Path, tmp_path: Path, capsys) -> None:
    """``ensemble calibrate`` sweeps, refines around the best amplitude, prints the table and writes the
    choice; ``predict --perturb`` with those settings is the forecast with that ``--amplitude``."""
    from jigsaw_earth.cli import main
    from jigsaw_earth.inference.perturb import resolve

    config, settings = _write_config(run, tmp_path), tmp_path / "gaussian.json"
    argv = ["ensemble", "calibrate", str(config), "training.steps=1000", "--perturb", "gaussian", "--pairs",
            "--members", "2", "--lead-hours", "6", "--amplitudes", "0.02", "0.2",
            "--fields", "geopotential@500", "temperature@850", "--first-init", PERIOD["first_init"],
            "--last-init", PERIOD["last_init"], "--max-inits", "3", "--out", str(settings)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    chosen = json.loads(settings.read_text())
    assert chosen["scheme"] == "gaussian" and chosen["pairs"] is True
    amplitudes = [r["amplitude"] for r in chosen["calibration"]["table"]]
    assert len(amplitudes) >= 3 and any(math.isclose(a, math.sqrt(0.02 * 0.2)) for a in amplitudes)
    assert "geopotential@500 spread/skill" in out and "<- chosen" in out and f"wrote {settings}" in out
    best = min(chosen["calibration"]["table"], key=lambda r: r["objective"])
    assert chosen["amplitude"] == best["amplitude"]
    a, b = tmp_path / "a.zarr", tmp_path / "b.zarr"
    common = ["--members", "2", "--perturb", "gaussian"]
    assert main(_predict_argv(config, a, *common, "--perturb-settings", str(settings))) == 0
    assert main(_predict_argv(config, b, *common, "--pairs", "--amplitude", str(chosen["amplitude"]))) == 0
    np.testing.assert_array_equal(_open(a)["geopotential"].values, _open(b)["geopotential"].values)
    # a calibration in the run directory is predict's default for that scheme
    cfg = parse_config({**_config(run, (1, 1)), "run": {"dir": str(tmp_path), "seed": 1}})
    (tmp_path / "perturb-gaussian.json").write_text(settings.read_text())
    assert resolve(cfg, "gaussian", {}).amplitude == chosen["amplitude"]
    assert resolve(cfg, "gaussian", {"amplitude": 0.5}).amplitude == 0.5


def test_a_lagged_member_is_the_earlier_forecast_valid_at_the_same_time(run: Path, tmp_path: Path) -> None:
    """Lagged member 1 (lag 6 h, amplitude 1) of the init at 00 UTC, at 6 h, is the deterministic forecast
    from 18 UTC the day before at 12 h: the earlier forecast, valid at the same times."""
    cfg = parse_config(_config(run, (1, 1)))
    earlier, lagged = tmp_path / "earlier.zarr", tmp_path / "lagged.zarr"
    run_prediction(
        cfg,
        PredictRequest(
            out=earlier, steps=2, first_init="2020-01-10T18", last_init="2020-01-10T18", every_hours=6
        ),
    )
    p = Perturbation("lagged", 1.0).with_defaults(6)
    run_prediction(
        cfg,
        PredictRequest(
            out=lagged, steps=1, members=2, perturb=p, first_init="2020-01-11T00", last_init="2020-01-11T00"
        ),
    )
    a, b = _open(earlier), _open(lagged)
    for var in a.data_vars:
        x, y = (
            a[var].isel(prediction_timedelta=1).values,
            b[var].isel(number=1, prediction_timedelta=0).values,
        )
        np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-5 * np.abs(x).max(), err_msg=var)
