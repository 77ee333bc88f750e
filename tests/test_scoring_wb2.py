"""``evaluate`` against an independent, straightforward xarray computation of WB2's formulas:
regions, NaN propagation (skipna=False), a latitude-cropped forecast, the 1e-3° grid tolerance,
the scorecard's width and the shipped baselines."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from jigsaw_earth.metrics import engine, evaluate
from jigsaw_earth.metrics.regions import REGIONS, get_regions
from jigsaw_earth.metrics.scorecard import format_scorecard, read_baselines

LAT = np.linspace(-90, 90, 61)  # 3°, poles included (as WB2's 1.5° grid); every region has points
LON = np.arange(120) * 3.0
BOXES = {  # WB2's evaluation script: (latitude slices, longitude slices), bounds inclusive
    "global": ([(None, None)], [(None, None)]),
    "tropics": ([(-20, 20)], [(None, None)]),
    "extra-tropics": ([(None, -20), (20, None)], [(None, None)]),
    "northern-hemisphere": ([(20, None)], [(None, None)]),
    "southern-hemisphere": ([(None, -20)], [(None, None)]),
    "europe": ([(35, 75)], [(347.5, None), (0, 42.5)]),
    "north-america": ([(25, 60)], [(240, 285)]),
    "north-atlantic": ([(25, 65)], [(290, 350)]),
    "north-pacific": ([(25, 60)], [(145, 230)]),
    "east-asia": ([(25, 60)], [(102.5, 150)]),
    "ausnz": ([(-45, -12.5)], [(120, 175)]),
    "arctic": ([(60, 90)], [(None, None)]),
    "antarctic": ([(-90, -60)], [(None, None)]),
}


# ------------------------------------------------------------------ the independent reference
def ref_weights(lat: np.ndarray) -> xr.DataArray:
    """WB2's cell areas: edges halfway between rows and at ±90°, sin(upper) − sin(lower), mean 1."""
    s = np.deg2rad(np.sort(lat))
    edges = np.concatenate([[-np.pi / 2], (s[1:] + s[:-1]) / 2, [np.pi / 2]])
    w = np.sin(edges[1:]) - np.sin(edges[:-1])
    return xr.DataArray(w / w.mean(), dims="latitude", coords={"latitude": np.sort(lat)})


def ref_mean(x: xr.DataArray, weights: xr.DataArray, region: str) -> xr.DataArray:
    lats, lons = BOXES[region]
    x = x.sortby("latitude")
    lat = xr.concat([x.latitude.sel(latitude=slice(*s)) for s in lats], "latitude")
    lon = xr.concat([x.longitude.sel(longitude=slice(*s)) for s in lons], "longitude")
    x = x.sel(latitude=lat, longitude=lon)
    return x.weighted(weights.sel(latitude=x.latitude)).mean(("latitude", "longitude"), skipna=False)


def ref_scores(f, o, c, weights, region):
    """RMSE, bias, ACC per lead[, level] of one variable (truth and climatology at valid time)."""
    mse = ref_mean((f - o) ** 2, weights, region)
    out = {
        "rmse": np.sqrt(mse.mean("time", skipna=False)),
        "bias": ref_mean(f - o, weights, region).mean("time", skipna=False),
    }
    if c is not None:
        fa, oa = f - c, o - c
        per_init = ref_mean(fa * oa, weights, region) / np.sqrt(
            ref_mean(fa**2, weights, region) * ref_mean(oa**2, weights, region)
        )
        out["acc"] = per_init.mean("time", skipna=False)
    return out


# ------------------------------------------------------------------------------------ data
def _stores(seed: int = 0, n_init: int = 3):
    rng = np.random.default_rng(seed)
    times = pd.date_range("2020-03-01", periods=n_init * 2 + 4, freq="12h").values
    grid = {"latitude": LAT[::-1], "longitude": LON}  # truth in WB2's descending order
    smooth = np.cos(np.deg2rad(LAT[::-1]))[:, None] * np.sin(np.deg2rad(LON))[None, :]
    truth = xr.Dataset(
        {
            "geopotential": (
                ("time", "level", "latitude", "longitude"),
                5e4 + 800 * smooth + 300 * rng.normal(size=(times.size, 2, LAT.size, LON.size)),
            ),
            "2m_temperature": (
                ("time", "latitude", "longitude"),
                280 + 3 * rng.normal(size=(times.size, LAT.size, LON.size)),
            ),
        },
        coords={"time": times, "level": [500, 850], **grid},
    )
    inits, leads = times[:n_init], pd.to_timedelta([12, 24], "h").values
    valid = truth.sel(time=(inits[:, None] + leads[None, :]).ravel())
    fc = xr.Dataset(
        {
            n: (
                ("time", "prediction_timedelta", *v.dims[1:]),
                v.values.reshape(n_init, 2, *v.shape[1:]) + rng.normal(0.2, 1.0, (n_init, 2, *v.shape[1:])),
            )
            for n, v in valid.data_vars.items()
        },
        coords={"time": inits, "prediction_timedelta": leads, "level": [500, 850], **grid},
    ).sortby("latitude")  # the forecast ascending: matched to the truth by value
    doy, hours = np.arange(1, 367), [0, 6, 12, 18]
    clim = xr.Dataset(
        {
            n: (
                ("hour", "dayofyear", *v.dims[1:]),
                np.broadcast_to(v.mean("time").values, (4, 366, *v.shape[1:])),
            )
            for n, v in truth.data_vars.items()
        },
        coords={"hour": hours, "dayofyear": doy, "level": [500, 850], **grid},
    )
    return fc, truth, clim


def _at_valid(truth, fc):
    valid = fc.time + fc.prediction_timedelta
    return truth.sel(time=valid).drop_vars("time").assign_coords(time=fc.time)


def _clim_at_valid(clim, fc):
    valid = fc.time + fc.prediction_timedelta
    return clim.sel(dayofyear=valid.dt.dayofyear, hour=valid.dt.hour).drop_vars(["dayofyear", "hour"])


def _table(rows):
    return {
        (r["model"], r["metric"], r["region"], r["variable"], r["level"], r["lead_hours"]): r["value"]
        for r in rows
    }


def _check_against_reference(got, fc, truth, clim, regions, weights, baseline_regions=None):
    obs, c = _at_valid(truth, fc), _clim_at_valid(clim, fc)
    persistence = truth.sel(time=fc.time).expand_dims(prediction_timedelta=fc.prediction_timedelta)
    models = {"forecast": fc, "persistence": persistence, "climatology": c}
    n = 0
    for model, f in models.items():
        for region in regions if model == "forecast" or baseline_regions is None else baseline_regions:
            for var in fc.data_vars:
                ref = ref_scores(
                    f[var], obs[var], None if model == "climatology" else c[var], weights, region
                )
                for metric, da in ref.items():
                    values = da.transpose("prediction_timedelta", ...).values.reshape(
                        fc.prediction_timedelta.size, -1
                    )
                    levels = da.level.values if "level" in da.dims else [None]
                    for i, lead in enumerate(fc.prediction_timedelta.values / np.timedelta64(1, "h")):
                        for k, lev in enumerate(levels):
                            have = got[(model, metric, region, var, None if lev is None else int(lev), lead)]
                            np.testing.assert_allclose(
                                have,
                                values[i, k],
                                rtol=1e-10,
                                atol=1e-12,
                                err_msg=f"{model} {metric} {region} {var}",
                            )
                            n += 1
    return n


# ------------------------------------------------------------------------------------ tests
def test_every_region_equals_the_reference(monkeypatch):
    fc, truth, clim = _stores()
    rows = evaluate(fc, truth, clim, regions=["all"])
    assert {r["region"] for r in rows} == set(REGIONS)
    got = _table(rows)
    baseline_regions = ["global", "europe", "extra-tropics"]  # (all regions for the forecast)
    n = _check_against_reference(got, fc, truth, clim, list(REGIONS), ref_weights(LAT), baseline_regions)
    assert n == (13 + 3 + 3) * 3 * 2 * 3 - 3 * 3 * 2  # regions × (levels 2 + surface 1) × leads × metrics
    units = {(r["variable"], r["metric"]): r["unit"] for r in rows}
    assert units[("geopotential", "rmse")] == "m2/s2" and units[("2m_temperature", "bias")] == "K"
    # a block per init (1-byte reads): truth and climatology fields cached across blocks, same numbers
    monkeypatch.setattr(engine, "READ_BYTES", 1)
    again = _table(evaluate(fc, truth, clim, regions=["all"]))
    assert again.keys() == got.keys()
    np.testing.assert_allclose([again[k] for k in got], list(got.values()), rtol=1e-13)


def test_nan_gives_nan_where_it_counts_and_a_warning(caplog):
    fc, truth, clim = _stores()
    z = fc["geopotential"].values.copy()
    j_lat, j_lon = int(np.argmin(abs(fc.latitude.values - 51))), int(np.argmin(abs(fc.longitude.values - 9)))
    z[1, 1, 0, j_lat, j_lon] = np.nan  # init 1, lead 24 h, 500 hPa, a point in Europe
    fc["geopotential"] = fc["geopotential"].copy(data=z)
    with caplog.at_level(logging.WARNING):
        rows = evaluate(fc, truth, clim, regions=["global", "europe", "tropics", "northern-hemisphere"])
    got = _table(rows)
    assert "geopotential@500 at 24 h: 1 values in 1 of 3 inits" in caplog.text
    for region in ("global", "europe", "northern-hemisphere"):
        assert np.isnan(got[("forecast", "rmse", region, "geopotential", 500, 24.0)])
        assert np.isnan(got[("forecast", "acc", region, "geopotential", 500, 24.0)])
    assert np.isfinite(got[("forecast", "rmse", "tropics", "geopotential", 500, 24.0)])  # NaN outside
    assert np.isfinite(got[("forecast", "rmse", "global", "geopotential", 850, 24.0)])
    assert np.isfinite(got[("forecast", "rmse", "global", "geopotential", 500, 12.0)])
    regions = ["global", "europe", "tropics", "northern-hemisphere"]
    obs = _at_valid(truth, fc)
    for region in regions:  # NaN and finite values alike equal the reference (skipna=False)
        ref = ref_scores(fc["geopotential"], obs["geopotential"], None, ref_weights(LAT), region)
        have = [got[("forecast", "rmse", region, "geopotential", 500, h)] for h in (12.0, 24.0)]
        np.testing.assert_allclose(have, ref["rmse"].sel(level=500).values, rtol=1e-10)


def test_cropped_forecast_is_a_region_with_global_weights(caplog):
    fc, truth, clim = _stores()
    crop = fc.sel(latitude=slice(-30, 60))
    with caplog.at_level(logging.WARNING):
        rows = evaluate(crop, truth, clim, regions=["global", "tropics", "north-atlantic"])
    got = _table(rows)
    assert {r["region"] for r in rows} == {"domain", "tropics"}
    assert "north-atlantic reaches outside" in caplog.text
    BOXES["domain"] = ([(-30, 60)], [(None, None)])
    try:
        _check_against_reference(got, crop, truth, clim, ["domain", "tropics"], ref_weights(LAT))
    finally:
        del BOXES["domain"]
    # the same numbers as the global forecast's tropics; not what weights from the cropped rows give
    full = _table(evaluate(fc, truth, clim, regions=["tropics"]))
    key = ("forecast", "rmse", "tropics", "geopotential", 500, 24.0)
    assert got[key] == pytest.approx(full[key], rel=1e-12)
    obs = _at_valid(truth, crop)
    as_if_global = ref_weights(crop.latitude.values)
    naive = float(
        np.sqrt(
            ref_mean((crop["2m_temperature"] - obs["2m_temperature"]) ** 2, as_if_global, "global").mean(
                "time"
            )
        ).isel(prediction_timedelta=1)
    )
    assert abs(got[("forecast", "rmse", "domain", "2m_temperature", None, 24.0)] - naive) > 1e-6


def test_grid_tolerance_is_1e3_degrees():
    fc, truth, clim = _stores(n_init=1)
    near = truth.assign_coords(
        latitude=truth.latitude + 5e-4 * np.sign(-truth.latitude), longitude=truth.longitude - 5e-4
    )
    a, b = _table(evaluate(fc, truth, clim)), _table(evaluate(fc, near, clim))
    assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], rel=1e-12) for k in a)
    far = truth.assign_coords(longitude=truth.longitude + 2e-3)
    with pytest.raises(ValueError, match=r"truth lacks longitude values .* within 0.001°"):
        evaluate(fc, far, clim)


def test_truth_that_is_not_global_is_refused():
    fc, truth, clim = _stores(n_init=1)
    part = truth.sel(latitude=slice(60, -30))
    with pytest.raises(ValueError, match="truth covers latitude -30…60 only, not the globe"):
        evaluate(fc.sel(latitude=slice(-30, 60)), part, clim)


def test_unknown_region_names_the_nearest():
    with pytest.raises(ValueError, match="did you mean 'europe'"):
        get_regions(["eurpoe"])


def test_scorecard_fits_100_columns_with_units_acc_bias_and_the_published_period():
    fc, truth, clim = _stores(n_init=1)
    rows = evaluate(fc, truth, clim, regions=["global", "europe"])
    text = format_scorecard(rows, read_baselines(), "1.5deg", "2020-03-01T00 … 2020-03-01T00, 1 inits")
    lines = text.splitlines()
    assert max(map(len, lines)) <= 100
    assert "global · geopotential @ 500 hPa [m2/s2]" in text and "europe · 2m_temperature [K]" in text
    assert "ACC" in text and "bias" in text and "persistence" in text
    assert "WB2 1.5deg, evaluated 2020" in text and "GraphCast 124.2" in text  # the shipped CSV


def test_each_truth_and_climatology_field_is_read_once(monkeypatch):
    fc, truth, clim = _stores(n_init=4)
    monkeypatch.setattr(engine, "READ_BYTES", 1)  # a block per init: later blocks reuse earlier reads
    reads: dict[tuple[str, str], list] = {}

    def counting(make, what):
        def wrapped(da, *args):
            read = make(da, *args)

            def counted(keys):
                reads.setdefault((what, str(da.name)), []).extend(keys)
                return read(keys)

            return counted

        return wrapped

    monkeypatch.setattr(engine, "_reader", counting(engine._reader, "truth"))
    monkeypatch.setattr(engine, "_clim_reader", counting(engine._clim_reader, "climatology"))
    evaluate(fc, truth, clim)
    needed = np.union1d(fc.time.values, (fc.time + fc.prediction_timedelta).values.ravel())
    for (what, name), keys in reads.items():
        assert len(keys) == len(set(keys)), f"{what} {name}: a field read twice"
        if what == "truth":
            assert len(keys) == needed.size
    assert {k[1] for k in reads} == {"geopotential", "2m_temperature"}


def test_scorecard_axes_follow_the_forecast_leads() -> None:
    """Published 3- and 5-day points do not stretch a 6–24 h scorecard; they are noted instead."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jigsaw_earth.metrics.plots import _published

    fig, ax = plt.subplots()
    ax.plot([0.25, 0.5, 0.75, 1.0], [100.0, 200.0, 300.0, 400.0])
    xlim, ylim = ax.get_xlim(), ax.get_ylim()
    pub = [
        {"benchmark": "WB2", "model": "IFS HRES", "lead_days": "1", "rmse": "250", "eval_period": "2020"},
        {"benchmark": "WB2", "model": "IFS HRES", "lead_days": "3", "rmse": "330", "eval_period": "2020"},
        {"benchmark": "WB2", "model": "IFS HRES", "lead_days": "5", "rmse": "560", "eval_period": "2020"},
        {"benchmark": "WB2", "model": "Climatology", "lead_days": "all", "rmse": "820"},
    ]
    _published(ax, pub)
    assert ax.get_xlim() == xlim and ax.get_ylim() == ylim
    notes = " ".join(t.get_text() for t in ax.texts)
    assert "WB2 IFS HRES 3 d: 330" in notes and "WB2 IFS HRES 5 d: 560" in notes
    assert "Climatology 820" in notes
    assert [line.get_xdata().tolist() for line in ax.lines[1:]] == [[1.0]]  # the 1-day point is drawn
    plt.close(fig)
