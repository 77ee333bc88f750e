"""A forecast survives its time limit: predict stops on a signal, resumes, and leaves no orphan store.

A tiny deterministic model and a tiny stochastic one (2 noise channels) are trained once on a 12 × 24
synthetic store. Each case runs the real command line under ``torchrun`` (or hand-started ranks, as
``srun`` starts them): once uninterrupted (the reference), once stopped by ``SIGTERM`` to torchrun
(which forwards it to every rank) at a signal point, then the same command again. The resumed run's
store must equal the reference's file for file, byte for byte, and its ``--scores`` rows must equal
the reference's exactly; nothing but the outputs is left beside them.

Default run: 2 ranks, one signal point (after 2 batches are recorded), a deterministic forecast
written and scored (``--out --score``) and an ensemble scored only (``--score --scores``, no store);
``SIGKILL`` of every process; ``SIGUSR1`` to one hand-started rank. Marked slow: 4 ranks (2 data
replicas with 4 and 3 inits; an ensemble over ensemble = 2 × lon = 2) and the other two points (before
any batch is recorded, two batches before the end). In-process (1 rank): a changed command is
refused naming what differs, the lock, and listing, inspecting and removing unfinished forecasts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import xarray as xr
import yaml

from jigsaw_earth.distributed.spawn import free_port

from .train_helpers import merge_sections, mixer_config

STORE = {"n_lat": 12, "n_lon": 24, "start": "2020-01-01", "end": "2020-01-18", "levels": (500, 850),
         "upper_air": ("geopotential", "temperature"), "surface": ("2m_temperature",)}  # fmt: skip
# one init per batch, 8 steps each
PREDICT = ["--every-hours", "6", "--batch-size", "1", "--steps", "8"]
WRITES = 3  # ForecastWriter.write calls per batch: one per variable (its 8 leads fill one chunk)
LAUNCH_S = 300


def _config(root: Path, name: str, mesh: dict[str, int], stochastic: bool = False) -> dict:
    # validation's period is predict's --start/--end (torchrun takes --start)
    raw = merge_sections(
        mixer_config(root, 2, "2020-01-15"),
        {"mesh": {"ensemble": 1, **mesh}, "distributed": {"timeout_s": 120}},
    )
    if stochastic:
        raw["run"]["dir"] = str(root / "run-ens")
        raw["model"]["noise_channels"] = 2
        raw["training"]["members"] = 2
        raw["loss"] = {"kind": "fair_crps"}
    return raw


def train_tiny(root: Path, stochastic: tuple[bool, ...] = (False,)) -> Path:
    """The ``STORE`` store under ``root`` and the tiny model trained on it (run ``train``; a second,
    stochastic, model in the same run folder where ``stochastic`` has ``True``)."""
    from jigsaw_earth.data.synth import SynthConfig, synth_store

    from jigsaw_earth.config import parse_config
    from jigsaw_earth.training import run_training

    synth_store(root / "data.zarr", SynthConfig(**STORE))
    for kind in stochastic:
        run_training(parse_config(_config(root, "train", {}, kind)))
    return root


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tiny(tmp_path_factory.mktemp("resume"), (False, True))


# ---------------------------------------------------------------- the cases
# name: (stochastic, ranks, mesh, outputs, extra arguments)
CASES = {
    "det-2": (False, 2, {"lon": 2}, "out", ["--max-inits", "8"]),
    "ens-2": (True, 2, {"ensemble": 2}, "scores", ["--max-inits", "8", "--members", "2"]),
    "det-4": (False, 4, {"data": 2, "lon": 2}, "out", ["--max-inits", "9"]),  # replicas: 5 and 4 inits
    "ens-4": (True, 4, {"ensemble": 2, "lon": 2}, "scores", ["--max-inits", "8", "--members", "2"]),
}
# batches of the longest replica, and where each signal point is: batches recorded (None: none yet,
# once the lock is taken). A stop needs a later batch that every replica has (det-4: 4 of its 5).
BATCHES = {"det-2": 8, "ens-2": 8, "det-4": 5, "ens-4": 8}
POINT = {"setup": lambda n: None, "mid": lambda n: 2 if n > 5 else 1, "late": lambda n: 6 if n > 5 else 2}


def _argv(config: Path, outputs: str, prefix: Path, extra: list[str]) -> list[str]:
    argv = ["predict", str(config), *PREDICT, *extra, "--score", "--scores", str(prefix)]
    return [*argv, "--out", f"{prefix}.zarr"] if outputs == "out" else argv


def _torchrun(argv: list[str], ranks: int, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
           "--master-port", str(free_port()), "-m", "jigsaw_earth", *argv]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)


def stop_point(batch: int, total: int) -> str:
    """The pattern of where a stop took effect: before batch ``batch`` of ``total``, or within it."""
    within = rf"in batch {batch} of {total}, after model step \d+ of \d+ \([^)]*\)"
    return rf"(?:before batch {batch} of {total}|{within})"


def _recorded(folder: Path) -> int:
    """Batches every rank has recorded (0 before every rank recorded one)."""
    from jigsaw_earth.inference.unfinished import batches_done, read_request

    info = read_request(folder)
    return batches_done(folder, int(info["world"])) if info else 0


def _descendants(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        for task in Path(f"/proc/{frontier.pop()}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            found += kids
            frontier += kids
    return found


def _interrupt(proc: subprocess.Popen, folder: Path, after: int | None, sig: signal.Signals) -> None:
    """Signal ``proc`` (SIGKILL: it and every process under it) once ``after`` batches are recorded
    (None: once the lock is taken, before any batch is recorded)."""
    deadline = time.monotonic() + LAUNCH_S
    while proc.poll() is None and time.monotonic() < deadline:
        if (folder / "_progress" / "lock").exists() if after is None else _recorded(folder) >= after:
            if sig == signal.SIGKILL:
                for pid in [*_descendants(proc.pid), proc.pid]:
                    os.kill(pid, signal.SIGKILL)
            else:
                proc.send_signal(sig)
            return
        time.sleep(0.01)
    pytest.fail(f"never reached the signal point ({after} batches recorded; exit {proc.poll()})")


def _files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}  # fmt: skip


def _rows(prefix: Path) -> list[dict]:
    return json.loads(Path(f"{prefix}.json").read_text())["scores"]


def _run(argv: list[str], ranks: int, log: Path) -> str:
    proc = _torchrun(argv, ranks, log)
    proc.wait(timeout=LAUNCH_S)
    text = log.read_text()
    assert proc.returncode == 0, text[-4000:]
    return text


@pytest.fixture(scope="module")
def reference(trained: Path, tmp_path_factory: pytest.TempPathFactory):
    """The uninterrupted run of a case (once per case): its folder and output prefix."""
    done: dict[str, Path] = {}

    def get(case: str) -> Path:
        if case not in done:
            stochastic, ranks, mesh, outputs, extra = CASES[case]
            folder = tmp_path_factory.mktemp(f"ref-{case}")
            config = folder / "config.yaml"
            config.write_text(yaml.safe_dump(_config(trained, case, mesh, stochastic)))
            _run(_argv(config, outputs, folder / "fc", extra), ranks, folder / "log.txt")
            done[case] = folder / "fc"
        return done[case]

    return get


def _check_same(prefix: Path, ref: Path, outputs: str) -> None:
    assert json.dumps(_rows(prefix)) == json.dumps(_rows(ref)), "scores differ from the uninterrupted run"
    mine, theirs = (xr.open_dataset(f"{p}-stats.nc").load() for p in (prefix, ref))
    xr.testing.assert_equal(mine, theirs)  # every per-init statistic bit for bit (the stores' paths differ)
    expected = {"config.yaml", "fc.json", "fc.csv", "fc-stats.nc"}
    expected |= {"fc.zarr"} if outputs == "out" else set()
    left = {p.name for p in prefix.parent.iterdir() if not p.name.endswith(".txt")}
    assert left == expected, f"orphans beside the outputs: {sorted(left - expected)}"
    if outputs == "out":
        mine, theirs = _files(Path(f"{prefix}.zarr")), _files(Path(f"{ref}.zarr"))
        assert mine.keys() == theirs.keys() and "_progress" not in "".join(mine)
        assert [k for k in mine if mine[k] != theirs[k]] == [], (
            "store files differ from the uninterrupted run"
        )


def _stopped_then_resumed(trained: Path, reference, tmp_path: Path, case: str, point: str,
                          sig: signal.Signals = signal.SIGTERM) -> str:  # fmt: skip
    stochastic, ranks, mesh, outputs, extra = CASES[case]
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(_config(trained, case, mesh, stochastic)))
    prefix = tmp_path / "fc"
    argv = _argv(config, outputs, prefix, extra)
    folder = Path(f"{prefix}.zarr.in-progress" if outputs == "out" else f"{prefix}.in-progress")
    proc = _torchrun(argv, ranks, tmp_path / "stopped.txt")
    total = BATCHES[case]
    _interrupt(proc, folder, POINT[point](total), sig)
    proc.wait(timeout=LAUNCH_S)
    stopped = (tmp_path / "stopped.txt").read_text()
    assert proc.returncode != 0, f"the run finished before the signal took effect\n{stopped[-3000:]}"
    assert folder.is_dir() and not Path(f"{prefix}.zarr").exists()
    recorded = _recorded(folder)
    assert recorded < total, stopped[-3000:]
    if sig != signal.SIGKILL:  # before the next batch, or within it (its inits forecast again)
        assert re.search(rf"stopped on {sig.name} {stop_point(recorded + 1, total)}; {recorded} of {total} ",
                         stopped), stopped[-3000:]  # fmt: skip
        assert not (folder / "_progress" / "lock").exists(), "the lock must be released on a clean stop"
    resumed = _run(argv, ranks, tmp_path / "resumed.txt")
    if recorded:
        assert f"{recorded} of {total} batches recorded; starting at batch {recorded + 1}" in resumed
    _check_same(prefix, reference(case), outputs)
    return stopped


DEFAULT = {("det-2", "mid")}  # the rest: slow
POINTS = [pytest.param(case, point, marks=[] if (case, point) in DEFAULT else [pytest.mark.slow])
          for case in CASES for point in POINT]  # fmt: skip


@pytest.mark.parametrize(("case", "point"), POINTS)
def test_sigterm_stops_every_rank_and_the_rerun_is_bit_identical(
    trained: Path, reference, tmp_path: Path, case: str, point: str
) -> None:
    _stopped_then_resumed(trained, reference, tmp_path, case, point)


@pytest.mark.slow
def test_sigkill_loses_at_most_the_batch_in_flight(trained: Path, reference, tmp_path: Path) -> None:
    stopped = _stopped_then_resumed(trained, reference, tmp_path, "det-2", "mid", signal.SIGKILL)
    assert "stopped on" not in stopped


def test_sigusr1_to_one_rank_stops_both_with_exit_75(trained: Path, reference, tmp_path: Path) -> None:
    """Ranks started as srun starts them (no torchrun): USR1 to rank 1 only; both agree and exit 75."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(_config(trained, "det-2", {"lon": 2})))
    prefix, port = tmp_path / "fc", free_port()
    argv = _argv(config, "out", prefix, CASES["det-2"][4])
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    cmd = [sys.executable, "-m", "jigsaw_earth", *argv]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in range(2)]  # fmt: skip
    folder = Path(f"{prefix}.zarr.in-progress")
    deadline = time.monotonic() + LAUNCH_S
    while _recorded(folder) < 2:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.01)
    procs[1].send_signal(signal.SIGUSR1)
    outs = [p.communicate(timeout=LAUNCH_S)[0] for p in procs]
    assert [p.returncode for p in procs] == [75, 75], "\n".join(o[-3000:] for o in outs)
    assert "Traceback" not in "".join(outs)
    recorded = _recorded(folder)
    assert re.search(f"stopped on a signal to another rank {stop_point(recorded + 1, 8)}; ", outs[0]), outs[0]
    _run(argv, 2, tmp_path / "resumed.txt")
    _check_same(prefix, reference("det-2"), "out")


# ---------------------------------------------------------------- in-process (1 rank)
@pytest.fixture
def quiet_signals(quiet_signals):
    """conftest's ``quiet_signals``, and ``Progress.boundary`` restored (a _signal_after that never fired)."""
    from jigsaw_earth.inference.progress import Progress

    boundary = Progress.boundary
    yield
    Progress.boundary = boundary


def _signal_after(folder: Path, batches: int, sig: signal.Signals = signal.SIGTERM) -> None:
    """``sig`` to this process at the boundary before batch ``batches + 1`` of the run writing to
    ``folder``: it stops with ``batches`` recorded, however fast it runs (``quiet_signals`` unhooks)."""
    from jigsaw_earth.inference.progress import Progress

    boundary = Progress.boundary

    def signalled(self: Progress, i: int, pipe) -> None:
        if (
            self.folder is not None
            and Path(self.folder).resolve() == folder.resolve()
            and self.first + i == batches
        ):
            Progress.boundary = boundary
            os.kill(os.getpid(), sig)  # handled on this (the main) thread before it returns
        boundary(self, i, pipe)

    Progress.boundary = signalled


def _main(argv: list[str], capsys) -> tuple[int, str]:
    from jigsaw_earth.cli import main

    code = main(argv)
    out = capsys.readouterr()
    return code, out.out + out.err


def test_a_changed_command_is_refused_naming_what_differs(
    trained: Path, tmp_path: Path, capsys, quiet_signals
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(_config(trained, "one", {})))
    out = tmp_path / "fc.zarr"
    argv = ["predict", str(config), *PREDICT, "--max-inits", "8", "--out", str(out)]
    _signal_after(Path(f"{out}.in-progress"), 2)
    code, text = _main(argv, capsys)
    assert code == 75 and "stopped on SIGTERM before batch" in text, text
    changed = [*argv[:2], "--every-hours", "12", "--batch-size", "2", "--steps", "4", "--max-inits", "8"]
    code, text = _main([*changed, "--out", str(out)], capsys)
    assert code == 2, text
    for item in ("initialisation times (--start, --end, --every-hours, --max-inits): 8 values 2020-01-11T00",
                 "leads in hours (--lead-hours, --lead-every, --steps): [6, 12, 18, 24] (recorded: 8 values",
                 "batch (--batch-size): 2 (recorded: 1)", "--remove-unfinished"):  # fmt: skip
        assert item in text, text
    assert "members" not in text.split("differs in:")[1].split(". A resume")[0], "only what differs"
    # the same command without --batch-size resumes with the recorded batch
    code, text = _main([a for a in argv if a not in ("--batch-size", "1")], capsys)
    assert code == 0 and out.is_dir() and not Path(f"{out}.in-progress").exists(), text


def test_unfinished_forecasts_are_listed_inspected_and_removed(
    trained: Path, tmp_path: Path, capsys, caplog: pytest.LogCaptureFixture, quiet_signals
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(_config(trained, "one", {})))
    base = ["predict", str(config), *PREDICT, "--max-inits", "8"]
    folder = tmp_path / "a.zarr.in-progress"
    _signal_after(folder, 1, signal.SIGUSR1)
    assert _main([*base, "--out", str(tmp_path / "a.zarr")], capsys)[0] == 75
    scores = tmp_path / "s.in-progress"  # a score-only run's progress
    _signal_after(scores, 1)
    assert _main([*base, "--score", "--scores", str(tmp_path / "s")], capsys)[0] == 75
    mine = tmp_path / "mine.in-progress"  # a user's folder that looks alike: never listed nor removed
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    legacy = tmp_path / "old.zarr.tmp-0123abcd"  # an earlier version's temporary forecast store
    legacy.mkdir()
    marker = {"jigsaw_earth": {"kind": "forecast", "complete": False}}
    (legacy / "zarr.json").write_text(
        json.dumps({"zarr_format": 3, "node_type": "group", "attributes": marker})
    )

    code, text = _main(["predict", "--unfinished", str(tmp_path)], capsys)
    assert code == 0 and "3 unfinished forecasts of predict" in text, text
    assert "old.zarr.tmp-0123abcd: the temporary store of a predict that did not finish" in text
    assert (
        "a.zarr.in-progress: an unfinished forecast: " in text and "of 8 batches recorded (8 inits)" in text
    )
    assert "s.in-progress: the unfinished scoring of a forecast (no store)" in text and "mine" not in text
    code, text = _main(["data", "inspect", str(folder), "--nans", "none"], capsys)
    assert code == 0 and "UNFINISHED forecast of predict" in text, text
    assert "variables (--variables): ['geopotential', 'temperature', '2m_temperature']" in text, text
    code, text = _main(["score", str(folder), "--truth", str(trained / "data.zarr")], capsys)
    assert code == 2 and "forecast in progress" in text, text

    caplog.clear()  # another output: predict names the abandoned ones beside it
    assert _main([*base, "--max-inits", "2", "--out", str(tmp_path / "b.zarr")], capsys)[0] == 0
    assert "remove it: jigsaw-earth predict --remove-unfinished" in caplog.text
    assert str(folder) in caplog.text and str(legacy) in caplog.text and str(mine) not in caplog.text
    caplog.clear()  # scores alone, no --scores: nowhere to record, and predict says so
    assert _main([*base, "--max-inits", "2", "--score"], capsys)[0] == 0
    assert "a score-only run without --scores PREFIX records no progress" in caplog.text

    code, text = _main(["predict", "--remove-unfinished", str(mine)], capsys)
    assert code == 2 and "nothing was deleted" in text and (mine / "notes.txt").exists(), text
    code, text = _main(["predict", "--remove-unfinished", str(folder), str(scores), str(legacy)], capsys)
    assert code == 0 and not folder.exists() and not scores.exists() and not legacy.exists(), text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.zarr", "config.yaml", "mine.in-progress"]


def test_a_live_lock_refuses_a_second_predict(trained: Path, tmp_path: Path, quiet_signals) -> None:
    from jigsaw_earth.config import parse_config
    from jigsaw_earth.inference.predict import PredictRequest, run_prediction
    from jigsaw_earth.inference.progress import Stopped

    cfg = parse_config(_config(trained, "one", {}))
    out = tmp_path / "fc.zarr"
    kw = {"first_init": "2020-01-11", "last_init": "2020-01-15", "every_hours": 6, "max_inits": 8,
          "batch_size": 1, "steps": 8}  # fmt: skip
    _signal_after(Path(f"{out}.in-progress"), 1)
    with pytest.raises(Stopped):
        run_prediction(cfg, PredictRequest(out=out, **kw))
    lock = Path(f"{out}.in-progress") / "_progress" / "lock"
    other = subprocess.Popen(["sleep", "60"])
    try:  # another predict on this host, alive
        lock.write_text(json.dumps({"host": os.uname().nodename, "pid": other.pid}))
        with pytest.raises(ValueError, match=rf"is being written by process {other.pid} on "):
            run_prediction(cfg, PredictRequest(out=out, **kw))
    finally:
        other.kill()
        other.wait()
    # its process is gone: the lock is stale and taken over
    run_prediction(cfg, PredictRequest(out=out, **kw))
    assert out.is_dir() and not Path(f"{out}.in-progress").exists()


def test_ctrl_c_stops_a_second_interrupts_and_an_error_keeps_what_is_recorded(
    trained: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, quiet_signals
) -> None:
    from jigsaw_earth.inference import forecast_store
    from jigsaw_earth.inference.progress import PredictSignals

    stop = PredictSignals(None)  # type: ignore[arg-type]
    stop._handle(signal.SIGINT, None)
    assert stop.received == "SIGINT"
    with pytest.raises(KeyboardInterrupt):  # the second Ctrl-C: at once
        stop._handle(signal.SIGINT, None)

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(_config(trained, "one", {})))
    base = ["predict", str(config), *PREDICT, "--max-inits", "8", "--score"]
    assert (
        _main([*base, "--out", str(tmp_path / "ref.zarr"), "--scores", str(tmp_path / "ref")], capsys)[0] == 0
    )
    out, prefix = tmp_path / "fc.zarr", tmp_path / "fc"
    argv = [*base, "--out", str(out), "--scores", str(prefix)]
    folder = Path(f"{out}.in-progress")
    _signal_after(folder, 2, signal.SIGINT)
    code, text = _main(argv, capsys)
    assert code == 75 and "stopped on SIGINT before batch" in text, text
    first = _recorded(folder)

    write, calls = forecast_store.ForecastWriter.write, []

    def interrupted(self, *args, **kwargs) -> None:  # a second Ctrl-C lands in the next batch but one
        calls.append(1)
        if len(calls) == WRITES + 2:
            raise KeyboardInterrupt
        write(self, *args, **kwargs)

    monkeypatch.setattr(forecast_store.ForecastWriter, "write", interrupted)
    code, text = _main(argv, capsys)
    assert code == 130 and "(a predict resumes from its last recorded batch)" in text, text
    assert folder.is_dir() and not (folder / "_progress" / "lock").exists()
    assert _recorded(folder) == first + 1  # the batch in flight is lost, the one before it is kept

    def broken(self, *args, **kwargs) -> None:  # an error in the next batch but one: kept as well
        calls.append(1)
        if len(calls) == WRITES + 2:
            raise OSError(28, "No space left on device")
        write(self, *args, **kwargs)

    calls.clear()
    monkeypatch.setattr(forecast_store.ForecastWriter, "write", broken)
    code, text = _main(argv, capsys)
    assert code == 2 and "No space left on device" in text, text
    assert _recorded(folder) == first + 2 and not (folder / "_progress" / "lock").exists()
    monkeypatch.setattr(forecast_store.ForecastWriter, "write", write)
    code, text = _main(argv, capsys)
    assert code == 0, text
    assert json.dumps(_rows(prefix)) == json.dumps(_rows(tmp_path / "ref"))
    mine, theirs = _files(out), _files(tmp_path / "ref.zarr")
    assert mine.keys() == theirs.keys() and [k for k in mine if mine[k] != theirs[k]] == []
