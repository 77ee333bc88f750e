"""Read-only access to a trained run for inference: which checkpoint, is this config its config.

Nothing here writes to the run directory: no claim, no ``config.yaml``, no ``history.jsonl``
entry, no optimizer (the trainer's ``rundir.py`` does those for training only). The checkpoint
is pinned while it is read (``checkpoint.pinned``) so a training run pruning the same directory
skips it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..checkpoint import latest_checkpoint, read_meta
from ..config.parse import to_dict
from ..config.schema import TrainConfig
from ..data.preflight import default_climatology_path

__all__ = [
    "SHAPE_KEYS",
    "check_against_checkpoint",
    "compare_shape_keys",
    "find_checkpoint",
    "protected_paths",
]

# Config items that decide the model's parameters or the meaning of its channels: a forecast with
# any of them changed would load the wrong shapes or read the wrong variables.
SHAPE_KEYS = (
    "model",
    "data.upper_air",
    "data.levels",
    "data.surface",
    "data.static",
    "data.step_hours",
    "loss.tendency_scaling",
)


def find_checkpoint(cfg: TrainConfig, checkpoint: str | None) -> Path:
    """``--checkpoint`` as given, else the newest complete checkpoint of ``run.dir``."""
    if checkpoint is not None:
        read_meta(checkpoint)  # complete, or an error naming what is missing
        return Path(checkpoint)
    found = latest_checkpoint(cfg.run.dir)
    if found is None:
        raise FileNotFoundError(
            f"no checkpoint in run directory {cfg.run.dir!r}: train first (jigsaw-earth train) "
            f"or pass --checkpoint"
        )
    return found


def _flat(tree: Any, prefix: str) -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out.update(_flat(v, f"{prefix}.{k}"))
    return out


def _pick(raw: dict[str, Any], key: str) -> Any:
    node: Any = raw
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def compare_shape_keys(cfg: TrainConfig, saved: dict[str, Any], where: str, fix: str) -> None:
    """Refuse a config whose ``SHAPE_KEYS`` differ from ``saved`` (a raw config), naming the item;
    ``fix`` may name ``{item}``."""
    mine = to_dict(cfg)
    for key in SHAPE_KEYS:
        a, b = _flat(_pick(mine, key), key), _flat(_pick(saved, key), key)
        for item in sorted(set(a) | set(b)):
            if a.get(item) != b.get(item):
                raise ValueError(
                    f"{item}={a.get(item)!r} differs from {b.get(item)!r} in {where}; {fix.format(item=item)}"
                )


def check_against_checkpoint(cfg: TrainConfig, checkpoint: Path) -> None:
    """Refuse a config whose model shape or channels differ from the checkpoint's run config.

    The checkpoint's config is its run directory's ``config.yaml`` (written by ``train``); a
    checkpoint copied without it is checked tensor by tensor when loaded.
    """
    saved_file = checkpoint.parent.parent / "config.yaml"
    if not saved_file.is_file():
        return
    try:
        saved = yaml.safe_load(saved_file.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return
    fix = "predict with the configuration it was trained with (drop the override of {item})"
    compare_shape_keys(cfg, saved, f"the config of checkpoint {checkpoint} ({saved_file})", fix)


def protected_paths(
    cfg: TrainConfig, checkpoint: Path, model: bool = False
) -> tuple[tuple[str, str | Path | None], ...]:
    """What ``predict --out`` may never be, contain or lie inside (``model``: ``checkpoint`` is a
    shared model's folder, ``predict --model``)."""
    d = cfg.data
    stores = (
        ("truth/training store data.store", d.store),
        ("climatology", d.climatology or default_climatology_path(d.store)),
    )
    if model:
        return (*stores, ("model folder", checkpoint))
    return (
        *stores,
        ("checkpoint folder", checkpoint.parent),
        ("checkpoints of run.dir", Path(cfg.run.dir) / "checkpoints"),
    )
