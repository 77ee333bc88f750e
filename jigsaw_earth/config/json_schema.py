"""JSON schema of the training config for editors (``jigsaw-earth config schema [--out PATH]``).

pydantic's ``model_json_schema`` of ``TrainConfig``: each field's documentation is its
``description``, every section refuses unknown keys (``additionalProperties: false``), limits
and choices are stated (``exclusiveMinimum``, ``enum``), and ``model`` is a ``oneOf`` keyed on
``model.name`` whose branches list that model's presets and its override keys with their types,
defaults and per-preset values. Editors with a YAML language server use it via
``# yaml-language-server: $schema=jigsaw-earth.schema.json`` on a config's first line.
"""

from __future__ import annotations

from typing import Any

from .schema import TrainConfig

__all__ = ["json_schema"]


def json_schema() -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of a training config file."""
    schema = TrainConfig.model_json_schema()
    schema["title"] = "jigsaw-earth training config"
    return schema
