"""WeatherBench metrics: weights, sqrt-after-mean RMSE, ACC, baselines, distributed accumulator, scoring."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr

from jigsaw_earth.cli import main
from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.distributed.tiles import TileGrid
from jigsaw_earth.metrics import (
    MetricAccumulator,
    acc,
    bias,
    climatology_forecast,
    cos_latitude_weights,
    evaluate,
    latitude_weights,
    mse,
    persistence_forecast,
    rmse,
    truth_at_valid_time,
    wb1_acc,
    wb1_rmse,
)

LAT_1P5 = np.linspace(-90, 90, 121)  # with poles
LAT_5P625 = np.arange(-87.1875, 90, 5.625)  # 32 rows, no poles


# ------------------------------------------------------------------------------------ weights
def test_latitude_weights_1p5_with_poles():
    w = latitude_weights(LAT_1P5)
    half = math.radians(0.75)
    assert w.mean() == pytest.approx(1.0, abs=1e-12)
    assert w[60] == pytest.approx(121 * math.sin(half), rel=1e-12)  # equator: 1.583841
    assert w[60] == pytest.approx(1.5838410641, rel=1e-9)
    assert w[0] == w[-1] == pytest.approx(60.5 * (1 - math.cos(half)), rel=1e-9)  # half cell: 0.005183
    assert w[0] == pytest.approx(0.0051831818, rel=1e-7) and w[0] > 0
    assert w[90] == pytest.approx(121 * math.cos(math.radians(45)) * math.sin(half), rel=1e-12)
    # Descending latitude (the WB2 store order) gives the same weights reversed.
    np.testing.assert_array_equal(latitude_weights(LAT_1P5[::-1]), w[::-1])
    # WB1's cos weights give the pole zero.
    assert cos_latitude_weights(LAT_1P5)[0] == pytest.approx(0.0, abs=1e-15)


def test_latitude_weights_5p625_without_poles():
    w = latitude_weights(LAT_5P625)
    assert len(w) == 32 and w.mean() == pytest.approx(1.0, abs=1e-12)
    half = math.radians(2.8125)
    assert w[0] == pytest.approx(32 * math.cos(math.radians(87.1875)) * math.sin(half), rel=1e-12)
    assert w[0] == pytest.approx(0.0770443732, rel=1e-8)
    assert w[15] == pytest.approx(1.5682742453, rel=1e-9)
    # On this grid the cell edges reach ±90° exactly, so WB2's weights equal WB1's cos-lat weights.
    np.testing.assert_allclose(w, cos_latitude_weights(LAT_5P625), rtol=1e-12)


# --------------------------------------------------------------------------- constructed cases
def _grid(lat=LAT_5P625, n_lon=8):
    return {"latitude": lat, "longitude": np.arange(n_lon) * 360.0 / n_lon}


def _forecast(values: np.ndarray, lat=LAT_5P625) -> xr.DataArray:
    """values: (time, lead, lat, lon)"""
    coords = {
        "time": pd.date_range("2020-01-01", periods=values.shape[0], freq="12h").values,
        "prediction_timedelta": pd.to_timedelta(np.arange(1, values.shape[1] + 1) * 6, "h").values,
        **_grid(lat, values.shape[-1]),
    }
    return xr.DataArray(values, dims=["time", "prediction_timedelta", "latitude", "longitude"], coords=coords)


def test_rmse_is_sqrt_after_time_mean():
    err = np.zeros((2, 1, 32, 8))
    err[0] += 1.0  # MSE 1 at the first init
    err[1] += 3.0  # MSE 9 at the second
    f = _forecast(err)
    t = xr.zeros_like(f)
    assert rmse(f, t).item() == pytest.approx(math.sqrt(5.0))  # not the mean of RMSEs (2.0)
    assert np.sqrt(mse(f, t)).mean("time").item() == pytest.approx(2.0)
    assert bias(f, t).item() == pytest.approx(2.0)
    assert wb1_rmse(f, t).item() == pytest.approx(math.sqrt(5.0))


def test_rmse_weights_rows_by_area():
    err = np.zeros((1, 1, 121, 4))
    err[:, :, 0] = 10.0  # error only in the south-pole row: its half-cell weight counts
    f = _forecast(err, LAT_1P5)
    expected = math.sqrt(100 * latitude_weights(LAT_1P5)[0] / 121)
    assert rmse(f, xr.zeros_like(f)).item() == pytest.approx(expected, rel=1e-12)


def test_acc_constructed_anomalies():
    rng = np.random.default_rng(0)
    clim = _forecast(rng.normal(size=(3, 2, 32, 8)))
    anom = _forecast(rng.normal(size=(3, 2, 32, 8)))
    truth = clim + anom
    assert np.allclose(acc(clim + 2 * anom, truth, clim), 1.0)  # scale does not matter
    assert np.allclose(acc(clim - anom, truth, clim), -1.0)
    lon = np.deg2rad(clim["longitude"])
    ortho_f, ortho_o = np.sin(lon) + 0 * clim, np.cos(lon) + 0 * clim  # orthogonal around a circle
    assert np.allclose(acc(clim + ortho_f, clim + ortho_o, clim), 0.0, atol=1e-12)
    # Uncentred (WB2) ACC sees a constant offset; centred (WB1) ACC removes it.
    shifted = clim + anom + 3.0
    assert float(acc(shifted, truth, clim).mean()) < 0.5
    per_lead = wb1_acc(shifted, truth, truth)
    assert np.allclose(per_lead, wb1_acc(clim + anom, truth, truth))


def _truth_ds(times, lat=LAT_5P625, n_lon=8, seed=1) -> xr.Dataset:
    rng = np.random.default_rng(seed)
    shape = (len(times), 2, len(lat), n_lon)
    return xr.Dataset(
        {
            "geopotential": (("time", "level", "latitude", "longitude"), 5e4 + 500 * rng.normal(size=shape)),
            "2m_temperature": (
                ("time", "latitude", "longitude"),
                280 + rng.normal(size=shape[:1] + shape[2:]),
            ),
        },
        coords={"time": times, "level": [500, 850], **_grid(lat, n_lon)},
    )


def _clim_ds(lat=LAT_5P625, n_lon=8) -> xr.Dataset:
    hours, doys = [0, 6, 12, 18], np.arange(1, 367)
    code = doys[None, :] * 100.0 + np.array(hours)[:, None]  # value = dayofyear·100 + hour
    base = np.broadcast_to(code[:, :, None, None], (4, 366, len(lat), n_lon))
    return xr.Dataset(
        {
            "geopotential": (
                ("hour", "dayofyear", "level", "latitude", "longitude"),
                np.stack([base] * 2, 2) + 5e4,
            ),
            "2m_temperature": (("hour", "dayofyear", "latitude", "longitude"), base + 0.0),
        },
        coords={"hour": hours, "dayofyear": doys, "level": [500, 850], **_grid(lat, n_lon)},
    )


def test_persistence_and_climatology_forecasts():
    times = pd.date_range("2020-02-27", "2020-03-03", freq="6h").values
    truth = _truth_ds(times)
    init = xr.DataArray(np.array(["2020-02-28T18"], "datetime64[ns]"), dims="time")
    init = init.assign_coords(time=init.values)
    lead = xr.DataArray(pd.to_timedelta([12, 24], "h").values, dims="prediction_timedelta")
    lead = lead.assign_coords(prediction_timedelta=lead.values)
    clim = climatology_forecast(_clim_ds()["2m_temperature"], init, lead)
    # valid 2020-02-29T06 → dayofyear 60, hour 6; valid 2020-02-29T18 → 60, 18
    np.testing.assert_array_equal(clim.isel(latitude=0, longitude=0).values, [[6006.0, 6018.0]])
    pers = persistence_forecast(truth["2m_temperature"], init, lead)
    at_init = truth["2m_temperature"].sel(time="2020-02-28T18").values
    np.testing.assert_array_equal(pers.isel(prediction_timedelta=1).values[0], at_init)
    fc = xr.Dataset({"x": pers}).assign_coords(time=init.values)
    valid = truth_at_valid_time(truth[["2m_temperature"]], fc)
    np.testing.assert_array_equal(
        valid["2m_temperature"].isel(time=0, prediction_timedelta=1).values,
        truth["2m_temperature"].sel(time="2020-02-29T18").values,
    )


# ------------------------------------------------------------------ distributed accumulator
B, L, V, NLAT, NLON = 6, 2, 3, 9, 10


def _global_batch():
    g = torch.Generator().manual_seed(3)
    truth = torch.randn(B, L, V, NLAT, NLON, generator=g, dtype=torch.float64)
    fc = truth + 0.3 * torch.randn(B, L, V, NLAT, NLON, generator=g, dtype=torch.float64)
    clim = truth + torch.randn(B, L, V, NLAT, NLON, generator=g, dtype=torch.float64)
    return fc, truth, clim


def _accumulate(mesh: DomainMesh) -> dict:
    grid = TileGrid(NLAT, NLON, mesh.shape.lat, mesh.shape.lon)
    tile = grid.tile_of(mesh.domain.index)
    lat = np.linspace(90, -90, NLAT)
    w = torch.tensor(latitude_weights(lat)[tile.lat_start : tile.lat_stop])
    accum = MetricAccumulator(w, (NLAT, NLON), mesh.domain, mesh.axis("data"))
    fc, truth, clim = _global_batch()
    ls, lo = tile.slices
    mine = slice(mesh.coord[0], None, mesh.shape.data)  # data replicas see different samples
    for start in range(0, B, 2):  # several updates
        sl = slice(start, start + 2)
        accum.update(fc[sl][mine][..., ls, lo], truth[sl][mine][..., ls, lo], clim[sl][mine][..., ls, lo])
    out = accum.compute()
    return {k: v.tolist() for k, v in out.items()}


@pytest.fixture(scope="module")
def accumulated():
    return {
        m: spawn(s, _accumulate)
        for m, s in [("1x1", MeshShape()), ("2x2", MeshShape(1, 2, 2)), ("2x1x2", MeshShape(2, 1, 2))]
    }


def test_accumulator_matches_xarray(accumulated):
    fc, truth, clim = (x.numpy() for x in _global_batch())
    coords = {
        "time": pd.date_range("2020-01-01", periods=B, freq="12h").values,
        "prediction_timedelta": pd.to_timedelta(np.arange(1, L + 1) * 6, "h").values,
        "variable": np.arange(V),
        "latitude": np.linspace(90, -90, NLAT),
        "longitude": np.arange(NLON) * 36.0,
    }
    dims = ["time", "prediction_timedelta", "variable", "latitude", "longitude"]
    f, t, c = (xr.DataArray(a, dims=dims, coords=coords) for a in (fc, truth, clim))
    serial = accumulated["1x1"][0]
    np.testing.assert_allclose(serial["rmse"], rmse(f, t).values, rtol=1e-12)
    np.testing.assert_allclose(serial["bias"], bias(f, t).values, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(serial["acc"], acc(f, t, c).values, rtol=1e-12)
    assert serial["count"] == [B]


@pytest.mark.parametrize("mesh", ["2x2", "2x1x2"])
def test_accumulator_mesh_invariant(accumulated, mesh):
    serial = accumulated["1x1"][0]
    for rank_result in accumulated[mesh]:
        for key in ("rmse", "mse", "bias", "acc", "count"):
            np.testing.assert_allclose(rank_result[key], serial[key], rtol=1e-12, atol=1e-15, err_msg=key)


# ----------------------------------------------------------------------------- end to end
def test_score_store_end_to_end(tmp_path, capsys):
    n_lon = 64  # the WB1 5.625° grid, so the published WB1 baselines line up
    times = pd.date_range("2020-01-01", "2020-01-08", freq="6h").values
    truth = _truth_ds(times, n_lon=n_lon).sortby("latitude", ascending=False)  # WB2 order
    inits = times[:8:2]
    leads = pd.to_timedelta([24, 72], "h").values
    rng = np.random.default_rng(5)
    valid = truth.sel(time=(inits[:, None] + leads[None, :]).ravel())
    fc = xr.Dataset(
        {
            name: (
                ("time", "prediction_timedelta", *da.dims[1:]),
                da.values.reshape(len(inits), len(leads), *da.shape[1:])
                + rng.normal(size=(len(inits), len(leads), *da.shape[1:])),
            )
            for name, da in valid.data_vars.items()
        },
        coords={
            "time": inits,
            "prediction_timedelta": leads,
            "level": [500, 850],
            **_grid(LAT_5P625[::-1], n_lon),
        },
    )
    # Another source's names and ascending latitude in the truth store: mapped by name and value.
    truth_other = truth.rename({"latitude": "lat", "2m_temperature": "t2m"}).sortby("lat")
    fc.to_zarr(tmp_path / "fc.zarr")
    truth_other.to_zarr(tmp_path / "truth.zarr")
    _clim_ds(n_lon=n_lon).to_zarr(tmp_path / "clim.zarr")
    baselines = tmp_path / "baselines.csv"
    baselines.write_text(
        "benchmark,resolution,eval_period,model,variable,level_hpa,lead_days,rmse,unit\n"
        "WB1,5.625deg,2017-2018,IFS T42,geopotential,500,3,489,m2/s2\n"
        "WB2,1.5deg,2020,IFS HRES,geopotential,500,3,137.2,m2/s2\n"
    )
    code = main(
        [
            "score", str(tmp_path / "fc.zarr"), "--truth", str(tmp_path / "truth.zarr"),
            "--climatology", str(tmp_path / "clim.zarr"), "--baselines", str(baselines),
            "--out", str(tmp_path / "scores"), "--plot", str(tmp_path / "png"),
        ]
    )  # fmt: skip
    assert code == 0
    pngs = sorted(p.name for p in (tmp_path / "png").glob("*.png"))
    assert pngs == [
        "map-2m_temperature.png", "map-geopotential.png", "scorecard-global.png",
        "significance-climatology.png", "significance-persistence.png",
    ]  # fmt: skip
    assert all((tmp_path / "png" / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert main(["plot", str(tmp_path / "scores.json"), "--out", str(tmp_path / "again")]) == 0
    assert sorted(p.name for p in (tmp_path / "again").glob("*.png")) == pngs
    out = capsys.readouterr().out
    assert "WB1 5.625deg, evaluated 2017-2018" in out and "IFS T42 489" in out and "IFS HRES" not in out
    assert max(map(len, out.splitlines())) <= 100, "the scorecard fits 100 columns"
    rows = json.loads((tmp_path / "scores.json").read_text())["scores"]
    with open(tmp_path / "scores.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    got = {(r["model"], r["metric"], r["variable"], r["level"], r["lead_hours"]): r["value"] for r in rows}
    # The forecast's error is unit normal noise: RMSE ≈ 1; ACC and persistence present.
    assert 0.8 < got[("forecast", "rmse", "2m_temperature", None, 24.0)] < 1.2
    assert ("persistence", "rmse", "geopotential", 500, 72.0) in got
    assert ("climatology", "rmse", "geopotential", 850, 24.0) in got
    assert ("forecast", "acc", "geopotential", 500, 72.0) in got
    direct = evaluate(fc, truth, None, baselines=False)
    for r in direct:
        assert got[(r["model"], r["metric"], r["variable"], r["level"], r["lead_hours"])] == pytest.approx(
            r["value"]
        )
    # Errors name the problem: a truth store that does not cover the valid times.
    assert main(["score", str(tmp_path / "fc.zarr"), "--truth", str(tmp_path / "missing.zarr")]) == 2
    with pytest.raises(ValueError, match="truth lacks"):
        evaluate(fc, truth.isel(time=slice(0, 5)))
