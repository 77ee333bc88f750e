"""Units of the WB2 variables (as the published baselines write them) and CF attributes, from the one
table of variables (``data/variables.py``)."""

from __future__ import annotations

from typing import Any

from ..data.variables import VARIABLES

__all__ = ["CF_ATTRS", "UNITS", "unit_of"]

UNITS = {v.name: v.units for v in VARIABLES}
# CF standard names and long names for forecast stores.
CF_ATTRS: dict[str, dict[str, str]] = {
    v.name: {"standard_name": v.standard_name, "long_name": v.long_name} for v in VARIABLES
}


def unit_of(name: str, *attrs: dict[str, Any]) -> str:
    """WB2's unit for a WB2 name (the published numbers' unit), else the first store's ``units``."""
    if name in UNITS:
        return UNITS[name]
    return next((str(a["units"]) for a in attrs if a.get("units")), "")
