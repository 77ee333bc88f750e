"""Which config items decide a model's shapes and the meaning of its channels, and the check that two
configs agree on them (a checkpoint's run config, a shared model's contract)."""

from __future__ import annotations

from typing import Any

from .parse import to_dict
from .schema import TrainConfig

__all__ = ["SHAPE_KEYS", "compare_shape_keys"]

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
