"""netCDF-4 files of a forecast, following the CF conventions (``predict --format netcdf``).

Each file is a slice of the forecast store (inits × leads × [members]) with its dimensions and units as
WB2 writes them: ``time`` (``forecast_reference_time``, hours since 1970), ``prediction_timedelta``
(``forecast_period``, hours), ``valid_time`` (``time``: the two added) as an auxiliary coordinate,
``level`` (``air_pressure``, hPa, positive down), ``latitude``/``longitude`` in degrees north/east, and
every variable with its CF ``standard_name``, ``long_name`` and ``units``. Values are the float32
forecast, compressed losslessly (zlib level 1 with shuffle): xarray reads them back equal to the
Zarr store's. The same forecast gives the same bytes: the coordinates are written in ``COORD_ORDER``
and then the fields by name, whatever order the store lists them in, each field one chunk (one
init, lead and member) after another in index order, read from the store chunk by chunk (HDF5 places
each chunk where it is written: dask's writes in its own order would give other files each time).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import xarray as xr

from ..ownership import MARKER

__all__ = ["COORD_ORDER", "cf_dataset", "write_netcdf"]

COORD_ORDER = ("time", "prediction_timedelta", "valid_time", "number", "level", "latitude", "longitude")


def _ordered(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with its coordinates in ``COORD_ORDER`` (others after, by name) and its fields by name."""
    rank = {c: k for k, c in enumerate(COORD_ORDER)}
    coords = sorted(map(str, ds.coords), key=lambda c: (rank.get(c, len(rank)), c))
    fields = sorted(map(str, ds.data_vars))
    return xr.Dataset({k: ds.variables[k] for k in fields}, coords={c: ds.variables[c] for c in coords},
                      attrs=dict(ds.attrs))  # fmt: skip


def cf_dataset(ds: xr.Dataset) -> xr.Dataset:
    """The forecast store's (slice's) dataset with CF attributes and encodings for netCDF."""
    out = _ordered(ds)
    out.attrs = {k: v for k, v in ds.attrs.items() if k != MARKER}
    out.attrs.update(Conventions="CF-1.8", title="jigsaw-earth forecast", source="jigsaw-earth predict")
    valid = out["time"] + out["prediction_timedelta"]
    out = out.assign_coords(valid_time=valid.assign_attrs(standard_name="time", long_name="valid time"))
    if "level" in out.coords:
        out["level"].attrs.update(positive="down", axis="Z")
    out["latitude"].attrs["axis"], out["longitude"].attrs["axis"] = "Y", "X"
    for name in out.variables:
        out[name].encoding = {}
    for name in ("time", "valid_time"):
        out[name].encoding = {"units": "hours since 1970-01-01", "calendar": "proleptic_gregorian",
                              "dtype": "int64", "_FillValue": None}  # fmt: skip
    out["prediction_timedelta"].encoding = {"units": "hours", "dtype": "int64", "_FillValue": None}
    for name in out.coords:
        out[name].encoding.setdefault("_FillValue", None)
    for name, var in out.data_vars.items():
        chunks = tuple(
            1 if d in ("time", "prediction_timedelta", "number") else n for d, n in var.sizes.items()
        )
        out[name].encoding = {"zlib": True, "complevel": 1, "shuffle": True, "chunksizes": chunks,
                              "dtype": np.float32, "_FillValue": np.float32(np.nan)}  # fmt: skip
    return _ordered(out)


def _coordinates(cf: xr.Dataset, name: str) -> str:
    """A field's CF ``coordinates`` attribute: its auxiliary coordinates (as xarray writes them)."""
    dims = set(cf[name].dims)
    return " ".join(str(c) for c in cf.coords if c not in cf.dims and set(cf[c].dims) <= dims)


def write_netcdf(path: Path, ds: xr.Dataset) -> None:
    """Write ``ds`` (a lazy slice of the forecast store: read chunk by chunk) to ``path`` atomically."""
    import netCDF4

    part = path.with_name(path.name + ".part")
    cf = cf_dataset(ds)
    fields = list(cf.data_vars)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cf.drop_vars(fields).to_netcdf(part, engine="netcdf4", format="NETCDF4")  # dimensions, coordinates
    with netCDF4.Dataset(part, "a") as nc:
        for name in fields:
            var, enc = cf[name], cf[name].encoding
            out = nc.createVariable(name, enc["dtype"], var.dims, zlib=enc["zlib"],
                                    complevel=enc["complevel"], shuffle=enc["shuffle"],
                                    chunksizes=enc["chunksizes"], fill_value=enc["_FillValue"])  # fmt: skip
            out.setncatts({**var.attrs, "coordinates": _coordinates(cf, name)})
            lead = [k for k, c in enumerate(enc["chunksizes"]) if c == 1]  # one field a chunk
            for at in np.ndindex(*(var.shape[k] for k in lead)):
                index = [slice(None)] * var.ndim
                for k, i in zip(lead, at):
                    index[k] = i
                out[tuple(index)] = np.asarray(var[tuple(index)].values, enc["dtype"])
    part.replace(path)
