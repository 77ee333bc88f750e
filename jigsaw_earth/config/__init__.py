"""Typed training configuration: YAML → ``TrainConfig`` with overrides and cross-field checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .errors import one_line
from .parse import apply_overrides, describe, load_yaml, to_dict, yaml_problem
from .schema import TrainConfig

__all__ = ["TrainConfig", "describe", "load_config", "parse_config", "to_dict"]


def parse_config(raw: dict[str, Any], overrides: list[str] | None = None) -> TrainConfig:
    """Parse a raw mapping (plus ``key.sub=value`` overrides) into a ``TrainConfig``."""
    if not isinstance(raw, dict):
        raise ValueError(f"config: the top level must be a mapping of sections, got {type(raw).__name__}")
    raw = apply_overrides(dict(raw), list(overrides or []))
    try:
        return TrainConfig.model_validate(raw)
    except ValidationError as err:
        raise ValueError(one_line(err, TrainConfig)) from None


def load_config(
    path: str | Path, overrides: list[str] | None = None, world_size: int | None = None
) -> TrainConfig:
    """Read ``path`` safely (no arbitrary objects, no duplicate keys), apply overrides, check."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} not found; pass the path of a YAML file")
    try:
        raw = load_yaml(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"config {str(path)!r} is not valid YAML: {yaml_problem(err)}") from None
    except UnicodeDecodeError:
        raise ValueError(f"config {str(path)!r} is not a UTF-8 text file; pass a YAML config") from None
    cfg = parse_config(raw, overrides)
    cfg.check(world_size)
    return cfg
