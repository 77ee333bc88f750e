"""A run directory belongs to one run: starts that would discard or shadow checkpoints refuse.

``claim_run_dir`` (rank 0, before any file of the run is written) decides whether this start
continues the run in ``run.dir``, starts a new one there, or must refuse:

* ``checkpoint.resume=never`` where checkpoints exist would overwrite them (a new step_N replaces
  the old one) or shadow them (``latest`` and pruning would mix two runs): refused;
* ``resume=auto`` with a newest checkpoint beyond ``training.steps`` (a shorter new run), or one
  written with another model/data/loss/batch configuration: refused;
* ``resume=PATH`` from outside this run directory while it holds checkpoints: refused;
* a ``training.init_from`` other than the one the run started from (or one naming this run):
  refused, naming the recorded parent.

What a continuing start must agree with, and when a run is finished (the trainer then raises
``RunFinished`` before anything is read or written), is ``continuity.py``'s. A config file that is
another run directory's ``config.yaml`` (a run moved or copied) is refused unless ``run.dir``
names that directory (``check_config_home``).

A live run holds ``RUN_DIR/run.lock`` (``locks.PathLock``: pid, host, start time and command line)
from its preflight to its end: a second start on the same directory — ``--new-run`` included —
refuses at once, naming the first; a lock left by a run that died is taken over with a warning.

``--new-run`` moves the old run aside (``RUN_DIR`` → ``RUN_DIR.old-K``, the name is logged and
returned) and starts fresh. ``record_start`` then writes ``config.yaml`` and appends the start to
``history.jsonl``; ``truncate_metrics`` drops rows past the resumed step from ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from ..checkpoint import latest_checkpoint, list_checkpoints, read_meta
from ..config.parse import to_dict
from ..config.schema import TrainConfig
from ..data.preflight import default_climatology_path
from ..locks import LockHeld, PathLock, describe_holder
from ..ownership import check_run_dir
from .continuity import (
    HISTORY_FILE,
    RunFinished,
    config_hash,
    finished_message,
    finished_step,
    lineage_conflict,
    resume_differences,
    resumes,
    step_of,
)

__all__ = [
    "HISTORY_FILE",
    "LOCK_FILE",
    "RunDirError",
    "RunFinished",
    "check_config_home",
    "check_place",
    "claim_run_dir",
    "config_hash",
    "finished_message",
    "finished_step",
    "lock_run_dir",
    "record_start",
    "recorded_loss",
    "resumes",
    "truncate_metrics",
]

log = logging.getLogger(__name__)
LOCK_FILE = "run.lock"
_LOCK_FIX = "wait for it to finish, stop it, or choose another run.dir"
_RUN_FILES = ("checkpoints", "metrics.jsonl", "config.yaml", HISTORY_FILE, "summary.json")


class RunDirError(ValueError):
    """This start would discard or shadow the checkpoints of another run."""


def _conflict(cfg: TrainConfig, run_dir: Path) -> str | None:
    """Why this start would lose or shadow checkpoints in ``run_dir`` (``None``: it would not)."""
    found = list_checkpoints(run_dir)
    if not found:
        return None
    newest = latest_checkpoint(run_dir) or found[-1]
    held = f"run.dir {str(run_dir)!r} holds checkpoints of an earlier run up to step {step_of(newest)}"
    mode, steps = cfg.checkpoint.resume, cfg.training.steps
    if mode == "never":
        return f"{held}; checkpoint.resume=never would overwrite or shadow them"
    if mode == "auto":
        if step_of(newest) > steps:
            return (
                f"{held}, beyond training.steps={steps}; a shorter run here would prune its own checkpoints "
                f"(set training.steps >= {step_of(newest)} to continue that run)"
            )
        saved = read_meta(newest)["state"].get("config_hash")
        if not resumes(saved, cfg):
            differs = resume_differences(run_dir, saved, cfg)
            what = f": {'; '.join(differs)}" if differs else ""
            return (
                f"{held}, written with another model/data/loss/batch configuration{what} "
                f"(see {run_dir}/config.yaml), so this config cannot resume it"
            )
        return lineage_conflict(cfg, run_dir, newest)
    source = Path(mode).resolve()
    if source.parent != (run_dir / "checkpoints").resolve():
        return f"{held}; checkpoint.resume={mode} starts another run from outside it"
    return lineage_conflict(cfg, run_dir, source)


def _aside_name(run_dir: Path) -> Path:
    k = 1
    while run_dir.with_name(f"{run_dir.name}.old-{k}").exists():
        k += 1
    return run_dir.with_name(f"{run_dir.name}.old-{k}")


def claim_run_dir(cfg: TrainConfig, new_run: bool = False) -> Path | None:
    """Rank 0: check that this start may use ``run.dir``; with ``new_run`` move an old run aside.

    Returns where the old run was moved (``None`` if nothing was moved). Raises ``RunDirError``
    naming the directory, the conflict and the three ways out.
    """
    run_dir = Path(cfg.run.dir)
    _refuse_if_held(run_dir)
    if cfg.checkpoint.resume not in ("auto", "never"):
        read_meta(cfg.checkpoint.resume)  # a complete checkpoint, or an error naming what is missing
    fresh = new_run or cfg.checkpoint.resume == "never" or not list_checkpoints(run_dir)
    if cfg.training.init_from and fresh:
        from .finetune import resolve_parent

        resolve_parent(cfg.training.init_from, run_dir)  # a first start: the parent must be there
    if new_run:
        if run_dir.is_dir() and any((run_dir / name).exists() for name in _RUN_FILES):
            aside = _aside_name(run_dir)
            os.replace(run_dir, aside)
            log.warning("--new-run: moved the earlier run in %s aside to %s", run_dir, aside)
            print(f"jigsaw-earth train: moved the earlier run in {run_dir} aside to {aside}", file=sys.stderr)
            return aside
        return None
    why = _conflict(cfg, run_dir)
    if why is not None:
        raise RunDirError(
            f"{why}. Nothing was changed. Choose another run.dir, resume that run "
            f"(checkpoint.resume=auto with its config), or pass --new-run to move it aside to "
            f"{_aside_name(run_dir)} and start here"
        )
    return None


def _refuse_if_held(run_dir: Path, taker: bool = True) -> None:
    held = PathLock.holder(run_dir / LOCK_FILE, lease=taker)
    if held is not None:
        raise RunDirError(
            f"run.dir {str(run_dir)!r} is in use by another run: {describe_holder(held)} holds "
            f"{run_dir / LOCK_FILE}; nothing was changed. {_LOCK_FIX[0].upper()}{_LOCK_FIX[1:]}"
        )


def check_place(
    cfg: TrainConfig, config_file: str | Path | None = None, overrides: Sequence[str] = (), taker: bool = True
) -> None:
    """``run.dir`` is a place for a run (``ownership.check_run_dir``): not in or around the data
    or climatology store, and no file a run writes that another hand put there (``config_file``,
    the config being trained, may be its ``config.yaml``); no live run holds it; and the config
    file is not another run directory's ``config.yaml`` (``check_config_home``). ``taker``: this
    process takes the run's lock (rank 0); the other ranks refuse only a lock their host's kernel
    sees held, and leave the lease of another host's lock to rank 0 (``locks.PathLock.holder``)."""
    d = cfg.data
    stores = (
        ("data store data.store", d.store),
        ("climatology", d.climatology or default_climatology_path(d.store)),
    )
    check_config_home(cfg, config_file, overrides)
    check_run_dir(cfg.run.dir, stores, config_file)
    _refuse_if_held(Path(cfg.run.dir), taker)  # at once, before the mesh and the model are built


def check_config_home(
    cfg: TrainConfig, config_file: str | Path | None, overrides: Sequence[str] = ()
) -> None:
    """Refuse a config file that is the ``config.yaml`` of a run directory other than ``run.dir``
    (the run was moved or copied: training would start over at the old place), unless ``run.dir``
    is given on the command line (``overrides``)."""
    if config_file is None:
        return
    path = Path(config_file).expanduser().resolve()
    home = path.parent
    if path.name != "config.yaml" or not _is_run(home):
        return
    if any(item.partition("=")[0].strip() == "run.dir" for item in overrides):
        return
    where = Path(cfg.run.dir).expanduser().resolve()
    if home == where:
        return
    relative = "" if Path(cfg.run.dir).is_absolute() else f" (from {Path.cwd()})"
    raise RunDirError(
        f"{config_file} is the config.yaml of the run in {home}, but its run.dir {cfg.run.dir!r} is "
        f"{where}{relative}: the run directory was moved or copied, or run.dir is relative to another "
        f"working directory. Nothing was changed. Pass run.dir={home} to continue the run there, or "
        f"run.dir=NEW_DIR to start a new run from this config"
    )


def _is_run(path: Path) -> bool:
    return (path / HISTORY_FILE).is_file() or (path / "checkpoints" / "latest").is_file()


def lock_run_dir(cfg: TrainConfig) -> PathLock:
    """Rank 0, once ``run.dir`` exists: hold its ``run.lock`` until the run ends (``release``)."""
    run_dir = Path(cfg.run.dir)
    try:
        return PathLock.acquire(run_dir / LOCK_FILE, f"run.dir {str(run_dir)!r}", _LOCK_FIX)
    except LockHeld as err:
        raise RunDirError(str(err)) from None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(text)
    os.replace(tmp, path)


def record_start(
    cfg: TrainConfig,
    start_step: int,
    resumed_from: Path | None,
    moved: Path | None,
    init_from: dict[str, Any] | None = None,
) -> None:
    """Rank 0, after every check passed: write ``config.yaml``, append to ``history.jsonl``.

    ``init_from``: the parent of a fine-tune (checkpoint, SHA-256, step, run): named in a comment
    at the top of ``config.yaml`` and in the history entry."""
    run_dir = Path(cfg.run.dir)
    resolved = to_dict(cfg)
    text = yaml.safe_dump(resolved, sort_keys=False)
    if init_from:
        text = (
            f"# fine-tuned from {init_from['checkpoint']} (step {init_from['step']} of run "
            f"{init_from['run']!r}, sha256 {init_from['sha256']})\n{text}"
        )
    _write_atomic(run_dir / "config.yaml", text)
    entry: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "start_step": start_step,
        "resumed_from": None if resumed_from is None else str(resumed_from),
        "moved_aside": None if moved is None else str(moved),
        "config_hash": config_hash(cfg),
        "init_from": init_from,
        "argv": sys.argv,
        "config": resolved,
    }
    with open(run_dir / HISTORY_FILE, "a") as f:
        f.write(json.dumps(entry) + "\n")


def _rows(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


def truncate_metrics(path: Path, step: int, final: bool = False) -> int:
    """Drop rows of ``metrics.jsonl`` past ``step`` (a resume repeats them), and with ``final`` (a
    run at its last step, whose final validation runs again) its validation rows at ``step``;
    returns rows dropped."""
    kept, dropped = [], 0
    for line in _rows(path):
        try:
            row = json.loads(line)
            row_step = row.get("step", 0)
        except (json.JSONDecodeError, AttributeError):
            dropped += 1  # a line cut by a crash
            continue
        if row_step > step or (final and row_step == step and row.get("kind") == "val"):
            dropped += 1
        else:
            kept.append(line)
    if dropped:
        _write_atomic(path, "".join(x + "\n" for x in kept))
        log.info("metrics.jsonl: dropped %d rows past the resumed step %d", dropped, step)
    return dropped


def recorded_loss(run_dir: Path, step: int) -> float | None:
    """The training loss ``metrics.jsonl`` records for ``step`` (None: not logged)."""
    for line in reversed(_rows(run_dir / "metrics.jsonl")):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and row.get("kind") == "train" and row.get("step") == step:
            return row.get("loss")
    return None
