"""The ``model`` section: one section per registered model, generated from the model registry.

``model.name`` picks the section (a union discriminated on ``name``; absent = weathermixer);
``model.preset`` is a Literal of that model's presets and ``model.overrides`` a mapping typed
from the model's own config dataclass: every key optional (unset keys keep the preset's value),
unknown keys refused, each value of the dataclass field's type. Written once: a model or preset
registered (``models/registry.py``: built-ins, ``register_model``, entry points) appears here, in
``config show`` and in the JSON schema. A ``model.name`` of the form ``package.module:Class``
selects the ``external`` section: the class is imported and its preset and overrides checked
against its own ``config_cls`` and ``presets`` when the config is parsed.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BeforeValidator, Discriminator, Field, Tag, create_model, model_validator
from typing_extensions import TypedDict  # pydantic needs it on Python < 3.12

from ..models.registry import ModelEntry, model_entry, model_names
from .base import Section, doc

__all__ = ["DEFAULT_MODEL", "MODEL_SECTIONS", "ExternalModelSection", "ModelConfig"]

DEFAULT_MODEL = "weathermixer"


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


def _overrides(entry: ModelEntry) -> type:
    """A TypedDict of the config's fields, each documented with the values its presets set."""
    cls = entry.config_cls
    if cls is None:
        return TypedDict(f"{entry.name}Overrides", {}, total=False)  # type: ignore[operator]
    hints = typing.get_type_hints(cls)
    keys = {}
    for f in dataclasses.fields(cls):
        by_preset = [f"{p} {v[f.name]!r}" for p, v in entry.presets.items() if f.name in v]
        text = f"{cls.__name__}.{f.name}" + (f"; presets: {', '.join(by_preset)}" if by_preset else "")
        default = list(f.default) if isinstance(f.default, tuple) else f.default
        keys[f.name] = Annotated[
            _yaml_type(hints[f.name]), Field(description=text, json_schema_extra={"default": default})
        ]
    overrides = TypedDict(f"{cls.__name__}Overrides", keys, total=False)  # type: ignore[misc]
    overrides.__pydantic_config__ = Section.model_config  # type: ignore[attr-defined]
    return overrides


def _section(entry: ModelEntry) -> type[Section]:
    name, cls = entry.name, entry.config_cls
    title = cls.__name__.removesuffix("Config") if cls is not None else name
    about = (cls.__doc__ if cls is not None else entry.cls().__doc__) or name
    return create_model(  # type: ignore[no-any-return, call-overload]
        f"{title}Section",
        __base__=Section,
        __doc__=f"model.name: {name} — {about.strip().splitlines()[0]}",
        name=(Literal[name], doc("model architecture", name if name == DEFAULT_MODEL else ...)),
        preset=(Literal[tuple(entry.presets)], doc(f"size preset of {name}", entry.default_preset)),
        overrides=(_overrides(entry), doc(f"{title} config fields over the preset's", factory=dict)),
        noise_channels=(int, _noise_doc()),
    )


def _noise_doc() -> Any:
    return doc(
        "K standard-normal noise channels appended to the static inputs each step (a stochastic model "
        "for ensembles, docs/ensembles.md; the model is built with n_static + K static channels); "
        "0 = deterministic",
        0,
        ge=0,
    )


MODEL_SECTIONS: dict[str, type[Section]] = {name: _section(model_entry(name)) for name in model_names()}


class ExternalModelSection(Section):
    """model.name: package.module:Class — your own model, checked against its config_cls and presets."""

    name: str = doc(
        "your model class as package.module:Class (docs/models.md, 'Write your own model')",
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$",
    )
    preset: str | None = doc("a preset of the class's presets (absent: its first, or 'tiny')", None)
    overrides: dict[str, Any] = doc("config_cls fields over the preset's", factory=dict)
    noise_channels: int = _noise_doc()

    @model_validator(mode="after")
    def _resolve(self) -> ExternalModelSection:
        entry = model_entry(self.name)  # imports the class; one-line errors name the path
        entry.config(self.preset, **self.overrides)
        if self.preset is None:
            self.preset = entry.default_preset
        return self


def _pick(value: Any) -> str:
    name = value.get("name") if isinstance(value, dict) else getattr(value, "name", None)
    return name if name in MODEL_SECTIONS or not isinstance(name, str) or ":" not in name else "external"


def _default_name(value: Any) -> Any:
    if value is None:
        return {"name": DEFAULT_MODEL}
    if isinstance(value, dict) and "name" not in value:
        return {"name": DEFAULT_MODEL, **value}
    return value


ModelConfig = Annotated[
    Union[  # type: ignore[valid-type]  # noqa: UP007
        tuple(
            [Annotated[s, Tag(n)] for n, s in MODEL_SECTIONS.items()]
            + [Annotated[ExternalModelSection, Tag("external")]]
        )
    ],
    Discriminator(_pick),
    BeforeValidator(_default_name),
]
