"""The ``model`` section: one section per model, generated from ``models/presets.py``.

``model.name`` picks the section (a union discriminated on ``name``; absent = weathermixer);
``model.preset`` is a Literal of that model's presets and ``model.overrides`` a mapping typed
from the model's own config dataclass: every key optional (unset keys keep the preset's value),
unknown keys refused, each value of the dataclass field's type. Written once: a model or preset
added to ``models/presets.py`` appears here, in ``config show`` and in the JSON schema.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BeforeValidator, Field, create_model
from typing_extensions import TypedDict  # pydantic needs it on Python < 3.12

from ..models.presets import CONFIGS, PRESETS
from .base import Section, doc

__all__ = ["DEFAULT_MODEL", "MODEL_SECTIONS", "ModelConfig"]

DEFAULT_MODEL = "weathermixer"
DEFAULT_PRESET = "tiny"


def _yaml_type(tp: Any) -> Any:
    """YAML has lists, not tuples (``make_config`` turns a list back into the tuple): a
    ``tuple[X, ...]`` is a list of X, a ``tuple[X, X]`` a list of exactly two, also inside unions."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return list[args[0]]
        return Annotated[list[args[0]], Field(min_length=len(args), max_length=len(args))]
    if origin in (Union, types.UnionType):
        return Union[tuple(_yaml_type(a) for a in args)]  # noqa: UP007
    return tp


def _overrides(name: str, cls: type) -> type:
    """A TypedDict of ``cls``'s fields, each documented with the values its presets set."""
    hints = typing.get_type_hints(cls)
    keys = {}
    for f in dataclasses.fields(cls):
        by_preset = [f"{p} {v[f.name]!r}" for p, v in PRESETS[name].items() if f.name in v]
        text = f"{cls.__name__}.{f.name}" + (f"; presets: {', '.join(by_preset)}" if by_preset else "")
        default = list(f.default) if isinstance(f.default, tuple) else f.default
        keys[f.name] = Annotated[
            _yaml_type(hints[f.name]), Field(description=text, json_schema_extra={"default": default})
        ]
    overrides = TypedDict(f"{cls.__name__}Overrides", keys, total=False)  # type: ignore[misc]
    overrides.__pydantic_config__ = Section.model_config  # type: ignore[attr-defined]
    return overrides


def _section(name: str, cls: type) -> type[Section]:
    presets = tuple(PRESETS[name])
    return create_model(  # type: ignore[no-any-return, call-overload]
        f"{cls.__name__.removesuffix('Config')}Section",
        __base__=Section,
        __doc__=f"model.name: {name} — {(cls.__doc__ or '').strip().splitlines()[0]}",
        name=(Literal[name], doc("model architecture", name if name == DEFAULT_MODEL else ...)),
        preset=(Literal[presets], doc(f"size preset of {name} (models/presets.py)", DEFAULT_PRESET)),
        overrides=(_overrides(name, cls), doc(f"{cls.__name__} fields over the preset's", factory=dict)),
    )


MODEL_SECTIONS: dict[str, type[Section]] = {name: _section(name, cls) for name, cls in CONFIGS.items()}


def _default_name(value: Any) -> Any:
    if value is None:
        return {"name": DEFAULT_MODEL}
    if isinstance(value, dict) and "name" not in value:
        return {"name": DEFAULT_MODEL, **value}
    return value


ModelConfig = Annotated[
    Union[tuple(MODEL_SECTIONS.values())],  # type: ignore[valid-type]  # noqa: UP007
    Field(discriminator="name"),
    BeforeValidator(_default_name),
]
