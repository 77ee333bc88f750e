"""A run directory belongs to one run: starts that would discard or shadow checkpoints refuse.

``claim_run_dir`` (rank 0, before any file of the run is written) decides whether this start
continues the run in ``run.dir``, starts a new one there, or must refuse:

* ``checkpoint.resume=never`` where checkpoints exist would overwrite them (a new step_N replaces
  the old one) or shadow them (``latest`` and pruning would mix two runs): refused;
* ``resume=auto`` with a newest checkpoint beyond ``training.steps`` (a shorter new run), or one
  written with another model/data/loss/batch configuration: refused;
* ``resume=PATH`` from outside this run directory while it holds checkpoints: refused;
* a ``training.init_from`` other than the one the run started from (or one naming this run):
  refused, naming the recorded parent (``_lineage_conflict``).

A run whose newest checkpoint is at ``training.steps`` and whose ``summary.json`` says so is
finished: ``finished_step`` finds it, and the trainer raises ``RunFinished`` before anything is
read or written (``train`` says so and exits 0; raising ``training.steps`` continues the run).
A config file that is another run directory's ``config.yaml`` (a run moved or copied) is refused
unless ``run.dir`` names that directory (``check_config_home``).

A live run holds ``RUN_DIR/run.lock`` (``locks.PathLock``: pid, host, start time and command line)
from its preflight to its end: a second start on the same directory — ``--new-run`` included —
refuses at once, naming the first; a lock left by a run that died is taken over with a warning.

``--new-run`` moves the old run aside (``RUN_DIR`` → ``RUN_DIR.old-K``, the name is logged and
returned) and starts fresh. ``record_start`` then writes ``config.yaml`` and appends the start to
``history.jsonl``; ``truncate_metrics`` drops rows past the resumed step from ``metrics.jsonl``.
"""

from __future__ import annotations

import copy
import hashlib
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
from ..data.outputs import check_run_dir
from ..data.preflight import default_climatology_path
from ..locks import LockHeld, PathLock, describe_holder

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
HISTORY_FILE = "history.jsonl"
LOCK_FILE = "run.lock"
_LOCK_FIX = "wait for it to finish, stop it, or choose another run.dir"
_RUN_FILES = ("checkpoints", "metrics.jsonl", "config.yaml", HISTORY_FILE, "summary.json")


class RunDirError(ValueError):
    """This start would discard or shadow the checkpoints of another run."""


class RunFinished(Exception):
    """The run in ``run.dir`` has reached ``training.steps``: nothing to train, nothing written."""

    def __init__(self, message: str, run_dir: Path, step: int):
        super().__init__(message)
        self.run_dir, self.step = run_dir, step


_LATER_KEYS = (
    ("model", "noise_channels", 0),
    ("loss", "kind", "mse"),
    ("loss", "alpha", 0.95),
    ("loss", "mse_weight", 0.0),
)


#: how the data are read, not which: changing them (as the step line's data-wait warning advises)
#: must not stop a run from resuming
_READING_KEYS = ("prefetch", "read_threads")


def _resume_key(resolved: dict[str, Any], reading: bool = False) -> dict[str, Any]:
    """What must not change across a resume, from a resolved config (``to_dict``, or a
    ``history.jsonl`` entry's ``config``): model, data, loss, the global batch and members."""
    key = {k: copy.deepcopy(resolved.get(k) or {}) for k in ("model", "data", "loss")}
    if not reading:
        for name in _READING_KEYS:
            key["data"].pop(name, None)
    training = resolved.get("training") or {}
    key["batch_size"] = training.get("batch_size")
    if training.get("members", 1) != 1:
        key["members"] = training["members"]
    # keys added for ensembles count only when set, so runs started before them still resume
    for section, name, default in _LATER_KEYS:
        if key[section].get(name) == default:
            del key[section][name]
    return key


def _digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def config_hash(cfg: TrainConfig, reading: bool = False) -> str:
    """Hash of what must not change across a resume (model, data, loss, global batch).
    ``reading``: include the reading keys, as runs started before they were left out did."""
    return _digest(_resume_key(to_dict(cfg), reading))


def resumes(saved_hash: str | None, cfg: TrainConfig) -> bool:
    """Whether a checkpoint written under ``saved_hash`` may be resumed with ``cfg`` (no hash: old
    checkpoints; the hash with the reading keys: runs started before they were left out)."""
    return saved_hash in (None, config_hash(cfg), config_hash(cfg, reading=True))


def _step_of(path: Path) -> int:
    return int(path.name.split("_")[-1])


#: names of the resume key's entries as a config writes them
_KEY_NAMES = {"batch_size": "training.batch_size", "members": "training.members"}


def _flat(value: Any, key: str) -> dict[str, Any]:
    if isinstance(value, dict):
        return {k: v for name, item in value.items() for k, v in _flat(item, f"{key}.{name}").items()}
    return {key: value}


def _resume_differences(run_dir: Path, saved_hash: str | None, cfg: TrainConfig) -> list[str]:
    """``key=value (the run has value)`` for every resume key that differs from the config the
    checkpoint was written with (the last ``history.jsonl`` entry of that hash); [] when unknown."""
    try:
        lines = (run_dir / HISTORY_FILE).read_text().splitlines()
    except OSError:
        return []
    b = _flat_key(_resume_key(to_dict(cfg)))
    for line in reversed(lines):
        try:
            config = json.loads(line)["config"]
            old = _resume_key(config)
            hashes = (_digest(old), _digest(_resume_key(config, reading=True)))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        if saved_hash in hashes:
            a = _flat_key(old)
            keys = sorted(set(a) | set(b))
            return [f"{k}={b.get(k)!r} (the run has {a.get(k)!r})" for k in keys if a.get(k) != b.get(k)]
    return []


def _flat_key(key: dict[str, Any]) -> dict[str, Any]:
    """A resume key as ``section.name`` → value, named as a config writes them."""
    return {k: v for name, item in key.items() for k, v in _flat(item, _KEY_NAMES.get(name, name)).items()}


def _inside_run(init_from: str, run_dir: Path) -> bool:
    """Whether ``training.init_from`` names this run directory or something in its checkpoints."""
    path, run = Path(init_from).expanduser().resolve(), run_dir.expanduser().resolve()
    return path == run or run / "checkpoints" in (path, *path.parents)


def _names_parent(init_from: str, recorded: Path) -> bool:
    """Whether ``training.init_from`` names the recorded parent checkpoint: the checkpoint, its
    checkpoints folder or its ``latest`` file, or its run directory."""
    path = Path(init_from).expanduser().resolve()
    return path in (recorded, recorded.parent, recorded.parent / "latest", recorded.parent.parent)


def _lineage_conflict(cfg: TrainConfig, run_dir: Path, ckpt: Path) -> str | None:
    """Why ``training.init_from`` disagrees with the run the checkpoint ``ckpt`` continues."""
    init_from = cfg.training.init_from
    if init_from and _inside_run(init_from, run_dir):
        return (
            f"training.init_from={init_from!r} is this run (run.dir={str(run_dir)!r}); a run continues "
            f"from its own checkpoints with checkpoint.resume, not init_from: drop training.init_from"
        )
    lineage = read_meta(ckpt)["state"].get("init_from")
    recorded = lineage.get("checkpoint") if isinstance(lineage, dict) else None
    if (init_from or None) is None and recorded is None:
        return None
    if init_from and recorded and _names_parent(init_from, Path(recorded)):
        return None
    where = f"the run in run.dir {str(run_dir)!r}"
    if recorded is None:
        return (
            f"training.init_from={init_from!r}, but {where} started without a parent (its checkpoints "
            f"record none), and a run keeps how it started: drop training.init_from to continue it, or "
            f"start a new run from {init_from} (another run.dir, or --new-run)"
        )
    given = "training.init_from is not set" if not init_from else f"training.init_from={init_from!r}"
    return (
        f"{given}, but {where} was fine-tuned from {recorded} (its checkpoints and {HISTORY_FILE} "
        f"record it), and a run keeps its parent: set training.init_from={recorded} to continue it, or "
        f"start a new run{'' if not init_from else f' from {init_from}'} (another run.dir, or --new-run)"
    )


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
        saved = read_meta(newest)["state"].get("config_hash")
        if not resumes(saved, cfg):
            differs = _resume_differences(run_dir, saved, cfg)
            what = f": {'; '.join(differs)}" if differs else ""
            return (
                f"{held}, written with another model/data/loss/batch configuration{what} "
                f"(see {run_dir}/config.yaml), so this config cannot resume it"
            )
        return _lineage_conflict(cfg, run_dir, newest)
    source = Path(mode).resolve()
    if source.parent != (run_dir / "checkpoints").resolve():
        return f"{held}; checkpoint.resume={mode} starts another run from outside it"
    return _lineage_conflict(cfg, run_dir, source)


def finished_step(cfg: TrainConfig, new_run: bool = False) -> int | None:
    """The step of the run in ``run.dir`` when it is finished: the checkpoint this start would
    resume is at ``training.steps`` and ``summary.json`` records that step (a run stopped between
    its last checkpoint and its summary is not finished: its final validation runs again)."""
    run_dir, mode = Path(cfg.run.dir), cfg.checkpoint.resume
    if new_run or mode == "never":
        return None
    ckpt = latest_checkpoint(run_dir) if mode == "auto" else Path(mode)
    if ckpt is None or ckpt.resolve().parent != (run_dir / "checkpoints").resolve():
        return None
    step = _step_of(ckpt)
    if step != cfg.training.steps:
        return None
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return step if isinstance(summary, dict) and summary.get("steps") == step else None


def finished_message(cfg: TrainConfig, step: int) -> str:
    run_dir = Path(cfg.run.dir)
    return (
        f"run.dir {str(run_dir)!r} is already at step {step} of {cfg.training.steps}: the run is finished, "
        f"and nothing was trained or written (summary.json, metrics.jsonl, validation.txt and the "
        f"checkpoints are as they were). Raise training.steps to continue it (e.g. "
        f"training.steps={2 * step}), or pass --new-run to start a new run there"
    )


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


def check_place(
    cfg: TrainConfig, config_file: str | Path | None = None, overrides: Sequence[str] = ()
) -> None:
    """``run.dir`` is a place for a run (``data.outputs.check_run_dir``): not in or around the data
    or climatology store, and no file a run writes that another hand put there (``config_file``,
    the config being trained, may be its ``config.yaml``); no live run holds it; and the config
    file is not another run directory's ``config.yaml`` (``check_config_home``)."""
    d = cfg.data
    stores = (
        ("data store data.store", d.store),
        ("climatology", d.climatology or default_climatology_path(d.store)),
    )
    check_config_home(cfg, config_file, overrides)
    check_run_dir(cfg.run.dir, stores, config_file)
    _refuse_if_held(Path(cfg.run.dir))  # at once, before the mesh and the model are built


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
