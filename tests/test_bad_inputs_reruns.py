"""Reruns, cleanup and refusals that name the real cause (issue 44), through the real command line.

Each case runs ``cli.main`` in process on the world of ``test_bad_inputs`` (a store, a finished 4-step
run, a forecast, a user folder) or on a copy of it, and asserts the exit code, the one line naming the
item and the fix, and (hashes before and after) that nothing changed where nothing should: a finished
run or fine-tune rerun leaves every file as it was and says it is done; ``--remove-unfinished`` deletes
only a folder whose every file predict's own records account for; selftest, config, data, score and
predict refuse what they cannot do before writing. Then ``jigsaw-earth launch``: SIGTERM to it reaches
every rank, which checkpoints, and the launcher exits 75 as the ranks do.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from . import test_bad_inputs as base
from .test_bad_inputs import P, _assert_clean_error, _cli, _config_for, _refused_cleanly, _snapshot
from .train_helpers import TINY_YAML, merge_sections

# the bad-input table's world (store, climatology, a finished run, a forecast, a user folder)
store, finished_run, run_copy, world = base.store, base.finished_run, base.run_copy, base.world
STEP4 = "checkpoints/step_000000004"


def _done(code: int, text: str, run_dir: Path, step: int = 4) -> None:
    assert code == 0 and "Traceback" not in text, text[-3000:]
    assert f"run.dir '{run_dir}' is already at step {step} of {step}" in text, text[-3000:]
    assert "nothing was trained or written" in text and "Raise training.steps" in text


# ---------------------------------------------------------------- a finished run stays finished
def test_a_finished_run_rerun_changes_nothing_and_more_steps_continue_it(
    run_copy: Path, store: Path, tmp_path: Path, capsys: Any, caplog: pytest.LogCaptureFixture
) -> None:
    before = _snapshot(run_copy)
    cfg = _config_for(tmp_path, store, run_copy)
    for argv in (["train", str(cfg)], ["train", str(run_copy / "config.yaml"), f"run.dir={run_copy}"]):
        code, out = _cli(argv, capsys)
        _done(code, out, run_copy)
        assert "validation at step 4" in out  # the recorded table, read back
        assert _snapshot(run_copy) == before, "a finished run's rerun changed its files"
    code, out = _cli(["config", "validate", "--quiet", str(cfg)], capsys)
    assert code == 0 and "finished at step 4" in out, out
    # raising training.steps continues it (tf32 on a CPU says it computes fp32)
    code, out = _cli(["train", str(cfg), "training.steps=6", "training.precision=tf32"], capsys)
    assert code == 0 and "trained 6 steps" in out and "(2 this run" in out, out[-3000:]
    assert "training.precision=tf32 on cpu" in caplog.text and "plain fp32" in caplog.text
    rows = [json.loads(x) for x in (run_copy / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]
    keys = [(r["kind"], r["step"]) for r in rows]
    assert len(keys) == len(set(keys)), keys  # no row twice
    summary = json.loads((run_copy / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["steps_this_run"] == 2 and summary["final_loss"] > 0


def test_a_run_stopped_before_its_summary_finishes_it_once(
    run_copy: Path, store: Path, tmp_path: Path, capsys: Any
) -> None:
    """Killed between its last checkpoint and its summary: the rerun validates and writes the summary
    (the loss of step 4 as logged), and metrics.jsonl keeps one validation row of step 4."""
    (run_copy / "summary.json").unlink()
    rows = [json.loads(x) for x in (run_copy / "metrics.jsonl").read_text().splitlines()]
    loss = next(r["loss"] for r in rows if r["kind"] == "train" and r["step"] == 4)
    code, out = _cli(["train", str(_config_for(tmp_path, store, run_copy))], capsys)
    assert code == 0 and "(0 this run" in out and f"final loss {loss:.6f}" in out, out[-3000:]
    summary = json.loads((run_copy / "summary.json").read_text())
    assert summary["final_loss"] == loss and summary["samples_per_s"] is None
    rows = [json.loads(x) for x in (run_copy / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "val"].count(4) == 1


@pytest.fixture(scope="module")
def finetuned(finished_run: tuple[Path, Path], store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 4-step fine-tune of the finished run."""
    root = tmp_path_factory.mktemp("finetuned")
    child = root / "child"
    cfg = _config_for(root, store, child, {"training": {"init_from": str(finished_run[0])}})
    assert base.main(["train", str(cfg)]) == 0
    return child


def _other_parent(w: dict, t: Path) -> str:
    other = t / "other-parent"
    shutil.copytree(w["parent"], other)
    return str(other)


# (id, init_from(world, tmp) or None, exit code, fragments): a finished fine-tune started again
FINETUNE_RERUN_CASES: list[tuple[str, Any, int, list[str]]] = [
    ("same-parent", lambda w, t: str(w["parent"]), 0, []),
    ("same-parent-checkpoints-folder", lambda w, t: str(w["parent"] / "checkpoints"), 0, []),
    (
        "other-parent",
        _other_parent,
        2,
        ["training.init_from=", "other-parent", "was fine-tuned from", STEP4, "set training.init_from="],
    ),
    (
        "no-parent",
        None,
        2,
        ["training.init_from is not set", "was fine-tuned from", "a run keeps its parent", "--new-run"],
    ),
    (
        "own-run",
        lambda w, t: str(w["child"]),
        2,
        ["is this run", "checkpoint.resume", "drop training.init_from"],
    ),
    ("own-checkpoint", lambda w, t: str(w["child"] / STEP4), 2, ["is this run", "drop training.init_from"]),
]


@pytest.mark.parametrize(
    ("case", "init_from", "want", "fragments"), FINETUNE_RERUN_CASES, ids=[c[0] for c in FINETUNE_RERUN_CASES]
)
def test_a_finished_fine_tune_keeps_its_parent(
    case: str,
    init_from: Any,
    want: int,
    fragments: list[str],
    finetuned: Path,
    finished_run: tuple[Path, Path],
    store: Path,
    tmp_path: Path,
    capsys: Any,
) -> None:
    child = tmp_path / "child"
    shutil.copytree(finetuned, child)
    w = {"parent": finished_run[0], "child": child}
    given = None if init_from is None else init_from(w, tmp_path)
    before, parent = _snapshot(child), _snapshot(finished_run[0])
    code, out = _cli(
        ["train", str(_config_for(tmp_path, store, child, {"training": {"init_from": given}}))], capsys
    )
    if want == 0:
        _done(code, out, child)
    else:
        _assert_clean_error(code, out, want, fragments)
    assert _snapshot(child) == before and _snapshot(finished_run[0]) == parent


def test_a_run_without_a_parent_refuses_one_later(
    run_copy: Path, finished_run: tuple[Path, Path], store: Path, tmp_path: Path, capsys: Any
) -> None:
    before = _snapshot(run_copy)
    cfg = _config_for(tmp_path, store, run_copy, {"training": {"init_from": str(finished_run[0])}})
    code, out = _cli(["train", str(cfg)], capsys)
    _assert_clean_error(code, out, 2, ["started without a parent", "drop training.init_from", "--new-run"])
    assert _snapshot(run_copy) == before


@pytest.mark.parametrize("where", ["checkpoints", "checkpoints/latest"])
def test_init_from_a_checkpoints_folder_or_its_latest(
    where: str, finished_run: tuple[Path, Path], store: Path, tmp_path: Path, capsys: Any
) -> None:
    from jigsaw_earth.training.finetune import resolve_parent

    parent = finished_run[0]
    assert resolve_parent(str(parent / where)) == parent / STEP4
    cfg = _config_for(tmp_path, store, tmp_path / "child", {"training": {"init_from": str(parent / where)}})
    code, out = _cli(["config", "validate", "--quiet", str(cfg)], capsys)
    assert code == 0 and "is valid" in out, out[-3000:]
    assert not (tmp_path / "child").exists()


def test_a_moved_run_directory_is_not_started_over(
    finished_run: tuple[Path, Path], tmp_path: Path, capsys: Any
) -> None:
    moved = tmp_path / "moved"
    shutil.copytree(finished_run[0], moved)
    before, old = _snapshot(moved), _snapshot(finished_run[0])
    for command in (["train"], ["config", "validate", "--quiet"]):
        code, out = _cli([*command, str(moved / "config.yaml")], capsys)
        _assert_clean_error(
            code, out, 2, ["is the config.yaml of the run in", "was moved or copied", f"run.dir={moved}"]
        )
    assert _snapshot(moved) == before and _snapshot(finished_run[0]) == old


# ---------------------------------------------------------------- config: what train would refuse
# (id, config change, extra argv, exit code, fragments): config validate on the world's store
VALIDATE_CASES: list[tuple[str, dict, list[str], int, list[str]]] = [
    (
        "freeze-typo",
        {"training": {"freeze": ["blokcs"]}},
        [],
        2,
        ["training.freeze", "'blokcs' matches no module", "did you mean 'blocks'"],
    ),
    ("freeze-star", {}, ["training.freeze=[*]"], 2, ["'training.freeze=[*]'", "YAML alias", "quote it"]),
    ("freeze-star-norm", {}, ["training.freeze=[*norm*]"], 2, ["[*norm*]", "YAML alias", "quote it"]),
    (
        "freeze-without-parent",
        {"training": {"freeze": ["blocks"]}},
        [],
        0,
        ["warning: config training.freeze=['blocks'] without training.init_from", "never train"],
    ),
]


@pytest.mark.parametrize(
    ("case", "change", "extra", "want", "fragments"), VALIDATE_CASES, ids=[c[0] for c in VALIDATE_CASES]
)
def test_config_validate_says_what_train_would(
    case: str, change: dict, extra: list[str], want: int, fragments: list[str], store: Path, tmp_path: Path,
    capsys: Any,
) -> None:  # fmt: skip
    cfg = _config_for(tmp_path, store, tmp_path / "run", change)
    before = _snapshot(tmp_path)
    code, out = _cli(["config", "validate", "--quiet", str(cfg), *extra], capsys)
    if want == 0:
        assert code == 0 and all(f in out for f in fragments), out[-3000:]
    else:
        _assert_clean_error(code, out, want, fragments)
    assert _snapshot(tmp_path) == before


# ---------------------------------------------------------------- a store with files gone or damaged
@pytest.fixture()
def gutted(store: Path, tmp_path: Path) -> Path:
    """A copy of the store whose 2m_temperature folder was deleted (its consolidated metadata stays)."""
    path = tmp_path / "gutted.zarr"
    shutil.copytree(store, path)
    shutil.rmtree(path / "2m_temperature")
    return path


def test_deleted_array_data_is_named_before_writing(gutted: Path, tmp_path: Path, capsys: Any) -> None:
    run_dir = tmp_path / "run"
    cfg = _config_for(tmp_path, gutted, run_dir)
    before = _snapshot(tmp_path)
    want = ["data files of '2m_temperature' are missing", "2m_temperature is gone", "Restore"]
    code, out = _cli(["train", str(cfg)], capsys)
    _assert_clean_error(code, out, 2, [*want, "drop '2m_temperature' from data.surface"])
    code, out = _cli(["data", "inspect", str(gutted)], capsys)
    _assert_clean_error(code, out, 2, want)
    code, out = _cli(["config", "validate", "--quiet", str(cfg)], capsys)
    assert code == 2 and all(f in out for f in want) and "Traceback" not in out, out[-3000:]
    assert _snapshot(tmp_path) == before and not run_dir.exists()


def test_damaged_shard_under_validate_nans_full_is_named(store: Path, tmp_path: Path, capsys: Any) -> None:
    damaged = tmp_path / "data.zarr"
    shutil.copytree(store, damaged)
    chunk = next(p for p in sorted((damaged / "temperature" / "c").rglob("*")) if p.is_file())
    chunk.write_bytes(chunk.read_bytes()[:50])  # truncated
    cfg = _config_for(tmp_path, damaged, tmp_path / "run")
    before = _snapshot(tmp_path)
    code, out = _cli(["config", "validate", "--quiet", str(cfg), "--nans", "full"], capsys)
    _assert_clean_error(
        code, out, 2, ["'temperature' cannot be read", f"file {chunk}", "damaged or truncated"]
    )
    assert "Event loop is closed" not in out and _snapshot(tmp_path) == before


# ---------------------------------------------------------------- selftest: its arguments first
def _full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    from jigsaw_earth import selftest

    def full(*args: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a write error naming no file

    monkeypatch.setattr(selftest, "compare_runs", full)


NO_GPU = pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a machine without a GPU")
# (id, argv(tmp), prepare(monkeypatch) or None, fragments)
SELFTEST_CASES: list[Any] = [
    (
        "mps",
        lambda t: ["--device", "mps"],
        None,
        ["--device 'mps'", "neither serves Apple's MPS", "--device cpu"],
    ),
    ("xpu-index", lambda t: ["--device", "xpu:0"], None, ["--device 'xpu:0'", "--device cpu"]),
    pytest.param(
        "cuda",
        lambda t: ["--device", "cuda"],
        None,
        ["--device cuda", "CPU-only build", "--device cpu"],
        marks=NO_GPU,
    ),
    pytest.param(
        "cuda-7", lambda t: ["--device", "cuda:7"], None, ["--device cuda:7", "--device cpu"], marks=NO_GPU
    ),
    (
        "nproc-64",
        lambda t: ["--device", "cpu", "--nproc", "64"],
        None,
        ["--nproc 64", "13x28 grid", "8x8 mesh", "use --nproc 28 or fewer"],
    ),
    ("nproc-0", lambda t: ["--device", "cpu", "--nproc", "0"], None, ["--nproc 0", "at least 1"]),
    (
        "workdir-missing",
        lambda t: ["--workdir", str(t / "none")],
        None,
        ["--workdir", "none is not a folder"],
    ),
    (
        "workdir-full",
        lambda t: ["--device", "cpu", "--workdir", str(t)],
        _full_disk,
        ["run in", "No space left on device", "[ENOSPC]", "--workdir DIR on another filesystem"],
    ),
]


@pytest.mark.parametrize(
    ("case", "argv", "prepare", "fragments"),
    SELFTEST_CASES,
    ids=[getattr(c, "values", c)[0] for c in SELFTEST_CASES],
)
def test_selftest_refuses_before_running(
    case: str, argv: Any, prepare: Any, fragments: list[str], tmp_path: Path, capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    if prepare is not None:
        prepare(monkeypatch)
    before = _snapshot(tmp_path)
    code, out = _cli(["selftest", *argv(tmp_path)], capsys)
    _assert_clean_error(code, out, 2, fragments)
    if case == "workdir-full":
        assert str(tmp_path) in out
    assert _snapshot(tmp_path) == before


# ---------------------------------------------------------------- predict, score, data: the real cause
def _user_progress(t: Path, name: str) -> Path:
    """A user's folder with predict's in-progress name and an empty ``_progress`` folder."""
    folder = t / f"{name}.in-progress"
    (folder / "_progress").mkdir(parents=True)
    (folder / "results.csv").write_text("mine\n")
    return folder


def _out(argv: list[str], out: Path) -> list[str]:
    i = argv.index("--out")
    return [*argv[: i + 1], str(out), *argv[i + 2 :]]


# (id, argv(world, tmp), fragments): refused with one line, nothing written in the world or tmp
REFUSED_CASES: list[tuple[str, Any, list[str]]] = [
    (
        "remove-unfinished-user-folder",
        lambda w, t: ["predict", "--remove-unfinished", str(_user_progress(t, "mine"))],
        [
            "not an unfinished forecast of predict",
            "results.csv, which predict did not write",
            "nothing was deleted",
        ],
    ),
    (
        "predict-over-user-progress",
        lambda w, t: _out(P(w), _user_progress(t, "usr").with_name("usr")),
        ["usr.in-progress is not a jigsaw-earth forecast store", "results.csv", "Nothing was deleted"],
    ),
    (
        "unfinished-missing",
        lambda w, t: ["predict", "--unfinished", str(t / "nope")],
        ["nope: does not exist"],
    ),
    (
        "unfinished-with-config",
        lambda w, t: [*P(w), "--unfinished", str(t)],
        ["--unfinished lists or removes unfinished forecasts and takes no CONFIG", "on its own"],
    ),
    (
        "remove-unfinished-with-out",
        lambda w, t: [
            "predict",
            "--out",
            str(t / "x.zarr"),
            "--remove-unfinished",
            str(t / "x.zarr.in-progress"),
        ],
        ["--remove-unfinished", "takes no --out"],
    ),
    (
        "first-init-words",
        lambda w, t: [*P(w)[:4], "--first-init", "yesterday", *P(w)[6:]],
        ["--first-init 'yesterday' is not a date"],
    ),
    (
        "first-init-after-last",
        lambda w, t: [*P(w)[:4], "--first-init", "2020-02-05", "--last-init", "2020-02-02", *P(w)[8:]],
        ["--first-init 2020-02-05 is after --last-init 2020-02-02", "swap"],
    ),
    (
        "score-out-dot",
        lambda w, t: ["score", str(w["fc"]), "--truth", str(w["store"]), "--out", "."],
        ["--out '.' is a folder", "takes a PREFIX", "PREFIX.json"],
    ),
    (
        "inspect-json-score-file",
        lambda w, t: ["data", "inspect", str(w["store"]), "--nans", "none", "--json", str(w["scores"])],
        ["scores.json exists and is not an earlier JSON output of this command", "another kind"],
    ),
    (
        "run-dir-inside-store",
        lambda w, t: ["config", "validate", str(_config_for(t, w["store"], w["store"] / "runs" / "r"))],
        ["lies inside the data store data.store", "e.g. STORE_PARENT"],
    ),
]


@pytest.mark.parametrize(("case", "argv", "fragments"), REFUSED_CASES, ids=[c[0] for c in REFUSED_CASES])
def test_refused_naming_the_cause(
    case: str, argv: Any, fragments: list[str], world: dict, tmp_path: Path, capsys: Any
) -> None:
    beside = str(world["store"].resolve().parent / "runs" / "my-run")
    fragments = [f.replace("STORE_PARENT", beside) for f in fragments]
    _refused_cleanly(argv, fragments, world, tmp_path, capsys)


def _stop_after_first_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGUSR1 to this process just before batch 2: the run stops with batch 1 recorded, however fast."""
    from jigsaw_earth.inference.progress import Progress

    boundary = Progress.boundary

    def signalled(self: Progress, i: int, pipe: Any) -> None:
        if self.first + i == 1:
            os.kill(os.getpid(), signal.SIGUSR1)  # handled on this (the main) thread before it returns
        boundary(self, i, pipe)

    monkeypatch.setattr(Progress, "boundary", signalled)


def test_remove_unfinished_deletes_only_what_predict_wrote(
    world: dict, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch, quiet_signals: None
) -> None:
    out = tmp_path / "fc.zarr"
    folder = Path(f"{out}.in-progress")
    argv = [*_out(P(world), out), "--batch-size", "1", "--max-inits", "3", "--end", "2020-02-04"]
    _stop_after_first_batch(monkeypatch)
    code, text = _cli(argv, capsys)
    monkeypatch.undo()
    assert code == 75 and folder.is_dir(), text[-3000:]
    mark = json.loads((folder / "_progress" / "folder.json").read_text())
    assert mark["format"] == "jigsaw-earth predict progress" and "temperature" in mark["arrays"]
    (folder / "temperature" / "notes.txt").write_text("mine")  # a user's file among predict's
    before = _snapshot(folder)
    code, text = _cli(["predict", "--remove-unfinished", str(folder)], capsys)
    _assert_clean_error(code, text, 2, [f"{folder / 'temperature' / 'notes.txt'}", "predict did not write",
                                        "nothing was deleted"])  # fmt: skip
    code, text = _cli(argv, capsys)  # nor does a resume take the folder with it
    _assert_clean_error(code, text, 2, ["notes.txt", "predict did not write", "Move your files out"])
    assert _snapshot(folder) == before
    (folder / "temperature" / "notes.txt").unlink()
    code, text = _cli(["predict", "--unfinished", str(tmp_path)], capsys)
    assert code == 0 and "1 unfinished forecast of predict" in text and "of 3 batches recorded" in text, text
    code, text = _cli(["predict", "--remove-unfinished", str(folder)], capsys)
    assert code == 0 and not folder.exists() and f"removed {folder}" in text, text


# ---------------------------------------------------------------- validate's relative error
def test_validate_errors_are_relative_to_the_reference_scale() -> None:
    """A gradient whose true value cancels to ~1e-17 beside one of size 1: the case's figure is the
    error over the reference's scale (1e-7), not 1e-9 / 1e-17 = 1e8; the judge decides as before."""
    from jigsaw_earth.validation.registry import Diff, Record, measure

    tiny = Diff(sharded=1e-9, serial=1e-9, magnitude=1e-17, terms=1e-17)
    normal = Diff(sharded=1e-7, serial=1e-7, magnitude=1.0, terms=1.0)
    r = measure(Record("op", "1x1", "s"), [normal], [tiny, normal], 0)
    assert r.error_backward == pytest.approx(1e-7) and r.max_rel_error == pytest.approx(1e-7)
    assert r.serial_error_backward == pytest.approx(1e-7) and r.passed


# ---------------------------------------------------------------- launch: the ranks' exit status
def test_launch_status_is_the_ranks() -> None:
    from jigsaw_earth.launcher import launch_status

    assert launch_status([75, 75]) == 75 and launch_status([0, 0]) == 0 and launch_status([0, 75]) == 75
    assert launch_status([75, 1, 2]) == 1 and launch_status([-15]) == 143


def test_first_init_passes_torchrun_where_start_does_not() -> None:
    from torch.distributed.run import get_args_parser

    head = ["--nproc-per-node", "2", "-m", "jigsaw_earth", "predict", "c.yaml"]
    args = get_args_parser().parse_args([*head, "--first-init", "2020-01-01", "--last-init", "2020-01-02"])
    assert args.training_script_args[-4:] == ["--first-init", "2020-01-01", "--last-init", "2020-01-02"]
    with pytest.raises(SystemExit):  # "ambiguous option: --start could match --start-method"
        get_args_parser().parse_args([*head, "--start", "2020-01-01"])


def test_sigterm_to_launch_exits_75_after_every_rank_checkpointed(store: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    change = {"run": {"dir": str(run_dir)}, "mesh": {"lon": 2}, "data": {"store": str(store)},
              "training": {"steps": 50}, "checkpoint": {"every": 100},
              "distributed": {"timeout_s": 120}}  # fmt: skip
    raw = merge_sections(TINY_YAML, change)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    cmd = [sys.executable, "-m", "jigsaw_earth", "launch", "--nproc-per-node", "2", "train", str(cfg)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    metrics = run_dir / "metrics.jsonl"
    while not (metrics.is_file() and metrics.read_text().count('"train"') >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)  # what a scheduler sends, to the launcher only
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 75, out[-3000:]
    assert "Traceback" not in out and "run the same command again" in out, out[-3000:]
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert len(list((run_dir / "checkpoints" / latest).glob("*.distcp"))) == 2  # both ranks wrote
