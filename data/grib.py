"""GRIB (editions 1 and 2) as centres publish it, read with ecCodes: every message of every file at once.

An operational file mixes pressure-level and surface messages (IFS open data, GFS), a download may
split them over files by level, variable or time (the CDS), and variables go by shortName. So the
messages of all GRIB files of a source are scanned once (headers only: nothing is decoded, no
``.idx`` file is written anywhere) and grouped into WB2 variables:

* pressure levels (``typeOfLevel`` ``isobaricInhPa``, or ``isobaricInPa`` at whole hPa) give the
  upper-air variables, every other level type the surface ones, each through the one naming table
  ``store.ALIASES`` (``t`` → temperature, ``2t`` → 2m_temperature, ``prmsl`` → mean_sea_level_pressure
  …) or ``--name CANONICAL=SHORTNAME``; geopotential height ``gh`` (GFS, IFS open data) becomes
  geopotential (× g = 9.80665) where no ``z`` is given;
* the time is the validity time of each message (an analysis, or a forecast step);
* longitudes are read as 0…360 (a −180…180 grid is the same grid), latitudes in the file's order
  (``StoreView`` orders both);
* a message's values are decoded only when read (a dask task per message).

``GribMessages.require`` names what a selection lacks — the variable, level or times — with the
message keys found (``describe``), instead of a field of NaNs.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import xarray as xr
from jigsaw_earth.data.grib_messages import (
    GRIB_SUFFIXES,
    PRESSURE,
    Message,
    coordinates,
    decode,
    eccodes_module,
    is_grib,
    scan,
)
from jigsaw_earth.data.store import ACCUMULATION_ATTR, canonical_name, rename_fix
from jigsaw_earth.data.variables import VARIABLES

__all__ = ["GRIB_SUFFIXES", "GribMessages", "eccodes_module", "is_grib"]

log = logging.getLogger(__name__)

# shortNames holding a known variable in other units: shortName → (canonical name, factor) (the table's)
CONVERTED = {short: (v.name, factor) for v in VARIABLES for short, factor in v.scaled}


@dataclass
class _Variable:
    canonical: str
    short_name: str
    type_of_level: str
    factor: float
    fields: dict[tuple[float | None, np.datetime64], Message]  # (level or None, valid time) → message


def _key(m: Message) -> str:
    return f"{m.short_name} {m.type_of_level}"


class GribMessages:
    """The messages of a GRIB source grouped into WB2 variables; ``dataset`` reads them lazily."""

    def __init__(self, files: Sequence[str | Path], names: dict[str, str] | None = None):
        self.files = [str(f) for f in files]
        self.where = self.files[0] if len(self.files) == 1 else f"{len(self.files)} GRIB files"
        self.messages = scan(self.files)
        self.renamable = names is not None  # the command maps names (data prepare's --name)
        self.variables = self._group(dict(names or {}))
        if not self.variables:
            raise ValueError(
                f"no known variable among the GRIB messages of {self.where}; found {self.describe()}. "
                f"{rename_fix('CANONICAL', names is not None)} (e.g. 2m_temperature for shortName 2t)"
            )
        used = [m for v in self.variables.values() for m in v.fields.values()]
        if len({m.grid for m in used}) > 1:
            raise self._grids_error(used)

    def _grids_error(self, messages: Sequence[Message]) -> ValueError:
        """The error of a source whose fields lie on several grids: each grid, its variables, its files."""
        grids = sorted({m.grid for m in messages}, key=str)
        parts = []
        for g in grids:
            mine = [m for m in messages if m.grid == g]
            names = sorted({m.short_name for m in mine})
            files = sorted({Path(m.path).name for m in mine})
            shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
            parts.append(f"{', '.join(names)} on {g[0]} {g[2]}x{g[1]} from ({g[3]:g}, {g[4]:g}) in {shown}")
        return ValueError(
            f"the GRIB messages of {self.where} are on {len(grids)} grids: {'; '.join(parts)}. Every field "
            f"must share one grid: give the files of one grid (a folder or glob of them), or regrid the "
            f"others first (e.g. `cdo remapbil`)"
        )

    def _group(self, names: dict[str, str]) -> dict[str, _Variable]:
        groups: dict[tuple[str, str, bool], list[Message]] = defaultdict(list)
        for m in self.messages:
            if m.pressure or m.type_of_level not in PRESSURE:
                groups[(m.short_name, m.type_of_level if not m.pressure else "pressure", m.pressure)].append(
                    m
                )
        out: dict[str, _Variable] = {}
        for (short, _, upper), found in groups.items():
            canonical, factor = canonical_name(short, upper, names), 1.0
            if canonical is None and upper and short in CONVERTED and short not in names.values():
                canonical, factor = CONVERTED[short]
            if canonical is None:
                continue
            if canonical in out:
                if out[canonical].factor != 1.0 and factor == 1.0:  # z wins over gh
                    del out[canonical]
                elif factor != 1.0:
                    continue
                else:
                    other = " or map one with --name" if self.renamable else ""
                    raise ValueError(
                        f"{canonical} is given twice in {self.where}: by {_key(found[0])} and by "
                        f"{out[canonical].short_name} {out[canonical].type_of_level}; keep one (filter the "
                        f"files, e.g. `grib_copy -w typeOfLevel=…`){other}"
                    )
            fields: dict[tuple[float | None, np.datetime64], Message] = {}
            for m in found:
                key = (m.level if upper else None, m.valid)
                if key in fields and fields[key].grid != m.grid:  # the same field on two grids
                    raise self._grids_error(self.messages)
                if key in fields:
                    what = f"ensemble members {fields[key].member} and {m.member}" if m.member != fields[
                        key].member else "two messages"  # fmt: skip
                    raise ValueError(
                        f"{self.where} holds {what} of {_key(m)} level {m.level:g} at {m.valid}; keep one "
                        f"(e.g. `grib_copy -w number=0 IN OUT` for one member)"
                    )
                fields[key] = m
            if not upper and len({m.level for m in found}) > 1:
                raise ValueError(
                    f"{_key(found[0])} is at levels {sorted({m.level for m in found})} in {self.where}; "
                    f"a surface variable needs one level: filter the files (`grib_copy -w level=…`)"
                )
            out[canonical] = _Variable(canonical, short, found[0].type_of_level, factor, fields)
        return out

    # ---- what is there ----------------------------------------------------------------------
    def describe(self) -> str:
        """The message keys found: ``t isobaricInhPa 500,850; 2t heightAboveGround 2; … at 2 times
        (2020-01-01T00 … 2020-01-01T06)``."""
        levels: dict[str, set[float]] = defaultdict(set)
        for m in self.messages:
            levels[_key(m)].add(m.level)
        parts = [f"{k} {','.join(f'{x:g}' for x in sorted(v))}" for k, v in levels.items()]
        times = sorted({m.valid for m in self.messages})
        span = str(times[0])[:16] + ("" if len(times) == 1 else f" … {str(times[-1])[:16]}")
        return (f"{len(self.messages)} messages (shortName typeOfLevel level): {'; '.join(parts)}; at "
                f"{len(times)} time{'s' * (len(times) != 1)} ({span})")  # fmt: skip

    def levels(self, canonical: str) -> list[float]:
        return sorted({lev for lev, _ in self.variables[canonical].fields if lev is not None})

    def times(self) -> np.ndarray:
        return np.array(sorted({t for v in self.variables.values() for _, t in v.fields}), "datetime64[ns]")

    def require(self, canonical: str, levels: Sequence[float] | None, times: np.ndarray | None = None,
                fix: str | None = None) -> None:  # fmt: skip
        """Raise naming what ``canonical`` lacks at ``levels`` (upper-air) and ``times`` (default: all
        the source's times), with the message keys found; ``fix``: what the caller can do about it."""
        var = self.variables.get(canonical)
        if var is None:
            raise ValueError(f"{canonical} is not in {self.where}; found {self.describe()}")
        times = self.times() if times is None else np.asarray(times, "datetime64[ns]")
        what = f"{canonical} ({var.short_name} {var.type_of_level})"
        for lev in [None] if levels is None else list(levels):
            lacking = [t for t in times if (lev, t) not in var.fields]
            if not lacking:
                continue
            at = "" if lev is None else f" level {lev:g} hPa"
            when = "" if len(lacking) == len(times) else f" at {len(lacking)} of {len(times)} times"
            hint = fix or (
                f"Choose --levels among {[int(x) for x in self.levels(canonical)]}, or add the messages"
                if lev is not None
                else "Add the messages, or choose --start/--end without them"
            )
            raise ValueError(
                f"{self.where} lacks {what}{at}{when} (first at {str(lacking[0])[:16]}); found "
                f"{self.describe()}. {hint}"
            )

    # ---- reading ----------------------------------------------------------------------------
    def dataset(self) -> xr.Dataset:
        """Every variable as a lazy dask array ``(time, [level], latitude, longitude)`` in the files'
        grid order; a (level, time) without a message is NaN (``require`` refuses selecting one)."""
        ec = eccodes_module()
        first = next(iter(next(iter(self.variables.values())).fields.values()))
        lat, lon = coordinates(ec, first)
        shape, column_major = (len(lat), len(lon)), bool(first.grid[10])
        times = self.times()
        levels = sorted({lev for c in self.variables for lev in self.levels(c)})
        data_vars = {}
        for name, var in self.variables.items():
            upper = any(lev is not None for lev, _ in var.fields)
            rows = []
            for t in times:
                blocks = []
                for lev in levels if upper else [None]:
                    m = var.fields.get((lev, t))
                    if m is None:
                        blocks.append(da.full(shape, np.nan, dtype=np.float32))
                    else:
                        task = dask.delayed(decode)(m, shape, column_major, var.factor)
                        blocks.append(da.from_delayed(task, shape, dtype=np.float32))
                rows.append(da.stack(blocks) if upper else blocks[0])
            dims = ("time", "level", "latitude", "longitude") if upper else ("time", "latitude", "longitude")
            attrs = {"GRIB_shortName": var.short_name, "GRIB_typeOfLevel": var.type_of_level}
            periods = {m.accumulation for m in var.fields.values()}
            if periods != {None}:
                if len(periods) > 1:
                    raise ValueError(
                        f"{var.short_name} in {self.where} holds accumulations over "
                        f"{sorted(map(str, periods))} hours; give one accumulation period"
                    )
                attrs[ACCUMULATION_ATTR] = periods.pop()
            data_vars[name] = xr.Variable(dims, da.stack(rows), attrs)
        coords: dict[str, Any] = {"time": times, "latitude": lat, "longitude": lon}
        if levels:
            coords["level"] = np.asarray(levels, dtype=np.float64)
        log.info("%s: %s", self.where, ", ".join(f"{v.short_name} -> {n}" for n, v in self.variables.items()))
        return xr.Dataset(data_vars, coords=coords)
