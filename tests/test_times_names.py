"""The one time module (periods, the climatology lookup) and the one naming table (dimension
aliases derived from it), and the default climatology path of a URL store."""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr
from jigsaw_earth.data.preflight import default_climatology_path
from jigsaw_earth.data.store import ALIASES
from jigsaw_earth.data.times import hour_dayofyear, period_mask

from jigsaw_earth.metrics.evaluate import DIM_ALIASES, normalise


def test_hour_dayofyear_matches_pandas_across_leap_years() -> None:
    t = np.arange(np.datetime64("2019-12-30T00"), np.datetime64("2021-01-02T00"), np.timedelta64(7, "h"))
    hour, doy = hour_dayofyear(t.astype("datetime64[ns]").reshape(-1, 1))
    stamps = pd.DatetimeIndex(t)
    assert hour.shape == (len(t), 1)
    np.testing.assert_array_equal(hour.ravel(), stamps.hour)
    np.testing.assert_array_equal(doy.ravel(), stamps.day_of_year)
    assert doy.max() == 366  # 2020-12-31


def test_period_mask_is_closed_and_reads_bounds_at_a_unit() -> None:
    t = np.array(["2020-01-01T00", "2020-01-01T06", "2020-01-01T12"], dtype="datetime64[ns]")
    np.testing.assert_array_equal(period_mask(t, ["2020-01-01T06", "2020-01-01T12"]), [False, True, True])
    np.testing.assert_array_equal(period_mask(t, []), [True, True, True])
    # to the hour: 06:30 reads as 06
    np.testing.assert_array_equal(period_mask(t, ["2020-01-01T06:30", "2020-01-02"], unit="h"), [0, 1, 1])


def test_dimension_aliases_come_from_the_naming_table() -> None:
    for alias, dim in DIM_ALIASES.items():
        assert alias in ALIASES[dim]
    ds = xr.Dataset(
        {"t": (("init_time", "lead_time", "lat", "lon"), np.zeros((2, 1, 3, 4)))},
        coords={
            "init_time": np.array(["2020-01-01", "2020-01-02"], dtype="datetime64[ns]"),
            "lead_time": [np.timedelta64(6, "h")],
            "valid_time": (("init_time", "lead_time"), np.zeros((2, 1), dtype="datetime64[ns]")),
            "lat": [10.0, 0.0, -10.0],
            "lon": [0.0, 90.0, 180.0, 270.0],
        },
    )
    out = normalise(ds)
    assert set(out.dims) == {"time", "prediction_timedelta", "latitude", "longitude"}
    assert "valid_time" in out.coords and "temperature" in out.data_vars  # init_time won


def test_default_climatology_path_keeps_urls() -> None:
    assert default_climatology_path("gs://bucket/era5.zarr") == "gs://bucket/era5-climatology.zarr"
    assert str(default_climatology_path("runs/demo/data.zarr")) == "runs/demo/data-climatology.zarr"
