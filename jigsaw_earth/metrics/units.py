"""Units of the WB2 variables (as the published baselines write them) and CF attributes."""

from __future__ import annotations

from typing import Any

__all__ = ["CF_ATTRS", "UNITS", "unit_of"]

UNITS = {
    "geopotential": "m2/s2",
    "temperature": "K",
    "u_component_of_wind": "m/s",
    "v_component_of_wind": "m/s",
    "specific_humidity": "kg/kg",
    "vertical_velocity": "Pa/s",
    "2m_temperature": "K",
    "10m_u_component_of_wind": "m/s",
    "10m_v_component_of_wind": "m/s",
    "mean_sea_level_pressure": "Pa",
    "total_precipitation_6hr": "m",
    "land_sea_mask": "1",
    "geopotential_at_surface": "m2/s2",
}
# CF standard names and long names for forecast stores.
CF_ATTRS: dict[str, dict[str, str]] = {
    "geopotential": {"standard_name": "geopotential", "long_name": "Geopotential"},
    "temperature": {"standard_name": "air_temperature", "long_name": "Temperature"},
    "u_component_of_wind": {"standard_name": "eastward_wind", "long_name": "U component of wind"},
    "v_component_of_wind": {"standard_name": "northward_wind", "long_name": "V component of wind"},
    "specific_humidity": {"standard_name": "specific_humidity", "long_name": "Specific humidity"},
    "vertical_velocity": {
        "standard_name": "lagrangian_tendency_of_air_pressure",
        "long_name": "Vertical velocity",
    },
    "2m_temperature": {"standard_name": "air_temperature", "long_name": "2 metre temperature"},
    "10m_u_component_of_wind": {"standard_name": "eastward_wind", "long_name": "10 metre U wind"},
    "10m_v_component_of_wind": {"standard_name": "northward_wind", "long_name": "10 metre V wind"},
    "mean_sea_level_pressure": {
        "standard_name": "air_pressure_at_mean_sea_level",
        "long_name": "Mean sea level pressure",
    },
    "total_precipitation_6hr": {"standard_name": "precipitation_amount", "long_name": "6 h precipitation"},
}


def unit_of(name: str, *attrs: dict[str, Any]) -> str:
    """WB2's unit for a WB2 name (the published numbers' unit), else the first store's ``units``."""
    if name in UNITS:
        return UNITS[name]
    return next((str(a["units"]) for a in attrs if a.get("units")), "")
