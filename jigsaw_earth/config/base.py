"""The base of every config section: a strict pydantic model that refuses unknown keys.

Strict means no silent conversions: ``steps: 1.5``, ``batch_size: true`` and ``progress: "yes"``
are errors, not 1, 1 and True. Numbers must be finite (``nan``/``inf`` are refused); an integer
is accepted where a float is expected. An empty section (``logging:`` with nothing under it)
reads as all defaults. ``doc(...)`` declares a field with its documentation, which ``config
show`` prints and the JSON schema carries as the field's ``description``.
"""

from __future__ import annotations

from typing import Annotated, Any, get_args, get_origin

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["Section", "bare_type", "doc", "is_time"]


def doc(text: str, default: Any = ..., factory: Any = None, **limits: Any) -> Any:
    """A field with documentation, a default (or a default factory) and optional limits (``gt=0``)."""
    if factory is not None:
        return Field(default_factory=factory, description=text, **limits)
    return Field(default, description=text, **limits)


def bare_type(tp: Any) -> Any:
    """``tp`` without its ``Annotated[...]`` wrapping (validators, limits, documentation)."""
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def is_time(text: str) -> bool:
    """Whether ``text`` reads as a time to the hour (``YYYY-MM-DD`` or ``YYYY-MM-DDTHH``)."""
    try:
        return not np.isnat(np.datetime64(text, "h"))
    except ValueError:
        return False


class Section(BaseModel):
    """A config section: typed, documented fields; unknown keys refused."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _empty_means_defaults(cls, data: Any) -> Any:
        return {} if data is None else data
