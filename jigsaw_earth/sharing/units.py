"""Units in a model's input contract: which unit a variable has, whether two spellings agree, and
which slip (°C for K, hPa for Pa, …) would explain inputs far from the training data.

The one place the contract reads units from: ``metrics.units`` (WB2's unit of each WB2 name, else
the training store's ``units`` attribute).
"""

from __future__ import annotations

import re
from typing import Any

from ..metrics.units import unit_of

__all__ = ["SLIPS", "contract_unit", "declared_unit", "same_unit", "slip_hint"]

# spellings of one unit → the canonical form (after lower-casing and dropping spaces, ** and ^)
_ALIASES = {
    "kelvin": "k",
    "degk": "k",
    "degc": "degc",
    "°c": "degc",
    "celsius": "degc",
    "deg_c": "degc",
    "degreesc": "degc",
    "m2s-2": "m2/s2",
    "ms-1": "m/s",
    "kgkg-1": "kg/kg",
    "pas-1": "pa/s",
    "(0-1)": "1",
    "": "1",
}
#: for a contract unit: units users slip into, and how a value in the contract unit reads in them
SLIPS: dict[str, tuple[tuple[str, Any], ...]] = {
    "k": (("°C", lambda x: x - 273.15),),
    "pa": (("hPa", lambda x: x / 100.0),),
    "m2/s2": (("m (geopotential height)", lambda x: x / 9.80665),),
    "kg/kg": (("g/kg", lambda x: x * 1000.0),),
    "m": (("mm", lambda x: x * 1000.0),),
}


def _canonical(unit: str) -> str:
    text = re.sub(r"\s+|\*\*|\^", "", str(unit).lower())
    return _ALIASES.get(text, text)


def same_unit(a: str, b: str) -> bool:
    """Whether two spellings name the same unit (``m**2 s**-2`` and ``m2/s2``, ``K`` and ``kelvin``)."""
    return _canonical(a) == _canonical(b)


def contract_unit(name: str, attrs: dict[str, Any]) -> str:
    """The unit a contract states for variable ``name`` (WB2's, else the store's ``units``)."""
    return unit_of(name, attrs)


def declared_unit(attrs: dict[str, Any]) -> str | None:
    """The ``units`` attribute an input declares for a variable (None: none declared)."""
    unit = attrs.get("units")
    return None if unit is None or str(unit).strip() == "" else str(unit)


def slip_hint(unit: str, train_mean: float, train_std: float, seen_mean: float) -> str | None:
    """The slip that maps the training mean (in ``unit``) within a training std of the mean seen,
    e.g. ``"°C"``; None when none does."""
    for name, convert in SLIPS.get(_canonical(unit), ()):
        if abs(convert(train_mean) - seen_mean) <= max(abs(convert(train_std) - convert(0.0)), 1e-12):
            return name
    return None
