"""WB2's ensemble scores of ``evaluate`` (and of the tile accumulator behind ``predict --score``)
against an independent, straightforward numpy/xarray computation of WB2's formulas: CRPS with its
skill and spread terms (the fair estimator as a double sum over member pairs), ensemble-mean RMSE,
ensemble standard deviation (ddof 1) and the spread/skill ratio; every region, NaN, 1 and > 1
members, the member dimension's aliases, and tiles on several meshes."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
import xarray as xr

from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.distributed.tiles import TileGrid
from jigsaw_earth.metrics import MetricAccumulator, engine, evaluate
from jigsaw_earth.metrics.regions import REGIONS
from jigsaw_earth.metrics.tile_regions import TileRegions
from jigsaw_earth.metrics.weights import latitude_weights
from tests.test_scoring_wb2 import LAT, _at_valid, _stores, _table, ref_mean, ref_weights

METRICS = ("crps", "crps_skill", "crps_spread", "ensemble_stddev", "spread_skill", "rmse", "bias")


# ------------------------------------------------------------------ the independent reference
def ref_ensemble(f: xr.DataArray, o: xr.DataArray, weights: xr.DataArray, region: str) -> dict:
    """WB2's ensemble metrics per lead[, level] of one variable; ``f`` has dim ``number``."""
    o = o.sel(latitude=f.latitude, longitude=f.longitude)  # by value: the stores' orders differ
    x, y = f.values, o.transpose(*[d for d in f.dims if d != "number"]).values
    axis = f.dims.index("number")
    m = x.shape[axis]
    skill = np.abs(x - np.expand_dims(y, axis)).mean(axis)
    if m == 1:  # WB2: zeros_like, NaN or not
        spread = var = np.zeros_like(skill)
    else:
        pairs = sum(np.abs(x.take(i, axis) - x.take(j, axis)) for i in range(m) for j in range(m))
        spread, var = pairs / (m * (m - 1)), x.var(axis, ddof=1)
    mean_err = x.mean(axis) - y
    dims = [d for d in f.dims if d != "number"]

    def tmean(a: np.ndarray) -> xr.DataArray:
        da = xr.DataArray(a, dims=dims, coords={d: f[d] for d in dims})
        return ref_mean(da, weights, region).mean("time", skipna=False)

    sk, sp, v, se = tmean(skill), tmean(spread), tmean(var), tmean(mean_err**2)
    return {
        "crps": sk - sp / 2,
        "crps_skill": sk,
        "crps_spread": sp,
        "ensemble_stddev": np.sqrt(v),
        "spread_skill": np.sqrt(v) / np.sqrt(se),
        "rmse": np.sqrt(se),
        "bias": tmean(mean_err),
    }


def _ensemble(
    n_members: int, seed: int = 0, dim: str = "number"
) -> tuple[xr.Dataset, xr.Dataset, xr.Dataset]:
    """``_stores``' forecast as ``n_members`` members (a shared error plus each member's noise)."""
    fc, truth, clim = _stores(seed)
    rng = np.random.default_rng(seed + 1)
    out = {}
    for name, da in fc.data_vars.items():
        noise = rng.normal(0.0, 0.7, (n_members, *da.shape))
        members = da.values[None] + noise
        out[name] = xr.DataArray(
            np.moveaxis(members, 0, 2), dims=(*da.dims[:2], dim, *da.dims[2:]), coords=da.coords
        )
    return xr.Dataset(out).assign_coords({dim: np.arange(n_members)}), truth, clim


def _check(got: dict, fc: xr.Dataset, truth: xr.Dataset, regions: list[str]) -> int:
    obs = _at_valid(truth, fc)
    n = 0
    for region in regions:
        for var in fc.data_vars:
            ref = ref_ensemble(fc[var], obs[var], ref_weights(LAT), region)
            for metric, da in ref.items():
                da = da.transpose("prediction_timedelta", ...)
                levels = da.level.values if "level" in da.dims else [None]
                for i, lead in enumerate(fc.prediction_timedelta.values / np.timedelta64(1, "h")):
                    for k, lev in enumerate(levels):
                        want = da.values[i] if lev is None else da.values[i, k]
                        have = got[("forecast", metric, region, var, None if lev is None else int(lev), lead)]
                        np.testing.assert_allclose(
                            have,
                            want,
                            rtol=1e-10,
                            atol=1e-12,
                            err_msg=f"{metric} {region} {var} {lev} {lead}",
                        )
                        n += 1
    return n


# ------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("n_members", [1, 2, 5])
def test_every_region_equals_the_reference(n_members: int, monkeypatch) -> None:
    fc, truth, clim = _ensemble(n_members)
    rows = evaluate(fc, truth, clim, regions=["all"])
    got = _table(rows)
    assert _check(got, fc, truth, list(REGIONS)) == 13 * 3 * 2 * len(METRICS)
    assert {r["unit"] for r in rows if r["metric"] == "spread_skill"} == {"1"}
    units = {(r["variable"], r["metric"]): r["unit"] for r in rows}
    assert units[("geopotential", "crps")] == units[("geopotential", "ensemble_stddev")] == "m2/s2"
    if n_members == 1:  # WB2: no spread, and CRPS is the MAE
        crps = [v for k, v in got.items() if k[1] == "crps"]
        mae = [v for k, v in got.items() if k[1] == "crps_skill"]
        assert crps == mae and all(
            v == 0 for k, v in got.items() if k[1] in ("crps_spread", "ensemble_stddev")
        )
    # the baselines and ACC are still there, and a block per init gives the same numbers
    assert ("persistence", "rmse", "europe", "geopotential", 500, 24.0) in got
    assert ("forecast", "acc", "global", "2m_temperature", None, 12.0) in got
    monkeypatch.setattr(engine, "READ_BYTES", 1)
    again = _table(evaluate(fc, truth, clim, regions=["all"]))
    np.testing.assert_allclose([again[k] for k in got], list(got.values()), rtol=1e-13)


def test_the_ensemble_mean_is_scored_as_a_deterministic_forecast() -> None:
    fc, truth, clim = _ensemble(3)
    got = _table(evaluate(fc, truth, clim, regions=["global", "tropics"]))
    det = _table(evaluate(fc.mean("number"), truth, clim, regions=["global", "tropics"]))
    for key, value in det.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-12, err_msg=str(key))


@pytest.mark.parametrize("dim", ["realization", "member"])
def test_member_dimension_aliases(dim: str) -> None:
    fc, truth, _ = _ensemble(2, dim=dim)
    got = _table(evaluate(fc, truth, None, regions=["global"]))
    assert _check(got, fc.rename({dim: "number"}), truth, ["global"]) == 3 * 2 * len(METRICS)


@pytest.mark.parametrize("n_members", [1, 3])
def test_nan_gives_nan_where_it_counts(n_members: int, caplog) -> None:
    fc, truth, _ = _ensemble(n_members)
    z = fc["geopotential"].values.copy()
    j_lat, j_lon = int(np.argmin(abs(fc.latitude.values - 51))), int(np.argmin(abs(fc.longitude.values - 9)))
    z[1, 1, n_members - 1, 0, j_lat, j_lon] = np.nan  # init 1, lead 24 h, the last member, 500 hPa, Europe
    fc["geopotential"] = fc["geopotential"].copy(data=z)
    regions = ["global", "europe", "tropics"]
    with caplog.at_level(logging.WARNING):
        got = _table(evaluate(fc, truth, None, regions=regions))
    assert "geopotential@500 at 24 h: 1 values in 1 of 3 inits" in caplog.text
    for metric in ("crps", "crps_skill", "rmse", "spread_skill"):
        assert np.isnan(got[("forecast", metric, "europe", "geopotential", 500, 24.0)]), metric
        assert np.isfinite(got[("forecast", metric, "tropics", "geopotential", 500, 24.0)]), metric
        assert np.isfinite(got[("forecast", metric, "global", "geopotential", 850, 24.0)]), metric
    spread = got[("forecast", "crps_spread", "europe", "geopotential", 500, 24.0)]
    assert np.isnan(spread) if n_members > 1 else spread == 0  # WB2: one member has no spread
    assert _check(got, fc, truth, regions) == 3 * 3 * 2 * len(METRICS)  # NaN and finite values alike


def test_a_member_dimension_in_the_truth_is_refused() -> None:
    fc, truth, _ = _ensemble(2)
    with pytest.raises(ValueError, match="truth store has a member dimension 'number'"):
        evaluate(fc, truth.expand_dims(number=[0]), None)


# ------------------------------------------------------------------ tiles: predict --score's path
B, L, M, V, NLAT, NLON = 4, 2, 3, 2, 9, 12
TILE_LAT, TILE_LON = np.linspace(90, -90, NLAT), np.arange(NLON) * 30.0


def _members_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    truth = torch.randn(B, L, V, NLAT, NLON, generator=g, dtype=torch.float64)
    fc = truth[:, :, None] + 0.5 * torch.randn(B, L, M, V, NLAT, NLON, generator=g, dtype=torch.float64)
    clim = truth + torch.randn(B, L, V, NLAT, NLON, generator=g, dtype=torch.float64)
    return fc, truth, clim


def _accumulate_members(mesh: DomainMesh) -> dict:
    grid = TileGrid(NLAT, NLON, mesh.shape.lat, mesh.shape.lon)
    tile = grid.tile_of(mesh.domain.index)
    w = torch.tensor(latitude_weights(TILE_LAT)[tile.lat_start : tile.lat_stop])
    regions = TileRegions.build(TILE_LAT, TILE_LON, tile, ["global", "tropics", "europe"])
    accum = MetricAccumulator(w, (NLAT, NLON), mesh.domain, mesh.axis("data"), regions=regions, members=M)
    fc, truth, clim = _members_batch()
    ls, lo = tile.slices
    mine = slice(mesh.coord[0], None, mesh.shape.data)
    for start in range(0, B, 2):
        sl = slice(start, start + 2)
        accum.update(fc[sl][mine][..., ls, lo], truth[sl][mine][..., ls, lo], clim[sl][mine][..., ls, lo])
    return {k: v.tolist() for k, v in accum.compute().items()}


@pytest.fixture(scope="module")
def tiled() -> dict:
    return {
        m: spawn(s, _accumulate_members) for m, s in [("1x1", MeshShape()), ("2x1x2", MeshShape(2, 1, 2))]
    }


def _same(result: list[dict], serial: dict, mesh: str) -> None:
    for rank_result in result:
        for key in (*METRICS, "acc", "count"):
            np.testing.assert_allclose(
                rank_result[key], serial[key], rtol=1e-12, atol=1e-14, err_msg=f"{mesh} {key}"
            )


def test_tile_accumulator_equals_evaluate(tiled: dict) -> None:
    fc, truth, _ = (x.numpy() for x in _members_batch())
    times = np.datetime64("2020-01-01T00", "ns") + np.arange(B + 2 * L + 2) * np.timedelta64(6, "h")
    leads = np.arange(1, L + 1) * np.timedelta64(6, "h")
    grid = {"latitude": TILE_LAT, "longitude": TILE_LON}
    names = [f"v{k}" for k in range(V)]
    # a truth store whose valid-time fields are the batch's truth (init k at times[2k], lead l at 6 h·l)
    inits = times[0 : 2 * B : 2]
    t_all = np.zeros((times.size, V, NLAT, NLON))
    for b in range(B):
        for lead in range(L):
            t_all[2 * b + lead + 1] = truth[b, lead]
    truth_ds = xr.Dataset(
        {n: (("time", "latitude", "longitude"), t_all[:, k]) for k, n in enumerate(names)},
        coords={"time": times, **grid},
    )
    fc_ds = xr.Dataset(
        {
            n: (("time", "prediction_timedelta", "number", "latitude", "longitude"), fc[:, :, :, k])
            for k, n in enumerate(names)
        },
        coords={"time": inits, "prediction_timedelta": leads, "number": np.arange(M), **grid},
    )
    rows = evaluate(fc_ds, truth_ds, None, regions=["global", "tropics", "europe"], baselines=False)
    got = _table(rows)
    serial = tiled["1x1"][0]
    for r, region in enumerate(["global", "tropics", "europe"]):
        for metric in METRICS:
            for k, n in enumerate(names):
                for li in range(L):
                    want = got[("forecast", metric, region, n, None, 6.0 * (li + 1))]
                    np.testing.assert_allclose(
                        serial[metric][li][k][r], want, rtol=1e-10, atol=1e-13, err_msg=f"{metric} {region}"
                    )
    _same(tiled["2x1x2"], serial, "2x1x2")


@pytest.mark.slow
def test_tile_accumulator_on_an_uneven_2x3_mesh(tiled: dict) -> None:
    _same(spawn(MeshShape(1, 2, 3), _accumulate_members), tiled["1x1"][0], "2x3")


# ----------------------------------------------------------------------------- end to end
def test_score_command_prints_writes_and_plots_the_ensemble(tmp_path, capsys) -> None:
    from jigsaw_earth.cli import main

    fc, truth, clim = _ensemble(3, dim="realization")
    fc.to_zarr(tmp_path / "fc.zarr")
    truth.to_zarr(tmp_path / "truth.zarr")
    clim.to_zarr(tmp_path / "clim.zarr")
    fc_path, truth_path, clim_path = (str(tmp_path / n) for n in ("fc.zarr", "truth.zarr", "clim.zarr"))
    argv = ["score", fc_path, "--truth", truth_path, "--climatology", clim_path]
    argv += ["--out", str(tmp_path / "scores"), "--plot", str(tmp_path / "png")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "an ensemble of 3 members" in out and "spread/skill" in out
    table = [line for line in out.splitlines() if str(tmp_path) not in line]  # the file lines name tmp_path
    assert max(map(len, table)) <= 100, "the scorecard fits 100 columns"
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert scores["members"] == 3
    got = _table(scores["scores"])
    assert _check(got, fc.rename({"realization": "number"}), truth, ["global"]) == 3 * 2 * len(METRICS)
    pngs = sorted(p.name for p in (tmp_path / "png").glob("*.png"))
    assert pngs == [
        "map-2m_temperature.png", "map-geopotential.png", "scorecard-global.png",
        "significance-climatology.png", "significance-persistence.png",
    ]  # fmt: skip
    crps = [c for c in scores["comparisons"] if c["metric"] == "crps"]
    assert not crps, "CRPS is compared only with another ensemble (the baselines have no members)"
