"""Latitude weights as WeatherBench 2 and WeatherBench 1 define them, over xarray coordinates.

The weights themselves are defined once in ``jigsaw_earth.sphere`` (WB2:
``weatherbench2.metrics.get_lat_weights``, a pole row gets a half cell; WB1:
``compute_weighted_rmse``'s ``cos(lat)`` over its mean); both accept latitudes in any order and
return them in that order.
"""

from __future__ import annotations

import xarray as xr

from ..sphere import cos_latitude_weights, latitude_weights

__all__ = ["cos_latitude_weights", "latitude_weights", "weights_like"]


def weights_like(da: xr.DataArray | xr.Dataset, kind: str = "wb2") -> xr.DataArray:
    """The weights for ``da``'s ``latitude`` coordinate as a DataArray over ``latitude``."""
    if "latitude" not in da.coords:
        raise ValueError(
            f"no 'latitude' coordinate among {sorted(map(str, da.coords))}; normalise the store first"
        )
    fn = {"wb2": latitude_weights, "wb1": cos_latitude_weights}.get(kind)
    if fn is None:
        raise ValueError(f"unknown latitude weighting {kind!r}; use 'wb2' or 'wb1'")
    return xr.DataArray(
        fn(da["latitude"].values), dims=["latitude"], coords={"latitude": da["latitude"].values}
    )
