"""A stop signal is honoured within a model step whatever the batch, and a finished forecast stays finished.

A tiny deterministic model is trained once on the 12 × 24 store of ``test_predict_resume``. Its
forecasts are one batch (the batch predict sizes from free memory holds every init), as the demo's are:

* under ``jigsaw-earth launch`` on 2 ranks, SIGTERM to the launcher after model step 3 of the batch (sent
  by a hook in rank 0, ``sitecustomize.py`` on the ranks' path: deterministic however fast the machine):
  every rank is out within 10 s with status 75, nothing of the batch is recorded, the same command
  resumes and its store equals an uninterrupted run's file for file, and the same command again exits 0
  saying the forecast is complete and changes no file (hashes);
* the same in real time: SIGTERM 3 s into a batch of thousands of model steps;
* in process (1 rank): a different request on a finished ``--out`` is refused naming the difference
  (``--overwrite`` replaces it), and a stop during the conversion to GRIB files resumes to the same files;
* a rank killed under ``launch``: the other ranks end with one line each, no traceback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from .test_predict_resume import _config, _files, _main, _recorded, train_tiny

STOP_S = 10.0  # every rank out within this of the signal
LAUNCH_S = 300
# one batch: the inits of 2020-01-11 … 01-15 every 12 h (auto batch: all of them), 8 steps
FORECAST = ["--steps", "8", "--max-inits", "6"]
HOOK = """
import os, signal, time

after = int(os.environ.get("JIGSAW_TEST_STOP_AFTER_STEP", "0"))
if after and os.environ.get("RANK") == "0":  # rank 0 signals the launcher, which forwards it to every rank
    from jigsaw_earth.inference import rollout

    step, done = rollout.Rollout.step, [0]

    def counted(self, *args, **kwargs):
        out = step(self, *args, **kwargs)
        done[0] += 1
        if done[0] == after:
            with open(os.environ["JIGSAW_TEST_STOP_STAMP"], "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getppid(), signal.SIGTERM)
            handler = signal.getsignal(signal.SIGTERM)  # predict's: it notes the signal when it arrives
            deadline = time.monotonic() + 60
            while handler.__self__.received is None and time.monotonic() < deadline:
                time.sleep(0.001)  # until the launcher's forward reached this rank: the stop is at this step
        return out

    rollout.Rollout.step = counted
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tiny(tmp_path_factory.mktemp("stop"))


def _write_config(trained: Path, folder: Path, mesh: dict[str, int]) -> Path:
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(_config(trained, "stop", mesh)))
    return config


def _launch(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "jigsaw_earth", "launch", "--nproc-per-node", "2", *argv]
    return subprocess.Popen(
        cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
    )


def _launched(argv: list[str], log: Path) -> str:
    proc = _launch(argv, log)
    proc.wait(timeout=LAUNCH_S)
    text = log.read_text()
    assert proc.returncode == 0 and "Traceback" not in text, text[-4000:]
    return text


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` but the logs: its hash."""
    return {k: v for k, v in _files(root).items() if not k.endswith(".txt")}


@pytest.mark.slow
def test_sigterm_mid_batch_under_launch_stops_every_rank_resumes_and_reruns_as_a_no_op(
    trained: Path, tmp_path: Path
) -> None:
    ref, run = tmp_path / "ref", tmp_path / "run"
    for folder in (ref, run):
        folder.mkdir()
    argv = ["predict", str(_write_config(trained, run, {"lon": 2})), *FORECAST]
    _launched([*argv, "--out", str(ref / "fc.zarr")], ref / "log.txt")
    out, stamp = run / "fc.zarr", tmp_path / "signalled"
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    env = {"PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]),
           "JIGSAW_TEST_STOP_AFTER_STEP": "3", "JIGSAW_TEST_STOP_STAMP": str(stamp)}  # fmt: skip
    proc = _launch([*argv, "--out", str(out)], run / "stopped.txt", env)
    proc.wait(timeout=LAUNCH_S)
    ended = time.time()
    text = (run / "stopped.txt").read_text()
    assert stamp.is_file(), f"the hook never signalled (exit {proc.returncode})\n{text[-3000:]}"
    assert proc.returncode == 75 and "ranks exited with 75, 75" in text, text[-3000:]
    assert ended - float(stamp.read_text()) < STOP_S, (
        f"stopped {ended - float(stamp.read_text()):.1f} s after"
    )
    assert "stopped on SIGTERM in batch 1 of 1, after model step 3 of 8" in text, text[-3000:]
    assert "0 of 1 batches (0 of 6 inits) are recorded" in text and "Traceback" not in text, text[-3000:]
    folder = Path(f"{out}.in-progress")
    assert not out.exists() and folder.is_dir() and not (folder / "_progress" / "lock").exists()

    _launched([*argv, "--out", str(out)], run / "resumed.txt")
    mine, theirs = _files(out), _files(ref / "fc.zarr")
    assert mine.keys() == theirs.keys() and [k for k in mine if mine[k] != theirs[k]] == [], (
        "the resumed store differs from the uninterrupted run's"
    )
    assert (
        json.loads((out / "zarr.json").read_text())["attributes"]["jigsaw_earth"]["request"][
            "batch (--batch-size)"
        ]
        == 6
    )

    before = _tree(tmp_path)
    text = _launched([*argv, "--out", str(out)], run / "again.txt")
    assert f"{out} is complete: it holds this forecast (6 inits × 8 steps, the same request)" in text, text
    assert "nothing was forecast or written" in text and _tree(tmp_path) == before, "a rerun changed files"


def test_sigterm_3_s_into_a_long_batch_stops_every_rank_within_10_s(trained: Path, tmp_path: Path) -> None:
    """Real time: one batch of 4 inits × 5,000 steps (far longer than 3 s on any machine); SIGTERM to the
    launcher 3 s after the batch began."""
    config = _write_config(trained, tmp_path, {"lon": 2})
    times = ["2020-01-11T00", "2020-01-11T12", "2020-01-12T00", "2020-01-12T12"]
    out = tmp_path / "fc.zarr"
    argv = ["predict", str(config), "--init", str(trained / "data.zarr"), "--time", *times, "--steps", "5000",
            "--lead-every", "5000", "--out", str(out)]  # fmt: skip
    proc = _launch(argv, tmp_path / "log.txt")
    request = Path(f"{out}.in-progress") / "_progress" / "request.json"  # written as the batch begins
    deadline = time.monotonic() + LAUNCH_S
    while not request.is_file():
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "log.txt").read_text()[-3000:]
        time.sleep(0.02)
    time.sleep(3.0)
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    try:
        proc.wait(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"still running {STOP_S:g} s after SIGTERM\n{(tmp_path / 'log.txt').read_text()[-3000:]}")
    took, text = time.monotonic() - sent, (tmp_path / "log.txt").read_text()
    assert proc.returncode == 75 and "ranks exited with 75, 75" in text, text[-3000:]
    assert "stopped on SIGTERM in batch 1 of 1, after model step " in text and "Traceback" not in text, text
    assert took < STOP_S and _recorded(Path(f"{out}.in-progress")) == 0


# ---------------------------------------------------------------- in process (1 rank)
def test_a_finished_forecast_asked_again_or_otherwise(
    trained: Path, tmp_path: Path, capsys, quiet_signals
) -> None:
    config = _write_config(trained, tmp_path, {})
    out = tmp_path / "fc.zarr"
    base = ["predict", str(config), *FORECAST, "--out", str(out)]
    assert _main(base, capsys)[0] == 0
    before = _tree(tmp_path)
    code, text = _main(base, capsys)
    assert code == 0 and "is complete: it holds this forecast" in text and _tree(tmp_path) == before, text
    code, text = _main([*base, "--steps", "4"], capsys)  # the last --steps wins: another request
    assert code == 2 and "holds a complete forecast of another request; it differs in:" in text, text
    assert "leads in hours (--lead-hours, --lead-every, --steps): [6, 12, 18, 24] (recorded: 8 values" in text
    assert "model steps (--steps): 4 (recorded: 8)" in text and "--overwrite" in text, text
    assert _tree(tmp_path) == before
    code, text = _main([*base, "--steps", "4", "--overwrite"], capsys)
    assert code == 0 and out.is_dir(), text
    assert (
        json.loads((out / "zarr.json").read_text())["attributes"]["jigsaw_earth"]["request"][
            "model steps (--steps)"
        ]
        == 4
    )


def test_a_stop_while_converting_to_grib_resumes_to_the_same_files(
    trained: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, quiet_signals
) -> None:
    """SIGTERM after the first of 4 GRIB files: exit 75 with every batch recorded; the same command
    converts again, to the files of a run never stopped."""
    from jigsaw_earth.inference import formats

    config = _write_config(trained, tmp_path, {})
    base = ["predict", str(config), "--steps", "2", "--max-inits", "2", "--format", "grib2"]
    assert _main([*base, "--out", str(tmp_path / "ref")], capsys)[0] == 0
    grib = formats.FileWriter._grib

    def signalled(self, target: Path, items) -> None:
        grib(self, target, items)
        os.kill(os.getpid(), signal.SIGTERM)  # handled on this (the main) thread before the next file

    monkeypatch.setattr(formats.FileWriter, "_grib", signalled)
    out = tmp_path / "fc"
    code, text = _main([*base, "--out", str(out)], capsys)
    monkeypatch.undo()
    assert (
        code == 75 and "stopped on SIGTERM during the conversion to grib2 files (1 of 4 written)" in text
    ), text
    assert "1 of 1 batches (2 of 2 inits) are recorded" in text and not out.exists(), text
    code, text = _main([*base, "--out", str(out)], capsys)
    assert code == 0 and _files(out) == _files(tmp_path / "ref"), text


@pytest.mark.slow
def test_a_rank_killed_under_launch_leaves_one_line_on_the_others(trained: Path, tmp_path: Path) -> None:
    config = _write_config(trained, tmp_path, {"lon": 2})
    out = tmp_path / "fc.zarr"
    argv = ["predict", str(config), "--init", str(trained / "data.zarr"), "--time", "2020-01-11T00",
            "--steps", "5000", "--lead-every", "5000", "--out", str(out)]  # fmt: skip
    proc = _launch(argv, tmp_path / "log.txt")
    request = Path(f"{out}.in-progress") / "_progress" / "request.json"
    deadline = time.monotonic() + LAUNCH_S
    while not request.is_file():
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "log.txt").read_text()[-3000:]
        time.sleep(0.02)
    ranks = [int(k) for task in Path(f"/proc/{proc.pid}/task").glob("*")
             for k in (task / "children").read_text().split()]  # fmt: skip
    os.kill(ranks[-1], signal.SIGKILL)  # as the OOM killer does
    proc.wait(timeout=LAUNCH_S)
    text = (tmp_path / "log.txt").read_text()
    assert proc.returncode == 137 and "Traceback" not in text, text[-3000:]
    lines = [x for x in text.splitlines() if "lost rank 1 on " in x]  # the heartbeat's verdict
    assert len(lines) == 1 and "rank 0 on " in lines[0] and "stops (exit 75)" in lines[0], text[-3000:]
    assert (
        "the batches recorded so far stay in" in lines[0] and "resume: start the same job again" in lines[0]
    )
