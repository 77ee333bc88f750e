"""Whether a start continues the run in ``run.dir``: what it must agree with, and when it is done.

* The resume key (``config_hash``): model, data, loss, the global batch and members; a checkpoint
  resumes only under the same key (``resumes``). A refusal names every key that differs from the
  configuration the checkpoint was written with (``resume_differences``, from ``history.jsonl``).
* The parent a fine-tune keeps (``lineage_conflict``): a later start's ``training.init_from`` must
  name the parent its checkpoints record (the checkpoint, its run directory, its ``checkpoints``
  folder or ``latest``), none when they record none, and never the run itself.
* A finished run (``finished_step``): the checkpoint a start would resume is at
  ``training.steps`` and ``summary.json`` records that step. The trainer raises ``RunFinished``
  before anything is read or written; raising ``training.steps`` continues the run.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

from ..checkpoint import latest_checkpoint, read_meta
from ..config.parse import to_dict
from ..config.schema import TrainConfig

__all__ = [
    "HISTORY_FILE",
    "RunFinished",
    "config_hash",
    "finished_message",
    "finished_step",
    "lineage_conflict",
    "resume_differences",
    "resumes",
    "step_of",
]

HISTORY_FILE = "history.jsonl"


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
    elif key["data"].get("read_threads") == "auto":
        key["data"]["read_threads"] = 2  # its default while hashes held it
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


def step_of(path: Path) -> int:
    return int(path.name.split("_")[-1])


#: names of the resume key's entries as a config writes them
_KEY_NAMES = {"batch_size": "training.batch_size", "members": "training.members"}


def _flat(value: Any, key: str) -> dict[str, Any]:
    if isinstance(value, dict):
        return {k: v for name, item in value.items() for k, v in _flat(item, f"{key}.{name}").items()}
    return {key: value}


def resume_differences(run_dir: Path, saved_hash: str | None, cfg: TrainConfig) -> list[str]:
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


def lineage_conflict(cfg: TrainConfig, run_dir: Path, ckpt: Path) -> str | None:
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
    step = step_of(ckpt)
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
