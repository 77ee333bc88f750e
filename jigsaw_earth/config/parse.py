"""YAML in, plain dicts out: reading a config file, command-line overrides, ``config show``.

``load_yaml`` reads YAML safely (no arbitrary objects), refuses duplicate keys (plain YAML
silently keeps the last one) and reads ``3e-4`` as a number, as YAML 1.2 does (YAML 1.1 reads a
float without a dot as a string). ``apply_overrides`` applies ``key.sub=value`` strings (values
read as YAML) to the raw mapping before parsing; the schema then checks the keys. ``describe``
lists every field of a section model with its type, default and documentation.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin

import typing_extensions
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from .base import bare_type

__all__ = ["UniqueKeyLoader", "apply_overrides", "describe", "load_yaml", "to_dict", "yaml_problem"]


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping and reads ``3e-4`` as a float."""

    yaml_implicit_resolvers: typing.ClassVar = {
        k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (line {seen[key]} and line {line}); keep one of them",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_timestamp(self, node: yaml.ScalarNode) -> Any:
        try:
            return super().construct_yaml_timestamp(node)  # type: ignore[no-untyped-call]
        except ValueError:  # an impossible date (2020-02-30) stays text: the schema names its key
            return self.construct_scalar(node)


UniqueKeyLoader.add_constructor("tag:yaml.org,2002:timestamp", UniqueKeyLoader.construct_yaml_timestamp)
UniqueKeyLoader.add_implicit_resolver(  # YAML 1.2 floats: an exponent without a dot or its sign
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_yaml(text: str) -> Any:
    """YAML → Python with ``UniqueKeyLoader`` (safe: no arbitrary objects; no duplicate keys)."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader subclass


def yaml_problem(err: yaml.YAMLError) -> str:
    """PyYAML's error on one line; a value starting with ``*`` or ``&`` (a YAML alias or anchor, as
    in a freeze pattern ``*norm*``) gets the fix: quote it."""
    context = str(getattr(err, "context", "") or "")
    if "alias" in context or "anchor" in context:
        mark = getattr(err, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return (
            f"a value starting with * or & is read as a YAML alias or anchor{where}: quote it, e.g. "
            "training.freeze='[\"*norm*\"]' on the command line, freeze: ['*norm*'] in a file"
        )
    return " ".join(str(err).split())  # one line: PyYAML's message spans several


def to_dict(obj: Any) -> Any:
    """Plain (YAML/JSON-ready) form of a parsed config."""
    if isinstance(obj, BaseModel):
        return {name: to_dict(getattr(obj, name)) for name in type(obj).model_fields}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set ``a.b.c=value`` items in ``raw`` (in place; values parsed as YAML, e.g. ``1e-3``, ``[1,2]``)."""
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r}: write KEY.SUB=VALUE, e.g. optim.lr=3e-4")
        try:
            value = load_yaml(text) if text.strip() else None
        except yaml.YAMLError as err:
            raise ValueError(
                f"override {item!r}: cannot read value {text!r} as YAML ({yaml_problem(err)})"
            ) from None
        *parents, last = key.split(".")
        node = raw
        for depth, part in enumerate(parents):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(parents[: depth + 1])
                raise ValueError(f"override {item!r}: {where} is not a mapping; write {where}=VALUE")
            node = child
        node[last] = value
    return raw


def _type_name(tp: Any) -> str:
    tp = bare_type(tp)
    args = get_args(tp)
    if get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in args)
    if get_origin(tp) in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if get_origin(tp) is not None:
        return f"{get_origin(tp).__name__}[{', '.join(_type_name(a) for a in args)}]"
    return "None" if tp is type(None) else "..." if tp is Ellipsis else getattr(tp, "__name__", str(tp))


def _line(prefix: str, name: str, tp: Any, default: Any, text: str | None) -> str:
    shown = " (required)" if default is PydanticUndefined else f" = {default!r}"
    return f"{prefix}{name}: {_type_name(tp)}{shown}  # {text or ''}"


def describe(cls: type[BaseModel], prefix: str = "") -> list[str]:
    """``key: type = default  # doc`` lines for every field, nested sections included."""
    hints = typing.get_type_hints(cls, include_extras=True)
    lines = []
    for name, f in cls.model_fields.items():
        tp = bare_type(hints[name])
        choices = [bare_type(a) for a in get_args(tp)]  # a union's members may carry a Tag
        variants = [a for a in choices if isinstance(a, type) and issubclass(a, BaseModel)]
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            variants = [tp]
        if variants:  # a section, or one section per choice of a union
            lines.append(f"{prefix}{name}:  # {f.description}")
            for section in variants:
                if len(variants) > 1:
                    lines.append(f"{prefix}  # {section.__doc__}")
                lines.extend(describe(section, prefix + "  "))
        elif typing_extensions.is_typeddict(tp):  # a mapping of optional typed keys (model overrides)
            lines.append(f"{prefix}{name}:  # {f.description}")
            for key, kt in typing.get_type_hints(tp, include_extras=True).items():
                info = next((m for m in get_args(kt)[1:] if isinstance(m, FieldInfo)), FieldInfo())
                extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
                lines.append(_line(prefix + "  ", key, kt, extra.get("default"), info.description))
        else:
            default = f.default_factory() if f.default_factory else f.default  # type: ignore[call-arg]
            lines.append(_line(prefix, name, tp, default, f.description))
    return lines
