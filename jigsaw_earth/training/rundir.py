"""A run directory belongs to one run: starts that would discard or shadow checkpoints refuse.

``claim_run_dir`` (rank 0, before any file of the run is written) decides whether this start
continues the run in ``run.dir``, starts a new one there, or must refuse:

* ``checkpoint.resume=never`` where checkpoints exist would overwrite them (a new step_N replaces
  the old one) or shadow them (``latest`` and pruning would mix two runs): refused;
* ``resume=auto`` with a newest checkpoint beyond ``training.steps`` (a shorter new run), or one
  written with another model/data/loss/batch configuration: refused;
* ``resume=PATH`` from outside this run directory while it holds checkpoints: refused.

A live run holds ``RUN_DIR/run.lock`` (``locks.PathLock``: pid, host, start time and command line)
from its preflight to its end: a second start on the same directory — ``--new-run`` included —
refuses at once, naming the first; a lock left by a run that died is taken over with a warning.

``--new-run`` moves the old run aside (``RUN_DIR`` → ``RUN_DIR.old-K``, the name is logged and
returned) and starts fresh. ``record_start`` then writes ``config.yaml`` and appends the start to
``history.jsonl``; ``truncate_metrics`` drops rows past the resumed step from ``metrics.jsonl``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from ..checkpoint import latest_checkpoint, list_checkpoints, read_meta
from ..config.parse import to_dict
from ..config.schema import TrainConfig
from ..data.outputs import check_run_dir
from ..data.preflight import default_climatology_path
from ..locks import LockHeld, PathLock, describe_holder

__all__ = [
    "HISTORY_FILE",
    "LOCK_FILE",
    "RunDirError",
    "check_place",
    "claim_run_dir",
    "config_hash",
    "lock_run_dir",
    "record_start",
    "resumes",
    "truncate_metrics",
]

log = logging.getLogger(__name__)
HISTORY_FILE = "history.jsonl"
LOCK_FILE = "run.lock"
_LOCK_FIX = "wait for it to finish, stop it, or choose another run.dir"
_RUN_FILES = ("checkpoints", "metrics.jsonl", "config.yaml", HISTORY_FILE, "summary.json")


class RunDirError(ValueError):
    """This start would discard or shadow the checkpoints of another run."""


_LATER_KEYS = (
    ("model", "noise_channels", 0),
    ("loss", "kind", "mse"),
    ("loss", "alpha", 0.95),
    ("loss", "mse_weight", 0.0),
)


#: how the data are read, not which: changing them (as the step line's data-wait warning advises)
#: must not stop a run from resuming
_READING_KEYS = ("prefetch", "read_threads")


def config_hash(cfg: TrainConfig, reading: bool = False) -> str:
    """Hash of what must not change across a resume (model, data, loss, global batch).
    ``reading``: include the reading keys, as runs started before they were left out did."""
    key = {k: to_dict(getattr(cfg, k)) for k in ("model", "data", "loss")}
    if not reading:
        for name in _READING_KEYS:
            key["data"].pop(name, None)
    elif key["data"].get("read_threads") == "auto":
        key["data"]["read_threads"] = 2  # its default while hashes held it
    key["batch_size"] = cfg.training.batch_size
    if cfg.training.members != 1:
        key["members"] = cfg.training.members
    # keys added for ensembles count only when set, so runs started before them still resume
    for section, name, default in _LATER_KEYS:
        if key[section].get(name) == default:
            del key[section][name]
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def resumes(saved_hash: str | None, cfg: TrainConfig) -> bool:
    """Whether a checkpoint written under ``saved_hash`` may be resumed with ``cfg`` (no hash: old
    checkpoints; the hash with the reading keys: runs started before they were left out)."""
    return saved_hash in (None, config_hash(cfg), config_hash(cfg, reading=True))


def _step_of(path: Path) -> int:
    return int(path.name.split("_")[-1])


def _conflict(cfg: TrainConfig, run_dir: Path) -> str | None:
    """Why this start would lose or shadow checkpoints in ``run_dir`` (``None``: it would not)."""
    found = list_checkpoints(run_dir)
    if not found:
        return None
    newest = latest_checkpoint(run_dir) or found[-1]
    held = f"run.dir {str(run_dir)!r} holds checkpoints of an earlier run up to step {_step_of(newest)}"
    mode, steps = cfg.checkpoint.resume, cfg.training.steps
    if mode == "never":
        return f"{held}; checkpoint.resume=never would overwrite or shadow them"
    if mode == "auto":
        if _step_of(newest) > steps:
            return (
                f"{held}, beyond training.steps={steps}; a shorter run here would prune its own checkpoints "
                f"(set training.steps >= {_step_of(newest)} to continue that run)"
            )
        if not resumes(read_meta(newest)["state"].get("config_hash"), cfg):
            return (
                f"{held}, written with another model/data/loss/batch configuration "
                f"(see {run_dir}/config.yaml), so this config cannot resume it"
            )
        return None
    source = Path(mode).resolve()
    if source.parent != (run_dir / "checkpoints").resolve():
        return f"{held}; checkpoint.resume={mode} starts another run from outside it"
    return None


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


def _refuse_if_held(run_dir: Path) -> None:
    held = PathLock.holder(run_dir / LOCK_FILE)
    if held is not None:
        raise RunDirError(
            f"run.dir {str(run_dir)!r} is in use by another run: {describe_holder(held)} holds "
            f"{run_dir / LOCK_FILE}; nothing was changed. {_LOCK_FIX[0].upper()}{_LOCK_FIX[1:]}"
        )


def check_place(cfg: TrainConfig, config_file: str | Path | None = None) -> None:
    """``run.dir`` is a place for a run (``data.outputs.check_run_dir``): not in or around the data
    or climatology store, and no file a run writes that another hand put there (``config_file``,
    the config being trained, may be its ``config.yaml``); and no live run holds it."""
    d = cfg.data
    stores = (
        ("data store data.store", d.store),
        ("climatology", d.climatology or default_climatology_path(d.store)),
    )
    check_run_dir(cfg.run.dir, stores, config_file)
    _refuse_if_held(Path(cfg.run.dir))  # at once, before the mesh and the model are built


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


def truncate_metrics(path: Path, step: int) -> int:
    """Drop rows of ``metrics.jsonl`` past ``step`` (a resume repeats them); returns rows dropped."""
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            row_step = json.loads(line).get("step", 0)
        except (json.JSONDecodeError, AttributeError):
            dropped += 1  # a line cut by a crash
            continue
        if row_step > step:
            dropped += 1
        else:
            kept.append(line)
    if dropped:
        _write_atomic(path, "".join(x + "\n" for x in kept))
        log.info("metrics.jsonl: dropped %d rows past the resumed step %d", dropped, step)
    return dropped
