"""Pydantic's validation errors as the project's one-line messages.

``config KEY=VALUE: what is wrong; the fix`` — the key as a dotted path (``data.levels[1]``,
``model.overrides.depth``; the union's tag is left out of it), the value as given, and the fix:
the nearest valid name for an unknown key or a bad choice, the expected type, the limit.
"""

from __future__ import annotations

import difflib
import re
import typing
from typing import Annotated, Any, Literal, get_args, get_origin

import typing_extensions
from pydantic import BaseModel, Discriminator, ValidationError
from pydantic.fields import FieldInfo

from .base import bare_type

__all__ = ["one_line"]

_EXPECTED = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "string": "a string (put it in quotes)",
    "list": "a list",
    "tuple": "a list",
    "dict": "a mapping",
}


def _nearest(key: str, valid: list[str]) -> str:
    """``did you mean 'x'? valid keys: ...`` for an unknown ``key``."""
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{hint}valid keys: {', '.join(valid)}"


def _hints(tp: Any) -> dict[str, Any]:
    """Field name → annotation of a section model or TypedDict (empty for anything else)."""
    if isinstance(tp, type) and (issubclass(tp, BaseModel) or typing_extensions.is_typeddict(tp)):
        return typing.get_type_hints(tp, include_extras=True)
    return {}


def _tagged(tp: Any) -> tuple[str, dict[Any, Any]] | None:
    """(discriminator, tag → section) of a discriminated union, else None."""
    if get_origin(tp) is not Annotated:
        return None
    found = [m.discriminator for m in get_args(tp)[1:] if isinstance(m, FieldInfo) and m.discriminator]
    if any(isinstance(m, Discriminator) for m in get_args(tp)[1:]):
        found = ["name"]  # the model union: tagged by model name, "external" for package.module:Class
    if not found:
        return None
    key = str(found[0])
    sections = [bare_type(s) for s in get_args(get_args(tp)[0])]
    tags = {}
    for s in sections:
        hint = _hints(s)[key]
        tags[get_args(hint)[0] if get_origin(hint) is Literal else "external"] = s
    return key, tags


def _walk(loc: tuple[Any, ...], root: type) -> tuple[str, Any, Any, str]:
    """(dotted path, the type at ``loc``, the type holding its last key, a note naming a union tag)."""
    path, tp, parent, note = "", root, None, ""
    for item in loc:
        tagged = _tagged(tp)
        if tagged and item in tagged[1]:
            note = f" for {path}.{tagged[0]}={item!r}"
            tp = tagged[1][item]
            continue
        tp = parent = bare_type(tp)
        if isinstance(item, int):
            path += f"[{item}]"
            tp = (get_args(tp) or (Any,))[0]
            continue
        path = f"{path}.{item}" if path else str(item)
        tp = _hints(tp).get(item, get_args(tp)[-1] if get_origin(tp) is dict else Any)
    return path, bare_type(tp), parent, note


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def one_line(err: ValidationError, root: type, what: str = "config") -> str:
    """The first of ``err``'s errors as ``config KEY=VALUE: what is wrong; the fix`` (``what``: the
    thing checked, ``config`` or ``predict request``)."""
    e = err.errors(include_url=False)[0]
    kind, ctx, value = e["type"], e.get("ctx", {}), e.get("input")
    loc = tuple(e["loc"])
    path, tp, parent, note = _walk(loc, root)
    key = f"{what} {path}={_show(value)}"
    if loc[-1:] == ("[key]",):  # a mapping's key, not its value
        key = f"{what} {_walk(loc[:-2], root)[0]} key {_show(value)}"
    if kind == "extra_forbidden":
        return f"{what}: unknown key {path!r}; {_nearest(str(loc[-1]), list(_hints(parent)))}"
    if kind == "missing":
        field = getattr(parent, "model_fields", {}).get(loc[-1])
        return f"{what}: missing required key {path!r} ({getattr(field, 'description', '')})"
    if kind in ("literal_error", "union_tag_invalid"):
        if kind == "union_tag_invalid":
            field = ctx["discriminator"].strip(chr(39))
            field = "name" if field.endswith("()") else field  # the model union's tag is model.name
            key = f"{what} {path}.{field}={ctx['tag']!r}"
            value = ctx["tag"]
        choices = re.findall(r"'([^']*)'", ctx.get("expected") or ctx.get("expected_tags", ""))
        choices = ["package.module:Class" if c == "external" else c for c in choices]
        close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"{key} is not allowed{note}{hint}; choose one of {', '.join(map(repr, choices))}"
    if kind == "finite_number":
        return f"{key}: not a finite number; give a finite value"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<"}.get(kind, "<=")
        limit = f"{next(iter(ctx.values())):g}"
        what = "positive" if (op, limit) == (">", "0") else f"{op} {limit}"
        return f"{key} must be {what}; give a value {op} {limit}"
    if kind == "value_error":
        return f"{key}: {ctx['error']}"
    if kind in ("model_type", "model_attributes_type"):
        fields = f" of {tp.__name__} fields" if isinstance(tp, type) else ""  # not for the model union
        return f"{key}: expected a mapping{fields}"
    for prefix, expected in _EXPECTED.items():
        if kind.startswith(f"{prefix}_"):
            return f"{key}: expected {expected}"
    msg = e["msg"]
    return f"{key}: {msg[:1].lower()}{msg[1:]}"
