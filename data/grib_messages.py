"""GRIB messages through ecCodes: one pass over the headers of every message (``scan``), and one message's
values or coordinates when asked (``decode``, ``coordinates``). Nothing is written anywhere (no ``.idx``).
``grib.py`` groups the messages into variables.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

__all__ = [
    "GRIB_SUFFIXES",
    "PRESSURE",
    "Message",
    "coordinates",
    "decode",
    "eccodes_module",
    "is_grib",
    "scan",
]

GRIB_SUFFIXES = (".grib", ".grib2", ".grb", ".grb2")
PRESSURE = {"isobaricInhPa": 1.0, "isobaricInPa": 0.01}  # level unit → hPa
_LOCK = threading.Lock()  # one decode at a time: ecCodes handles are not shared between threads


def is_grib(path: str | Path) -> bool:
    return Path(path).suffix.lower() in GRIB_SUFFIXES


def eccodes_module() -> ModuleType:
    """``eccodes``, or an error saying how to install it (binary wheels: no system library)."""
    try:
        import eccodes
    except (ImportError, RuntimeError) as err:  # RuntimeError: the library itself is not found
        raise ValueError(
            f"reading or writing GRIB needs ecCodes ({type(err).__name__}: {err}); install it with "
            f"`pip install 'jigsaw-earth[grib]'` (binary wheels, no system library needed)"
        ) from None
    return eccodes


@dataclass(frozen=True)
class Message:
    """One message's header: where it is, what it holds, its grid."""

    path: str
    offset: int
    length: int
    short_name: str
    type_of_level: str
    level: float  # hPa on pressure levels, else the level as stored
    valid: np.datetime64
    accumulation: int | None  # hours, for an accumulated field
    member: int
    grid: tuple  # the keys that define the grid (equal tuples: the same grid)

    @property
    def pressure(self) -> bool:
        return self.type_of_level in PRESSURE and float(self.level).is_integer()


def _header(ec: ModuleType, h: Any, path: str) -> Message:
    get = ec.codes_get
    kind = get(h, "gridType")
    keys = ["Ni", "Nj", "latitudeOfFirstGridPointInDegrees", "longitudeOfFirstGridPointInDegrees",
            "latitudeOfLastGridPointInDegrees", "longitudeOfLastGridPointInDegrees",
            "iDirectionIncrementInDegrees", "jScansPositively", "iScansNegatively",
            "jPointsAreConsecutive"]  # fmt: skip
    grid = (kind, *(get(h, k) if ec.codes_is_defined(h, k) else None for k in keys))
    if kind == "regular_ll":
        grid += (get(h, "jDirectionIncrementInDegrees"),)
    type_of_level, level = str(get(h, "typeOfLevel")), float(get(h, "level"))
    if type_of_level in PRESSURE:
        level *= PRESSURE[type_of_level]
    date, time = int(get(h, "validityDate")), int(get(h, "validityTime"))
    valid = np.datetime64(f"{date // 10000:04d}-{date // 100 % 100:02d}-{date % 100:02d}T{time // 100:02d}:"
                          f"{time % 100:02d}", "ns")  # fmt: skip
    accumulation = None
    if get(h, "stepType") == "accum":
        ec.codes_set(h, "stepUnits", 1)  # hours
        accumulation = int(get(h, "endStep")) - int(get(h, "startStep"))
    member = int(get(h, "number")) if ec.codes_is_defined(h, "number") else 0
    return Message(path, int(get(h, "offset")), int(get(h, "totalLength")), str(get(h, "shortName")),
                   type_of_level, level, valid, accumulation, member, grid)  # fmt: skip


def scan(files: Iterable[str | Path]) -> list[Message]:
    """Every message's header, file by file (nothing decoded, nothing written)."""
    ec = eccodes_module()
    out = []
    for path in map(str, files):
        with open(path, "rb") as f:
            while True:
                try:
                    h = ec.codes_grib_new_from_file(f)
                except Exception as err:  # ecCodes raises its own error classes
                    raise ValueError(
                        f"cannot read {path} after {len(out)} messages: {type(err).__name__}: {err}. The "
                        f"file is corrupt or truncated (an interrupted download?); download it again"
                    ) from None
                if h is None:
                    break
                try:
                    out.append(_header(ec, h, path))
                finally:
                    ec.codes_release(h)
    if not out:
        raise ValueError(f"no GRIB message in {', '.join(map(str, files))}")
    return out


def decode(message: Message, shape: tuple[int, int], column_major: bool, factor: float) -> np.ndarray:
    """One message's values as a float32 field in the file's scanning order; missing points NaN."""
    ec = eccodes_module()
    with open(message.path, "rb") as f:
        f.seek(message.offset)
        raw = f.read(message.length)
    with _LOCK:
        h = ec.codes_new_from_message(raw)
        try:
            values = np.asarray(ec.codes_get_values(h), dtype=np.float64)
            if ec.codes_get(h, "bitmapPresent"):
                values[values == ec.codes_get(h, "missingValue")] = np.nan
        finally:
            ec.codes_release(h)
    field = values.reshape(shape[::-1]).T if column_major else values.reshape(shape)
    return (field * factor if factor != 1.0 else field).astype(np.float32)


def coordinates(ec: ModuleType, message: Message) -> tuple[np.ndarray, np.ndarray]:
    """Latitudes and longitudes (0…360) of a message's rows and columns, in scanning order."""
    kind, ni, nj, lat0, lon0, _, _, di, j_up, i_down = message.grid[:10]
    if kind not in ("regular_ll", "regular_gg"):
        raise ValueError(
            f"{message.short_name} in {message.path} is on a {kind} grid; GRIB sources must be on a "
            f"regular latitude-longitude (or regular Gaussian) grid: regrid it first (e.g. `cdo "
            f"remapbil,r1440x721`)"
        )
    lon = (lon0 + (-1 if i_down else 1) * di * np.arange(ni)) % 360.0
    if kind == "regular_ll":
        lat = lat0 + (1 if j_up else -1) * message.grid[-1] * np.arange(nj)
    else:
        with open(message.path, "rb") as f:
            f.seek(message.offset)
            h = ec.codes_new_from_message(f.read(message.length))
        try:
            lat = np.sort(np.asarray(ec.codes_get_array(h, "distinctLatitudes")))
        finally:
            ec.codes_release(h)
        lat = lat if j_up else lat[::-1]
    return np.round(lat, 6), np.round(lon, 6)
