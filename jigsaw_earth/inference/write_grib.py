"""GRIB 2 messages of a forecast, with the keys a centre's tools read (``predict --format grib2``).

One message per field (variable, level, init, lead, member), from ecCodes' GRIB 2 samples
(``regular_ll_pl_grib2`` for pressure levels, ``regular_ll_sfc_grib2`` for the rest):

* the parameter by ``paramId`` (WMO parameters: ``shortName`` t, z, u, v, q, w, 2t, 10u, 10v, msl), which
  sets ``typeOfLevel`` (``isobaricInhPa`` with ``level`` in hPa; 2t at ``heightAboveGround`` 2, 10u/10v
  at 10, msl at ``meanSea``);
* ``dataDate``/``dataTime`` the initialisation, ``stepUnits`` hours, ``stepRange`` the lead,
  ``typeOfProcessedData`` ``fc`` (an ensemble member: ``pf``, product template 1, ``number`` its member,
  ``numberOfForecastsInEnsemble`` the ensemble's size);
* the regular latitude-longitude grid of the model, rows north to south (``jScansPositively`` 0);
* ``centre`` 255 (missing: a forecast of a model of one's own, not a centre's product);
* simple packing with the fewest bits that keep every value within ``PACKING_BOUND`` of the forecast
  (per variable, in its units): the message is decoded again and repacked with more bits until it
  does, so the bound holds by construction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from ..data.grib import eccodes_module
from ..data.variables import VARIABLES

__all__ = ["CENTRE", "PACKING_BOUND", "PARAMS", "GribField", "check_grib", "encode", "write_messages"]

# WB2 name → ecCodes paramId (WMO GRIB 2 parameters, resolved without a centre's local tables), and the
# largest error packing may add, per variable, in its units: both from the table of variables
PARAMS = {v.name: v.grib_param for v in VARIABLES if v.grib_param is not None}
PACKING_BOUND = {v.name: v.packing_bound for v in VARIABLES if v.grib_param is not None}
CENTRE = 255
MAX_BITS = 32
MISSING = 9999.0


@dataclass(frozen=True)
class GribField:
    """What one message says about its field."""

    variable: str  # WB2 name
    level: int | None  # hPa; None for a surface variable
    init: np.datetime64
    lead_hours: int
    member: int | None = None  # its number in an ensemble of ``members``; None: deterministic
    members: int | None = None


def _regular(values: np.ndarray, what: str) -> float:
    step = np.diff(np.asarray(values, np.float64))
    if len(step) == 0 or np.abs(step - step[0]).max() > 1e-6 * max(abs(step[0]), 1.0):
        raise ValueError(
            f"the model's {what} are not evenly spaced, so its grid is not a regular latitude-longitude "
            f"grid GRIB 2 can describe here; write --format netcdf or zarr"
        )
    return float(step[0])


def check_grib(variables: Iterable[str], latitude: np.ndarray, longitude: np.ndarray) -> None:
    """Before any forecast: every variable has a GRIB parameter and the grid is regular."""
    missing = [v for v in variables if v not in PARAMS]
    if missing:
        raise ValueError(
            f"--format grib2 has no GRIB parameter for {missing}; it writes {sorted(PARAMS)}. Leave them out "
            f"(--variables) or write --format netcdf or zarr"
        )
    if len(latitude) > 1 and _regular(latitude, "latitudes") >= 0:
        raise ValueError("the model's latitudes must run north to south (descending) for --format grib2")
    _regular(longitude, "longitudes")


def _grid_keys(latitude: np.ndarray, longitude: np.ndarray) -> dict[str, Any]:
    lat, lon = np.asarray(latitude, np.float64), np.asarray(longitude, np.float64)
    return {
        "Ni": len(lon), "Nj": len(lat), "latitudeOfFirstGridPointInDegrees": float(lat[0]),
        "latitudeOfLastGridPointInDegrees": float(lat[-1]),
        "longitudeOfFirstGridPointInDegrees": float(lon[0] % 360), "longitudeOfLastGridPointInDegrees":
        float(lon[-1] % 360), "iDirectionIncrementInDegrees": abs(_regular(lon, "longitudes")),
        "jDirectionIncrementInDegrees": abs(_regular(lat, "latitudes")) if len(lat) > 1 else 0.0,
        "jScansPositively": 0, "iScansNegatively": 0,
    }  # fmt: skip


def _bits(values: np.ndarray, bound: float) -> int:
    """Bits for simple packing whose step (a power of two, ecCodes' binary scale) is at most 2 × bound."""
    span = float(np.nanmax(values) - np.nanmin(values)) if np.isfinite(values).any() else 0.0
    if span == 0.0:
        return 0
    step = 2.0 ** math.floor(math.log2(2 * bound))
    return min(MAX_BITS, max(1, math.ceil(math.log2(span / step + 1))))


def encode(field: GribField, values: np.ndarray, latitude: np.ndarray, longitude: np.ndarray) -> bytes:
    """One GRIB 2 message of ``values`` ``(lat, lon)`` (latitude descending), its error within the
    variable's ``PACKING_BOUND``."""
    ec = eccodes_module()
    sample = "regular_ll_pl_grib2" if field.level is not None else "regular_ll_sfc_grib2"
    init = np.datetime64(field.init, "m").astype(object)
    keys: dict[str, Any] = {"centre": CENTRE, "typeOfGeneratingProcess": 2, "significanceOfReferenceTime": 1}
    if field.member is not None:
        keys.update(productDefinitionTemplateNumber=1, typeOfProcessedData="pf",
                    perturbationNumber=field.member, numberOfForecastsInEnsemble=field.members)  # fmt: skip
    else:
        keys["typeOfProcessedData"] = "fc"
    keys["paramId"] = PARAMS[field.variable]
    if field.level is not None:
        keys["level"] = int(field.level)
    keys.update(dataDate=int(init.strftime("%Y%m%d")), dataTime=int(init.strftime("%H%M")), stepUnits=1,
                forecastTime=int(field.lead_hours), **_grid_keys(latitude, longitude))  # fmt: skip
    flat = np.asarray(values, np.float64).ravel()
    bad = ~np.isfinite(flat)
    bound = PACKING_BOUND[field.variable]
    bits = _bits(flat, bound)
    h = ec.codes_grib_new_from_samples(sample)
    try:
        for key, value in keys.items():
            ec.codes_set(h, key, value)
        if bad.any():
            ec.codes_set(h, "bitmapPresent", 1)
            ec.codes_set(h, "missingValue", MISSING)
            flat = np.where(bad, MISSING, flat)
        while True:
            ec.codes_set(h, "bitsPerValue", bits)
            ec.codes_set_values(h, flat)
            message = ec.codes_get_message(h)
            back = ec.codes_new_from_message(message)
            try:
                error = np.abs(np.asarray(ec.codes_get_values(back))[~bad] - flat[~bad])
            finally:
                ec.codes_release(back)
            if bits >= MAX_BITS or not error.size or error.max() <= bound:
                return bytes(message)
            bits += 1
    finally:
        ec.codes_release(h)


def write_messages(f: BinaryIO, items: Iterable[tuple[GribField, np.ndarray]], latitude: np.ndarray,
                   longitude: np.ndarray) -> int:  # fmt: skip
    """Encode and append each ``(field, values)`` to ``f``; returns the messages written."""
    n = 0
    for field, values in items:
        f.write(encode(field, values, latitude, longitude))
        n += 1
    return n
