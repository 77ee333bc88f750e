"""JSON schema of the training config for editors (``jigsaw-earth config schema [--out PATH]``).

pydantic v2 derives the schema from the ``TrainConfig`` dataclasses; each field's documentation
(``doc(...)``) becomes its ``description``, every section refuses unknown keys
(``additionalProperties: false``, as the parser does), and ``model.name``/``model.preset`` list
the valid choices. Editors with a YAML language server use it via
``# yaml-language-server: $schema=jigsaw-earth.schema.json`` on a config's first line.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from .schema import TrainConfig

__all__ = ["json_schema"]


def _sections(cls: type, doc: str, found: dict[str, tuple[type, str]]) -> dict[str, tuple[type, str]]:
    """Every section dataclass under ``cls`` by name, with the documentation of its field."""
    found[cls.__name__] = (cls, doc)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp) and tp.__name__ not in found:
            _sections(tp, f.metadata.get("doc", tp.__name__), found)
    return found


def json_schema() -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of a training config file."""
    from pydantic import TypeAdapter

    from ..models.presets import _CONFIGS, PRESETS

    schema = TypeAdapter(TrainConfig).json_schema()
    defs = schema.setdefault("$defs", {})
    for name, (cls, doc) in _sections(TrainConfig, "jigsaw-earth training config", {}).items():
        node = schema if cls is TrainConfig else defs.get(name)
        if node is None:
            continue
        node["additionalProperties"] = False
        node["description"] = doc
        for f in dataclasses.fields(cls):
            prop = node.get("properties", {}).get(f.name)
            if prop is not None and f.metadata.get("doc"):
                prop["description"] = f.metadata["doc"]
    model = defs["ModelConfig"]["properties"]
    model["name"]["enum"] = list(PRESETS)
    model["preset"]["enum"] = sorted({p for presets in PRESETS.values() for p in presets}, key=str)
    options = "; ".join(
        f"{name}: {', '.join(f.name for f in dataclasses.fields(cls))}" for name, cls in _CONFIGS.items()
    )
    model["overrides"]["description"] += f" (options per model — {options})"
    schema["title"] = "jigsaw-earth training config"
    schema["description"] = "jigsaw-earth train CONFIG; every field: jigsaw-earth config show"
    return schema
