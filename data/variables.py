"""THE table of variables: every WB2 variable the package reads, writes, scores or draws, and all it
knows of each, in one place.

Every other module reads this table (through the functions below, at import): the naming table and
the variable lists of ``store.py`` (so ``data prepare``, ``data/grib.py`` and scoring find a variable
under any of its names), the units and CF attributes of ``metrics/units.py``, the GRIB parameters and
packing bounds of ``predict --format grib2`` (``inference/write_grib.py``), the short names of the
validation tables (``training/evaluate.py``), the headline fields of the scorecard pictures and of
``plan --evaluate``, and the colour maps of ``score --plot``'s maps. Adding a variable is one entry
here (``tests/test_variables.py`` adds one at run time and follows it through those readers).

An entry (``Variable``):

* ``name``: the WB2 name (``2m_temperature``), ``short``: the short name of tables (``t2m``; with a
  level, ``z500``) and the first name a file may use, ``aliases``: the other names files use (CDS
  netCDF, CMIP, other GRIB shortNames); ``scaled``: names holding it in other units, with the factor
  (GFS's geopotential height ``gh`` × g);
* ``level``: ``pressure`` (upper air, on pressure levels), ``surface`` (one level: 2 m, 10 m, mean sea
  level, the ground) or ``static`` (a surface field without time: land-sea mask, orography);
* ``units`` (WB2's, the published numbers' unit), ``standard_name`` and ``long_name`` (CF);
* ``grib_name``: ecCodes' shortName (what a GRIB file calls it); ``grib_param``: the ecCodes paramId
  ``predict --format grib2`` writes, with ``packing_bound``, the largest error packing may add (in
  ``units``); both ``None`` for a variable GRIB output does not write;
* ``accumulation_hours``: an accumulated field's period (ERA5's ``tp`` from the CDS is a 1-hour
  accumulation whatever the time spacing of the file);
* ``headline``: one of WB2's headline fields (its scorecards), upper-air ones at ``headline_level`` hPa;
* ``cmap``: the matplotlib colour map of its maps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "GRAVITY",
    "LEVEL_TYPES",
    "VARIABLES",
    "Variable",
    "by_name",
    "headline_channels",
    "names_of",
    "variable",
]

GRAVITY = 9.80665  # m s-2, WMO's standard gravity: geopotential = g × geopotential height
LEVEL_TYPES = ("pressure", "surface", "static")
Level = Literal["pressure", "surface", "static"]


@dataclass(frozen=True)
class Variable:
    """One variable: its names, level type, units, GRIB keys, packing bound and how it is drawn."""

    name: str
    short: str
    level: Level
    units: str
    standard_name: str
    long_name: str
    aliases: tuple[str, ...] = ()
    scaled: tuple[tuple[str, float], ...] = ()
    grib_name: str | None = None
    grib_param: int | None = None
    packing_bound: float | None = None
    accumulation_hours: int | None = None
    headline: bool = False
    headline_level: int | None = None
    cmap: str = "viridis"

    @property
    def names(self) -> tuple[str, ...]:
        """Every name a file may give it, the first preferred: the short name, the GRIB shortName, the
        aliases."""
        return tuple(dict.fromkeys(n for n in (self.short, self.grib_name, *self.aliases) if n))

    @property
    def upper_air(self) -> bool:
        return self.level == "pressure"


VARIABLES: tuple[Variable, ...] = (
    Variable("geopotential", "z", "pressure", "m2/s2", "geopotential", "Geopotential", aliases=("zg",),
             scaled=(("gh", GRAVITY),), grib_name="z", grib_param=129, packing_bound=0.1, headline=True,
             headline_level=500),
    Variable("temperature", "t", "pressure", "K", "air_temperature", "Temperature", aliases=("ta",),
             grib_name="t", grib_param=130, packing_bound=0.01, headline=True, headline_level=850),
    Variable("u_component_of_wind", "u", "pressure", "m/s", "eastward_wind", "U component of wind",
             aliases=("ua",), grib_name="u", grib_param=131, packing_bound=0.01, headline=True,
             headline_level=850),
    Variable("v_component_of_wind", "v", "pressure", "m/s", "northward_wind", "V component of wind",
             aliases=("va",), grib_name="v", grib_param=132, packing_bound=0.01, headline=True,
             headline_level=850),
    Variable("specific_humidity", "q", "pressure", "kg/kg", "specific_humidity", "Specific humidity",
             aliases=("hus",), grib_name="q", grib_param=133, packing_bound=1e-7, headline=True,
             headline_level=700),
    Variable("vertical_velocity", "w", "pressure", "Pa/s", "lagrangian_tendency_of_air_pressure",
             "Vertical velocity", aliases=("wap",), grib_name="w", grib_param=135, packing_bound=1e-4),
    Variable("2m_temperature", "t2m", "surface", "K", "air_temperature", "2 metre temperature",
             aliases=("tas",), grib_name="2t", grib_param=167, packing_bound=0.01, headline=True),
    Variable("10m_u_component_of_wind", "u10", "surface", "m/s", "eastward_wind", "10 metre U wind",
             aliases=("uas",), grib_name="10u", grib_param=165, packing_bound=0.01, headline=True),
    Variable("10m_v_component_of_wind", "v10", "surface", "m/s", "northward_wind", "10 metre V wind",
             aliases=("vas",), grib_name="10v", grib_param=166, packing_bound=0.01, headline=True),
    Variable("mean_sea_level_pressure", "msl", "surface", "Pa", "air_pressure_at_mean_sea_level",
             "Mean sea level pressure", aliases=("psl", "prmsl"),  # prmsl: NCEP's GRIB shortName
             grib_name="msl", grib_param=151, packing_bound=0.1, headline=True),
    Variable("total_precipitation_6hr", "tp6h", "surface", "m", "precipitation_amount", "6 h precipitation",
             aliases=("tp_6hr",), accumulation_hours=6, cmap="Blues"),
    Variable("total_precipitation", "tp", "surface", "m", "precipitation_amount", "Total precipitation",
             grib_name="tp", accumulation_hours=1, cmap="Blues"),
    Variable("land_sea_mask", "lsm", "static", "1", "land_binary_mask", "Land-sea mask", aliases=("sftlf",),
             grib_name="lsm"),
    Variable("geopotential_at_surface", "z", "static", "m2/s2", "surface_geopotential",
             "Geopotential at surface", aliases=("orog_geopotential", "zs"), grib_name="z"),
)  # fmt: skip


def by_name() -> dict[str, Variable]:
    """The table by WB2 name."""
    return {v.name: v for v in VARIABLES}


def variable(name: str) -> Variable | None:
    """The entry of WB2 name ``name`` (``None``: not in the table)."""
    return by_name().get(name)


def names_of(*levels: Level) -> tuple[str, ...]:
    """WB2 names of the variables of these level types, in the table's order."""
    return tuple(v.name for v in VARIABLES if v.level in levels)


def headline_channels() -> tuple[str, ...]:
    """WB2's headline fields as channel names: ``geopotential@500``, ..., ``2m_temperature``, ..."""
    return tuple(f"{v.name}@{v.headline_level}" if v.upper_air else v.name for v in VARIABLES if v.headline)
