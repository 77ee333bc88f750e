"""GRIB 2 files as centres publish them, written with ecCodes from a store's fields (nothing downloaded).

``ifs_like``: pressure levels and surface in one file, shortNames t z u v q 2t 10u 10v msl, latitude
north to south, longitude 0…360 (IFS open data). ``gfs_like``: geopotential height ``gh`` instead of
``z``, ``prmsl`` instead of ``msl``, longitudes −180…180 and latitudes south to north, centre kwbc.
Every message is 16-bit simple packing, as both centres publish; ``packing_error`` is its bound.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

G = 9.80665
BITS = 16
UPPER = {"geopotential": "z", "temperature": "t", "u_component_of_wind": "u", "v_component_of_wind": "v",
         "specific_humidity": "q"}  # fmt: skip
SURFACE = {"2m_temperature": "2t", "10m_u_component_of_wind": "10u", "10m_v_component_of_wind": "10v",
           "mean_sea_level_pressure": "msl"}  # fmt: skip


def packing_error(values: np.ndarray, bits: int = BITS) -> float:
    """The most simple packing with ``bits`` changes a field: half its step, at most range / (2^bits − 1)."""
    return float(np.ptp(values)) / (2**bits - 1) + 1e-6 * float(np.abs(values).max())


def _message(ec, sample: str, keys: dict, values: np.ndarray) -> bytes:
    h = ec.codes_grib_new_from_samples(sample)
    try:
        for key, value in keys.items():
            ec.codes_set(h, key, value)
        ec.codes_set(h, "bitsPerValue", BITS)
        ec.codes_set_values(h, np.asarray(values, np.float64).ravel())
        return bytes(ec.codes_get_message(h))
    finally:
        ec.codes_release(h)


def _grid(lat: np.ndarray, lon: np.ndarray) -> dict:
    step = float(lon[1] - lon[0])
    return {"Ni": len(lon), "Nj": len(lat), "latitudeOfFirstGridPointInDegrees": float(lat[0]),
            "latitudeOfLastGridPointInDegrees": float(lat[-1]),
            "longitudeOfFirstGridPointInDegrees": float(lon[0]),
            "longitudeOfLastGridPointInDegrees": float(lon[-1]), "iDirectionIncrementInDegrees": step,
            "jDirectionIncrementInDegrees": abs(float(lat[1] - lat[0])),
            "jScansPositively": int(lat[1] > lat[0])}  # fmt: skip


def write_centre_file(
    path: Path, ds: xr.Dataset, times, levels, style: str = "ifs", skip: tuple = ()
) -> Path:
    """``style`` ``ifs`` or ``gfs`` (module doc) from the store ``ds`` (WB2 names) at ``times`` and
    ``levels``; ``skip``: (shortName, level) pairs left out (a missing level)."""
    import eccodes as ec

    gfs = style == "gfs"
    lat, lon = ds["latitude"].values, ds["longitude"].values
    cols = np.arange(len(lon))
    if gfs:  # −180…180 (west of Greenwich first), south to north
        cols = np.roll(cols, len(lon) // 2)
        lon = np.where(lon[cols] >= 180, lon[cols] - 360, lon[cols])
        lat = lat[::-1]
    grid = _grid(lat, lon)
    with open(path, "wb") as f:
        for t in np.asarray(times, "datetime64[h]"):
            when = {"centre": "kwbc" if gfs else "ecmf", "dataDate": int(str(t)[:10].replace("-", "")),
                    "dataTime": int(str(t)[11:13]) * 100, "stepUnits": 1, "forecastTime": 0}  # fmt: skip
            for name, short in UPPER.items():
                if name not in ds:
                    continue
                for level in levels:
                    field = ds[name].sel(time=t, level=level).values
                    if gfs:
                        field = field[::-1][:, cols]
                    given = "gh" if gfs and short == "z" else short
                    if given == "gh":
                        field = field / G
                    if (given, level) in skip:
                        continue
                    keys = {**when, **grid, "shortName": given, "level": int(level)}
                    f.write(_message(ec, "regular_ll_pl_grib2", keys, field))
            for name, short in SURFACE.items():
                if name not in ds or (short, None) in skip:
                    continue
                field = ds[name].sel(time=t).values
                if gfs:
                    field = field[::-1][:, cols]
                    short = "prmsl" if short == "msl" else short
                keys = {**when, **grid, "shortName": short}
                if short == "prmsl":
                    keys["typeOfFirstFixedSurface"] = 101  # mean sea level, as NCEP writes it
                f.write(_message(ec, "regular_ll_sfc_grib2", keys, field))
    return path
