"""Where commands write (issue 38), through the real command line (``cli.main``, in process).

Every path a command writes — ``--out``, ``--scores``, ``--plot``, ``--json``, a run directory —
goes through one output check (``ownership``): never a run's record, never inside a store that
is read (or any Zarr store), never over a file that is not an earlier output of the same kind.
Each refusal is one error line naming the option, the path and the fix, and the disk is unchanged
(the world of ``test_bad_inputs`` — store, climatology, finished run, forecast, a user folder —
and the test's own folder are hashed before and after). Then what is accepted (writing over our
own outputs), the run directory's lock (two ``train`` processes on one run directory) and what a
score file records.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from . import test_bad_inputs as base
from .test_bad_inputs import PL, P, _assert_clean_error, _cli, _config_for, _refused_cleanly, _snapshot, _text

# the bad-input table's world (store, climatology, a finished run, a forecast, a user folder)
store, finished_run, run_copy, world = base.store, base.finished_run, base.run_copy, base.world


def _user_png(t: Path, name: str) -> Path:
    (t / "p").mkdir(exist_ok=True)
    path = t / "p" / name
    path.write_bytes(b"\x89PNG\r\n\x1a\n not drawn by jigsaw-earth")
    return t / "p"


def SC(w: dict, *extra: str) -> list[str]:
    """``score`` of the world's forecast against its store."""
    return ["score", str(w["fc"]), "--truth", str(w["store"]), *extra]


def PS(w: dict, prefix: Any) -> list[str]:
    """``predict --score --scores PREFIX`` without a store."""
    argv = P(w, "--score", "--scores", str(prefix))
    i = argv.index("--out")
    return argv[:i] + argv[i + 2 :]


def _run_dir_with(t: Path, files: dict[str, str]) -> Path:
    d = t / "mine-run"
    d.mkdir()
    for name, text in files.items():
        (d / name).write_text(text)
    return d


def _train(w: dict, t: Path, run_dir: Any, command: str = "train") -> list[str]:
    cfg = _config_for(t, w["store"], Path(run_dir))
    return ["train", str(cfg)] if command == "train" else ["config", "validate", "--quiet", str(cfg)]


# (id, argv(world, tmp), fragments of the one error line)
OUTPUT_CASES: list[tuple[str, Any, list[str]]] = [
    (
        "predict-scores-run-summary",
        lambda w, t: PS(w, w["run"] / "summary"),
        ["--scores", "summary.json", "is the record", "of the training run in", "Choose another --scores"],
    ),
    (
        "predict-scores-inside-truth",
        lambda w, t: PS(w, w["store"] / "scores"),
        ["--scores", "lies inside the truth/training store data.store", "nothing was written"],
    ),
    (
        "predict-scores-inside-out",
        lambda w, t: [*P(w, "--score", "--scores", str(w["root"] / "new-fc.zarr" / "s"))],
        ["--scores", "lies inside the --out store"],
    ),
    (
        "predict-scores-user-json",
        lambda w, t: PS(w, _text(t / "mine.json", '{"lr": 1}').with_suffix("")),
        ["--scores", "mine.json exists and is not an earlier score file", "remove it yourself"],
    ),
    (
        "predict-scores-in-checkpoints",
        lambda w, t: PS(w, w["ckpt"] / "scores"),
        ["--scores", "is in the record", "checkpoints"],
    ),
    (
        "score-out-run-summary",
        lambda w, t: SC(w, "--out", str(w["run"] / "summary")),
        ["--out", "summary.json", "is the record", "training run"],
    ),
    (
        "score-out-inside-truth",
        lambda w, t: SC(w, "--out", str(w["store"] / "scores")),
        ["--out", "lies inside the --truth store"],
    ),
    (
        "score-out-inside-forecast",
        lambda w, t: SC(w, "--out", str(w["fc"] / "scores")),
        ["--out", "lies inside the forecast store"],
    ),
    (
        "score-out-user-csv",
        lambda w, t: SC(w, "--out", str(_text(t / "x.csv", "a,b\n1,2\n").with_suffix(""))),
        ["--out", "x.csv exists and is not an earlier score table"],
    ),
    (
        "score-plot-inside-truth",
        lambda w, t: SC(w, "--out", str(t / "s"), "--plot", str(w["store"] / "plots")),
        ["--plot", "lies inside the --truth store"],
    ),
    (
        "score-plot-run-checkpoints",
        lambda w, t: SC(w, "--out", str(t / "s"), "--plot", str(w["run"] / "checkpoints")),
        ["--plot", "is the record", "checkpoints"],
    ),
    (
        "score-plot-user-png",
        lambda w, t: SC(w, "--out", str(t / "s"), "--plot", str(_user_png(t, "scorecard-global.png"))),
        ["--plot", "scorecard-global.png exists and is not an earlier picture", "a file of yours"],
    ),
    (
        "score-plot-is-file",
        lambda w, t: SC(w, "--out", str(t / "s"), "--plot", str(w["mine"] / "notes.txt")),
        ["--plot", "notes.txt is a file, not a folder"],
    ),
    (
        "plot-out-inside-truth",
        lambda w, t: ["plot", str(w["scores"]), "--out", str(w["store"] / "p")],
        ["--out", "lies inside the truth store"],
    ),
    (
        "plot-out-user-map",
        lambda w, t: ["plot", str(w["scores"]), "--out", str(_user_png(t, "map-temperature.png"))],
        ["--out", "map-temperature.png exists and is not an earlier picture"],
    ),
    (
        "plot-out-run-config",
        lambda w, t: ["plot", str(w["scores"]), "--out", str(w["run"] / "config.yaml")],
        ["--out", "is the record", "config.yaml"],
    ),
    (
        "validate-json-run-summary",
        lambda w, t: ["validate", "--op", "halo", "--mesh", "1x1", "--json", str(w["run"] / "summary.json")],
        ["--json", "is the record", "summary.json"],
    ),
    (
        "validate-json-user-file",
        lambda w, t: ["validate", "--op", "halo", "--mesh", "1x1", "--json", str(w["mine"] / "notes.txt")],
        ["--json", "notes.txt exists and is not an earlier JSON output of this command"],
    ),
    (
        "validate-json-inside-store",
        lambda w, t: ["validate", "--op", "halo", "--mesh", "1x1", "--json", str(w["store"] / "v.json")],
        ["--json", "lies inside the Zarr store"],
    ),
    (
        "validate-json-is-dir",
        lambda w, t: ["validate", "--op", "halo", "--mesh", "1x1", "--json", str(w["mine"])],
        ["--json", "is a directory"],
    ),
    (
        "plan-json-run-config",
        lambda w, t: PL("--json", str(w["run"] / "config.yaml"), ws="4"),
        ["--json", "is the record", "config.yaml"],
    ),
    (
        "plan-json-other-json",
        lambda w, t: PL("--json", str(w["scores"]), ws="4"),
        ["--json", "scores.json exists and is not an earlier JSON output of this command", "another kind"],
    ),
    (
        "model-summary-json-user-file",
        lambda w, t: [
            "model",
            "summary",
            "--model",
            "weathermixer",
            "--preset",
            "tiny",
            "--mesh",
            "1x1",
            "--grid",
            "16x32",
            "--json",
            str(w["mine"] / "notes.txt"),
        ],
        ["--json", "notes.txt exists and is not an earlier JSON output"],
    ),
    (
        "inspect-json-inside-store",
        lambda w, t: ["data", "inspect", str(w["store"]), "--json", str(w["store"] / "report.json")],
        ["--json", "lies inside the Zarr store", "report.json"],
    ),
    (
        "io-report-json-run-metrics",
        lambda w, t: ["data", "io-report", str(w["store"]), "--json", str(w["run"] / "metrics.jsonl")],
        ["--json", "is the record", "metrics.jsonl"],
    ),
    (
        "config-schema-out-user-file",
        lambda w, t: ["config", "schema", "--out", str(w["mine"] / "notes.txt")],
        ["--out", "notes.txt exists and is not an earlier JSON output"],
    ),
    (
        "bench-report-out-user-file",
        lambda w, t: ["bench", "report", str(w["scores"]), "--out", str(w["mine"] / "notes.txt")],
        ["--out", "notes.txt exists and is not an earlier bench report"],
    ),
    (
        "bench-json-inside-store",
        lambda w, t: ["bench", "layers", "--quick", "--json", str(w["store"] / "b.json")],
        ["--json", "lies inside the Zarr store"],
    ),
    (
        "predict-out-inside-any-store",
        lambda w, t: P(w, out=str(w["fc"] / "inner.zarr")),
        ["--out", "lies inside the Zarr store", "fc.zarr"],
    ),
    ("train-run-dir-is-store", lambda w, t: _train(w, t, w["store"]), ["run.dir", "is the data store"]),
    (
        "train-run-dir-inside-store",
        lambda w, t: _train(w, t, w["store"] / "run"),
        ["run.dir", "lies inside the data store"],
    ),
    (
        "train-run-dir-contains-store",
        lambda w, t: _train(w, t, w["store"].parent),
        ["run.dir", "contains the data store", "beside the stores"],
    ),
    (
        "train-run-dir-is-climatology",
        lambda w, t: _train(w, t, w["clim"]),
        ["run.dir", "is the climatology"],
    ),
    (
        "train-run-dir-inside-forecast",
        lambda w, t: _train(w, t, w["fc"] / "run"),
        ["run.dir", "lies inside the Zarr store"],
    ),
    (
        "train-run-dir-user-records",
        lambda w, t: _train(w, t, _run_dir_with(t, {"summary.json": "{}", "notes.txt": "x"})),
        ["run.dir", "is not a jigsaw-earth run directory", "summary.json", "move those files away"],
    ),
    (
        "validate-run-dir-user-records",
        lambda w, t: _train(w, t, _run_dir_with(t, {"metrics.jsonl": "x"}), "validate"),
        ["run.dir", "is not a jigsaw-earth run directory", "metrics.jsonl"],
    ),
]


@pytest.mark.parametrize(("case", "argv", "fragments"), OUTPUT_CASES, ids=[c[0] for c in OUTPUT_CASES])
def test_output_refused(
    case: str, argv: Any, fragments: list[str], world: dict, tmp_path: Path, capsys: Any
) -> None:
    _refused_cleanly(argv, fragments, world, tmp_path, capsys)


# ---------------------------------------------------------------- what is accepted
def test_score_and_plot_write_over_their_own_outputs(world: dict, tmp_path: Path, capsys: Any) -> None:
    """A second ``score --out/--plot`` and ``plot --out`` replace what the first wrote; the PNGs carry
    jigsaw-earth's source chunk (how an earlier picture is recognised)."""
    from jigsaw_earth.ownership import png_of_ours

    prefix, plots = tmp_path / "s", tmp_path / "plots"
    (plots).mkdir()
    (plots / "notes.txt").write_text("mine")  # other files in the folder are left alone
    for _ in range(2):
        code, out = _cli(SC(world, "--out", str(prefix), "--plot", str(plots)), capsys)
        assert code == 0, out
    pngs = sorted(plots.glob("*.png"))
    assert {p.name for p in pngs} >= {"scorecard-global.png", "map-temperature.png"}
    assert all(png_of_ours(p) for p in pngs)
    code, out = _cli(["plot", f"{prefix}.json", "--out", str(plots)], capsys)
    assert code == 0, out
    assert (plots / "notes.txt").read_text() == "mine"
    code, out = _cli(
        ["validate", "--op", "halo", "--mesh", "1x1", "--json", str(tmp_path / "v.json")], capsys
    )
    assert code == 0, out
    code, out = _cli(
        ["validate", "--op", "halo", "--mesh", "1x1", "--json", str(tmp_path / "v.json")], capsys
    )
    assert code == 0, out  # an earlier validate JSON is replaced


def test_run_dir_may_hold_its_own_config(world: dict, tmp_path: Path, capsys: Any) -> None:
    """``train RUN/config.yaml`` where run.dir is RUN and nothing else of a run is there yet."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = _config_for(tmp_path, world["store"], run_dir)
    inside = run_dir / "config.yaml"
    inside.write_text(cfg.read_text())
    code, out = _cli(["config", "validate", "--quiet", str(inside)], capsys)
    assert code == 0, out


# ---------------------------------------------------------------- what a score file records
def test_predict_scores_record_the_stores_read_and_plot_says_why_no_maps(
    world: dict, tmp_path: Path, capsys: Any
) -> None:
    from jigsaw_earth.data.preflight import default_climatology_path

    code, out = _cli(PS(world, tmp_path / "s"), capsys)
    assert code == 0, out
    info = json.loads((tmp_path / "s.json").read_text())
    assert info["truth"] == str(Path(world["store"]).resolve())
    assert info["climatology"] == str(Path(default_climatology_path(world["store"])).resolve())
    assert info["forecast"] is None
    code, out = _cli(["plot", str(tmp_path / "s.json"), "--out", str(tmp_path / "p")], capsys)
    assert code == 0, out
    assert "no maps drawn: the score file names no forecast store" in out
    assert (tmp_path / "p" / "scorecard-global.png").is_file()


def test_scorecard_titles_stay_inside_the_figure() -> None:
    """Long variable names and units: every panel title lies inside the figure, none overlap."""
    import matplotlib

    matplotlib.use("Agg")
    from jigsaw_earth.metrics.plots import scorecard_figure

    rows = []
    fields = [("u_component_of_wind", 850, "m s**-1"), ("10m_v_component_of_wind", None, "m s**-1"),
              ("mean_sea_level_pressure", None, "Pa")]  # fmt: skip
    for var, lev, unit in fields:
        for metric in ("rmse", "acc", "crps", "ensemble_stddev"):
            for h in (6.0, 24.0):
                rows.append({"model": "forecast", "metric": metric, "region": "global", "variable": var,
                             "level": lev, "lead_hours": h, "value": 1.0, "unit": unit})  # fmt: skip
    fig = scorecard_figure(rows, [], "1.5deg", "global")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    titles = [ax.title for ax in fig.axes if ax.get_title()]
    assert len(titles) == 9
    extents = [t.get_window_extent(renderer) for t in titles]
    for t, e in zip(titles, extents, strict=True):
        assert box.x0 <= e.x0 and e.x1 <= box.x1 and box.y0 <= e.y0 and e.y1 <= box.y1, t.get_text()
    for i, a in enumerate(extents):
        for b in extents[i + 1 :]:
            assert not a.overlaps(b), (a, b)


# ---------------------------------------------------------------- one run per run directory
def _holder(lock: Path, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            info = json.loads(lock.read_text())
            if info.get("pid"):
                return info
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"{lock} never held")


def _losses(run_dir: Path) -> list[float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["loss"] for r in rows if r["kind"] == "train"]


def test_two_trains_on_one_run_dir(finished_run: tuple[Path, Path], store: Path, tmp_path: Path) -> None:
    """The second ``train`` refuses at once naming the first (pid, host, start); the first, stopped
    meanwhile (SIGSTOP), then finishes with the losses of the same run made alone."""
    run_dir = tmp_path / "run"
    cfg = _config_for(tmp_path, store, run_dir)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, "-m", "jigsaw_earth", "train", str(cfg)]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        info = _holder(run_dir / "run.lock")
        assert info["pid"] == first.pid
        os.kill(first.pid, signal.SIGSTOP)
        before = _snapshot(run_dir)
        t0 = time.monotonic()
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == 2, second.stdout + second.stderr
        assert time.monotonic() - t0 < 60  # refused at the start, not after building the run
        err = [ln for ln in second.stderr.splitlines() if ": error: " in ln]
        assert len(err) == 1 and "Traceback" not in second.stderr, second.stderr
        holder = f"is in use by another run: pid {first.pid} on host {socket.gethostname()}"
        for frag in (holder, f"started {info['started']}", "train", "run.lock", "choose another run.dir"):
            assert frag in err[0], err[0]
        assert _snapshot(run_dir) == before, "the refused start changed the run directory"
    finally:
        os.kill(first.pid, signal.SIGCONT)
    out, _ = first.communicate(timeout=600)
    assert first.returncode == 0, out[-3000:]
    assert not (run_dir / "run.lock").exists()
    alone = _losses(finished_run[0])
    assert _losses(run_dir) == pytest.approx(alone, rel=1e-5)


def test_a_stale_lock_is_taken_over(
    run_copy: Path, store: Path, tmp_path: Path, capsys: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A lock file left by a run that died (no process holds it) is taken over, with a warning
    naming that run; the run then resumes and releases it."""
    dead = {"pid": 2**22 + 7, "host": socket.gethostname(), "started": "2020-01-01T00:00:00", "command": "x"}
    (run_copy / "run.lock").write_text(json.dumps(dead))
    cfg = _config_for(tmp_path, store, run_copy, {"training": {"steps": 6}})
    with caplog.at_level(logging.WARNING, logger="jigsaw_earth.locks"):
        code, out = _cli(["train", str(cfg)], capsys)
    assert code == 0, out
    assert "took over the lock" in caplog.text and f"pid {dead['pid']}" in caplog.text
    assert not (run_copy / "run.lock").exists()


def test_predict_refuses_an_out_another_predict_writes(world: dict, tmp_path: Path, capsys: Any) -> None:
    from jigsaw_earth.inference.campaign import lock_output

    target = tmp_path / "fc.zarr"
    held = lock_output(target)  # as another predict writing it would
    try:
        listing = sorted(p.name for p in tmp_path.iterdir())
        code, out = _cli(P(world, out=str(target)), capsys)
        _assert_clean_error(code, out, 2, [f"--out {target} is in use by another run: pid {os.getpid()}",
                                           "fc.zarr.lock", "choose another --out"])  # fmt: skip
        assert sorted(p.name for p in tmp_path.iterdir()) == listing
    finally:
        held.release()
    assert not list(tmp_path.iterdir())


def test_train_output_check_names_the_config(world: dict, tmp_path: Path) -> None:
    """``check_run_dir`` directly: a foreign config.yaml is refused unless it is the config trained."""
    from jigsaw_earth.ownership import check_run_dir

    d = tmp_path / "r"
    d.mkdir()
    (d / "config.yaml").write_text(yaml.safe_dump({"a": 1}))
    with pytest.raises(ValueError, match=r"holds config\.yaml"):
        check_run_dir(d)
    check_run_dir(d, config_file=d / "config.yaml")
