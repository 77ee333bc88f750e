"""Models, data and ensembles that cannot work (issue 38), through the real command line.

* ``validate --model`` on models of ``tests/byo_models.py``: a parameter drawn outside the seeded
  init fails on every mesh naming it (its serial reference does not reproduce itself); an inline
  ``torch.mean`` / ``torch.roll`` in ``predict`` is named as the op that diverges, with why;
* the model contract (signature, output shape, a parameter made in ``forward``): one line from
  ``validate --model`` and from ``train``, before ``train`` writes anything;
* NaNs in a source: ``data prepare`` refuses (or fills, ``--nans fill``) before writing;
  ``config validate`` reports them per variable;
* losses and ensembles that cannot learn: refused by ``config validate`` and ``train`` with the fix,
  or warned; ``--first-member`` without an ensemble;
* ``plan --evaluate --members`` sizes the ensemble; ``predict`` refuses a store its filesystem cannot
  hold and logs its size and progress.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr

from . import test_bad_inputs as base
from .test_bad_inputs import P, _assert_clean_error, _cli, _config_for, _refused_cleanly, _snapshot

store, finished_run, run_copy, world = base.store, base.finished_run, base.run_copy, base.world

BYO = "tests.byo_models"


def _validate(model: str, *meshes: str) -> list[str]:
    return ["validate", "--model", f"{BYO}:{model}", *(a for m in meshes for a in ("--mesh", m))]


# ---------------------------------------------------------------- the validator on users' models
def test_a_model_that_does_not_reproduce_itself_fails_on_every_mesh(capsys: Any) -> None:
    """``self.bias2 = nn.Parameter(torch.randn(...) * 0.01)``: each build draws another bias, so the
    float64 reference is another model; no mesh may pass, and the reason names ``bias2``."""
    code, out = _cli(_validate("RandomInit", "1x1", "1x2"), capsys)
    assert code == 1, out
    assert "0 passed, 2 failed" in out, out
    why = [ln for ln in out.splitlines() if ln.startswith("  why: ")]
    assert len(why) == 2, out
    for line in why:
        assert "the serial reference does not reproduce itself: parameter 'model.bias2' differs" in line
        assert "drawn outside the seeded initialisation" in line


@pytest.mark.parametrize(
    ("model", "op", "reason"),
    [
        ("InlineMean", "torch.mean", "it reduces over this rank's tile only"),
        ("InlineRoll", "torch.roll", "it reads neighbours across the tile's edge"),
    ],
)
def test_an_inline_tile_local_op_is_named(model: str, op: str, reason: str, capsys: Any) -> None:
    code, out = _cli(_validate(model, "1x2"), capsys)
    assert code == 1, out
    line = next((ln for ln in out.splitlines() if "the first value that diverges" in ln), "")
    assert f"is op {op} at tests/byo_models.py:" in line, out
    assert f"in {model}.predict (in the model's own forward)" in line and reason in line, line
    assert "'norm' (LayerNorm)" not in out  # not blamed on the next jigsaw layer


CONTRACT_CASES = [
    ("ParamInForward", ["parameter 'late' was created in forward, not in __init__", "create it in __init__"]),
    ("WrongSignature", ["WrongSignature.forward(x", "cannot be called as forward(state, static, time)"]),
    ("WrongShape", ["forward returned shape", "(B, n_state=5, h, w)"]),
]


@pytest.mark.parametrize(("model", "fragments"), CONTRACT_CASES, ids=[c[0] for c in CONTRACT_CASES])
def test_the_model_contract_is_one_line(
    model: str, fragments: list[str], store: Path, tmp_path: Path, capsys: Any
) -> None:
    code, out = _cli(_validate(model, "1x2"), capsys)
    _assert_clean_error(code, out, 2, [f"model {BYO}:{model}", *fragments])
    run_dir = tmp_path / "run"
    cfg = _config_for(tmp_path, store, run_dir, {"model": {"name": f"{BYO}:{model}", "preset": "default"}})
    code, out = _cli(["train", str(cfg)], capsys)
    _assert_clean_error(code, out, 2, [f"model {BYO}:{model}", *fragments])
    assert not run_dir.exists(), "a refused train wrote its run directory"


# ---------------------------------------------------------------- NaNs in the data
@pytest.fixture(scope="module")
def nan_source(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the store (statistics included) with NaNs: temperature at 2 points of time 5
    (2020-01-02T06), 2m_temperature at one point of time 100 (2020-01-26T00)."""
    import zarr

    path = tmp_path_factory.mktemp("nan") / "data.zarr"
    shutil.copytree(store, path)
    group = zarr.open_group(path, mode="r+")
    group["temperature"][5, 0, 3:5, 7] = np.nan
    group["2m_temperature"][100, 0, 0] = np.nan
    return path


def test_prepare_refuses_nans_before_writing(nan_source: Path, tmp_path: Path, capsys: Any) -> None:
    before = _snapshot(nan_source)
    out = tmp_path / "p.zarr"
    code, text = _cli(["data", "prepare", str(nan_source), "--out", str(out), "--no-progress"], capsys)
    words = [
        "holds NaN values",
        "temperature: 2 NaNs in 1 times (first 2020-01-02T06)",
        "2m_temperature: 1 NaNs in 1 times (first 2020-01-26T00)",
        "Nothing was written",
        "--nans fill",
    ]
    _assert_clean_error(code, text, 2, words)
    assert not list(tmp_path.iterdir()) and _snapshot(nan_source) == before
    argv = ["data", "prepare", str(nan_source), "--out", str(out), "--no-progress", "--nans", "fill"]
    code, text = _cli(argv, capsys)
    assert code == 0, text
    assert "filled NaNs with each variable's mean: temperature: 2 NaNs" in text
    filled, src = xr.open_zarr(out)["temperature"], xr.open_zarr(nan_source)["temperature"]
    assert not np.isnan(filled.values).any()
    hole = src.isnull().values
    level = src["level"].values[np.nonzero(hole.any(axis=(0, 2, 3)))[0][0]]
    mean = float(src.sel(level=level).mean())  # over the finite values
    got = filled.values[hole]
    assert got.size == 2 and got == pytest.approx(mean, rel=1e-5), (got, level)


def test_config_validate_reports_nans_per_variable(nan_source: Path, tmp_path: Path, capsys: Any) -> None:
    """The NaN store as the training store (the default scan reads every time of a small store)."""
    cfg = _config_for(tmp_path, nan_source, tmp_path / "run")
    code, out = _cli(["config", "validate", "--quiet", str(cfg)], capsys)
    assert code == 2, out
    assert "data.upper_air 'temperature': 2 NaN values in 1 of the" in out
    assert "data.surface '2m_temperature': 1 NaN values in 1 of the" in out
    assert "(first 2020-01-26T00)" in out and "data prepare --nans fill" in out
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- losses and ensembles
LOSS_CASES: list[tuple[str, dict, list[str]]] = [
    (
        "fair-crps-one-member",
        {"loss": {"kind": "fair_crps"}, "model": {"noise_channels": 2}},
        ["loss.kind='fair_crps' with training.members=1", "cannot learn a spread", "training.members=2"],
    ),
    (
        "almost-fair-one-member",
        {"loss": {"kind": "almost_fair_crps"}, "model": {"noise_channels": 1}},
        ["'almost_fair_crps' with training.members=1", "cannot learn a spread"],
    ),
    (
        "mse-several-members",
        {"training": {"members": 2}, "model": {"noise_channels": 2}},
        ["loss.kind='mse' with training.members=2", "will not spread", "loss.kind=fair_crps"],
    ),
]


@pytest.mark.parametrize(("case", "change", "fragments"), LOSS_CASES, ids=[c[0] for c in LOSS_CASES])
def test_losses_that_cannot_learn_are_refused(
    case: str, change: dict, fragments: list[str], store: Path, tmp_path: Path, capsys: Any
) -> None:
    run_dir = tmp_path / "run"
    cfg = _config_for(tmp_path, store, run_dir, change)
    for argv in (["config", "validate", "--quiet", str(cfg)], ["train", str(cfg)]):
        code, out = _cli(argv, capsys)
        _assert_clean_error(code, out, 2, fragments)
        assert not run_dir.exists()


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"loss": {"alpha": 0.5}}, "loss.alpha=0.5 is ignored: only loss.kind=almost_fair_crps uses it"),
        ({"loss": {"mse_weight": 0.2}}, "loss.mse_weight=0.2 is ignored for loss.kind='mse'"),
        ({"loss": {"kind": "fair_crps"}}, "is the absolute error of one member (an MAE loss)"),
        ({"model": {"noise_channels": 2}}, "the model learns to ignore its noise"),
    ],
)
def test_loss_settings_that_do_nothing_are_warned(
    change: dict, words: str, store: Path, tmp_path: Path, capsys: Any
) -> None:
    cfg = _config_for(tmp_path, store, tmp_path / "run", change)
    code, out = _cli(["config", "validate", "--quiet", str(cfg)], capsys)
    assert code == 0, out
    line = next((ln for ln in out.splitlines() if ln.startswith("warning: config ")), "")
    assert words in line, out


def test_first_member_needs_an_ensemble(world: dict, tmp_path: Path, capsys: Any) -> None:
    _refused_cleanly(
        lambda w, t: P(w, "--first-member", "4"),
        ["--first-member 4", "add --members N"],
        world,
        tmp_path,
        capsys,
    )
    _refused_cleanly(
        lambda w, t: P(w, "--members", "1", "--first-member", "4"),
        ["--first-member 4: the model is deterministic"],
        world,
        tmp_path,
        capsys,
    )


# ---------------------------------------------------------------- sizes: plan and predict
def test_plan_evaluate_sizes_an_ensemble(capsys: Any) -> None:
    base_argv = ["plan", "--model", "weathermixer", "--preset", "tiny", "--grid", "32x64"]
    base_argv += ["--world-size", "2", "--evaluate", "20x8"]
    code, one = _cli(base_argv, capsys)
    assert code == 0, one
    code, four = _cli([*base_argv, "--members", "4"], capsys)
    assert code == 0, four
    assert "evaluation: 20 inits × 4 members (" in four and "640 model steps" in four
    assert "160 model steps" in one

    def full(text: str) -> float:
        line = next(ln for ln in text.splitlines() if ln.strip().startswith("full ("))
        number, unit = line.split()[-4:-2]
        return float(number) * {"B": 1, "MB": 1e6, "GB": 1e9, "TB": 1e12}[unit]

    assert full(four) == pytest.approx(4 * full(one), rel=0.01)


def test_plan_evaluation_rows(capsys: Any) -> None:
    from jigsaw_earth.models.plan import Hardware
    from jigsaw_earth.models.plan_eval import plan_evaluation, writes

    from jigsaw_earth.distributed.mesh import MeshShape

    ch = (5, 6, 4)
    kw = dict(inits=8, steps=4, writes=writes(5, 4), batch=2)
    one = plan_evaluation("weathermixer", "tiny", (32, 64), MeshShape(1, 1, 2), ch, Hardware(), **kw)
    four = plan_evaluation(
        "weathermixer", "tiny", (32, 64), MeshShape(1, 1, 2), ch, Hardware(), members=4, **kw
    )
    spread = plan_evaluation(
        "weathermixer", "tiny", (32, 64), MeshShape(1, 1, 2, ensemble=2), ch, Hardware(), members=4, **kw
    )
    assert (one.rows, four.rows, spread.rows) == (2, 8, 4)
    assert four.written == {k: 4 * v for k, v in one.written.items()}
    assert four.memory["total"] > one.memory["total"]
    assert plan_evaluation(
        "weathermixer", "tiny", (32, 64), MeshShape(1, 1, 2, ensemble=2), ch, Hardware(), members=3, **kw
    ).error.startswith("3 members do not split")


def test_predict_refuses_a_store_without_room(
    world: dict, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jigsaw_earth.inference import campaign

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(campaign.shutil, "disk_usage", lambda p: usage._replace(free=1000))
    _refused_cleanly(
        lambda w, t: P(w, out=str(t / "fc.zarr")),
        [
            "--out",
            "needs about",
            " inits × 1 leads × 5 channels × 16x32 = ",
            "1.00 kB free",
            "--lead-every",
            "nothing was written",
        ],
        world,
        tmp_path,
        capsys,
    )


def test_predict_logs_its_size_and_progress(
    world: dict, tmp_path: Path, capsys: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="jigsaw_earth.inference"):
        code, out = _cli(P(world, "--steps", "2", out=str(tmp_path / "fc.zarr")), capsys)
    assert code == 0, out
    assert " inits × 2 leads × 5 channels × 16x32 = " in caplog.text
    assert "(float32, uncompressed)" in caplog.text and "forecast 100%: " in caplog.text
    assert not (tmp_path / "fc.zarr.lock").exists()
