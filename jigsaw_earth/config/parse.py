"""Typed parsing of plain dicts into documented dataclasses.

Every schema field carries its documentation in ``field(metadata={"doc": ...})``. ``parse``
converts a YAML mapping into the dataclass, rejecting unknown keys with the nearest valid name
and wrong types with the path, the value and the expected type. ``apply_overrides`` applies
``key.sub=value`` strings (values read as YAML scalars) to the raw mapping before parsing.
``load_yaml`` reads YAML safely (no arbitrary objects) and refuses duplicate keys, which plain
YAML silently resolves to the last one. Numbers must be finite (``nan``/``inf`` are refused);
an unquoted YAML date (``2020-01-01``) is accepted where a string is expected, as ISO text.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import difflib
import math
import types
import typing
from dataclasses import MISSING, field
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

__all__ = ["UniqueKeyLoader", "apply_overrides", "describe", "doc", "load_yaml", "parse", "to_dict"]

T = TypeVar("T")


def doc(text: str, default: Any = MISSING, factory: Any = MISSING) -> Any:
    """A dataclass field with documentation (and a default or a default factory)."""
    if factory is not MISSING:
        return field(default_factory=factory, metadata={"doc": text})
    if default is MISSING:
        return field(metadata={"doc": text})
    return field(default=default, metadata={"doc": text})


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping."""

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


def load_yaml(text: str) -> Any:
    """YAML → Python with ``UniqueKeyLoader`` (safe: no arbitrary objects; no duplicate keys)."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader subclass


def _nearest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{hint}valid keys: {', '.join(valid)}"


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value: Any, tp: Any, path: str) -> Any:
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise ValueError(f"config {path}: expected a mapping of {tp.__name__} fields, got {value!r}")
        return parse(tp, value, path)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, path)
            except ValueError as err:
                errors.append(str(err))
        raise ValueError(
            errors[0] if len(errors) == 1 else f"config {path}: {value!r} is not {_type_name(tp)}"
        )
    if origin is Literal:
        if value not in get_args(tp):
            choices = ", ".join(repr(a) for a in get_args(tp))
            raise ValueError(f"config {path}: {value!r} is not allowed; choose one of {choices}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"config {path}: expected a list, got {value!r}")
        (item,) = get_args(tp)[:1] or (Any,)
        items = [_convert(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"config {path}: expected a mapping, got {value!r}")
        kt, vt = get_args(tp) or (Any, Any)
        return {_convert(k, kt, f"{path}.<key>"): _convert(v, vt, f"{path}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"config {path}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"config {path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        number = value
        if isinstance(value, str):  # YAML 1.1 reads 3e-4 (no dot) as a string
            with contextlib.suppress(ValueError):
                number = float(value)
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise ValueError(f"config {path}: expected a number, got {value!r}")
        if not math.isfinite(number):
            raise ValueError(f"config {path}: {value!r} is not a finite number; give a finite value")
        return float(number)
    if tp is str:
        if isinstance(value, (datetime.date, datetime.datetime)):  # an unquoted YAML date
            return value.isoformat()
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ValueError(f"config {path}: expected a string, got {value!r}")
        return str(value)
    raise TypeError(f"config {path}: unsupported schema type {tp!r}")


def parse(cls: type[T], raw: dict[str, Any], path: str = "") -> T:
    """Build dataclass ``cls`` from ``raw``; unknown keys and wrong types raise ValueError."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key in raw:
        if key not in fields:
            where = f"{path}.{key}" if path else str(key)
            raise ValueError(f"config: unknown key {where!r}; {_nearest(str(key), list(fields))}")
    kwargs = {}
    for name, f in fields.items():
        where = f"{path}.{name}" if path else name
        if name in raw:
            kwargs[name] = _convert(raw[name], hints[name], where)
        elif f.default is MISSING and f.default_factory is MISSING:
            raise ValueError(f"config: missing required key {where!r} ({f.metadata.get('doc', '')})")
    return cls(**kwargs)


def to_dict(obj: Any) -> Any:
    """Plain (YAML/JSON-ready) form of a parsed config."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def apply_overrides(raw: dict[str, Any], overrides: list[str], schema: type | None = None) -> dict[str, Any]:
    """Set ``a.b.c=value`` items in ``raw`` (in place; values parsed as YAML, e.g. ``1e-3``, ``[1,2]``)."""
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r}: write KEY.SUB=VALUE, e.g. optim.lr=3e-4")
        try:
            value = load_yaml(text) if text.strip() else None
        except yaml.YAMLError as err:
            raise ValueError(f"override {item!r}: cannot read value {text!r} as YAML ({err})") from None
        parts = key.split(".")
        node, cls = raw, schema
        for depth, part in enumerate(parts):
            if cls is not None and dataclasses.is_dataclass(cls):
                names = [f.name for f in dataclasses.fields(cls)]
                if part not in names:
                    where = ".".join(parts[: depth + 1])
                    raise ValueError(f"override {item!r}: unknown key {where!r}; {_nearest(part, names)}")
                sub = typing.get_type_hints(cls)[part]
                cls = sub if dataclasses.is_dataclass(sub) else None
            if depth == len(parts) - 1:
                node[part] = value
            else:
                child = node.get(part)
                if child is None:
                    child = node[part] = {}
                if not isinstance(child, dict):
                    where = ".".join(parts[: depth + 1])
                    raise ValueError(f"override {item!r}: {where} is not a mapping; write {where}=VALUE")
                node = child
    return raw


def describe(cls: type, prefix: str = "") -> list[str]:
    """``key: type = default  # doc`` lines for every field, nested sections included."""
    hints = typing.get_type_hints(cls)
    lines = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            lines.append(f"{prefix}{f.name}:  # {f.metadata.get('doc', '')}")
            lines.extend(describe(tp, prefix + "  "))
            continue
        if f.default is not MISSING:
            default = f" = {f.default!r}"
        elif f.default_factory is not MISSING:
            default = f" = {f.default_factory()!r}"
        else:
            default = " (required)"
        lines.append(f"{prefix}{f.name}: {_type_name(tp)}{default}  # {f.metadata.get('doc', '')}")
    return lines
