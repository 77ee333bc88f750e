"""Time `jigsaw-earth score`'s engine against a straightforward xarray/dask implementation of WB2's
formulas (WB2's own package is not on PyPI and its evaluation needs apache-beam), on the demo-size
stores: `jigsaw-earth data synth` and a forecast store written by ForecastWriter as predict writes it
(2x2 tiles, chunks (1, 1, level, 16, 32)), truth + noise at the valid times.

    python scripts/bench_score.py --dir runs/bench-score [--repeats 3] [--inits N]

All compute RMSE, bias and ACC of the forecast, persistence and climatology for every variable,
level and lead (global): ours (`evaluate`, stores opened as `score` opens them), the xarray
formulas on dask (single-threaded, as WB2 opens stores), and the same formulas on fields loaded
into memory first. Runs alternate; prints per-repeat timings and the median ratios (CPU and wall).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import dask
import numpy as np
import xarray as xr
from jigsaw_earth.data.synth import SynthConfig, synth_store

from jigsaw_earth.distributed.tiles import TileGrid
from jigsaw_earth.inference import ForecastLayout, ForecastWriter
from jigsaw_earth.metrics import evaluate


def make_stores(root: Path, steps: int = 4) -> tuple[Path, Path, Path]:
    data, fc_path = root / "data.zarr", root / "forecast.zarr"
    clim = data.with_name("data-climatology.zarr")
    if not data.exists():
        synth_store(data, SynthConfig())
    if not fc_path.exists():
        truth = xr.open_zarr(data)
        t = truth.time.values
        inits = t[(t >= np.datetime64("2020-01-01")) & (t <= np.datetime64("2020-03-31T18"))][::2]
        leads = np.arange(1, steps + 1) * np.timedelta64(6, "h")
        upper = tuple(v for v in truth.data_vars if "level" in truth[v].dims)
        surface = tuple(
            v for v in truth.data_vars if "level" not in truth[v].dims and "time" in truth[v].dims
        )
        layout = ForecastLayout(
            inits, leads, upper, tuple(int(x) for x in truth.level.values), surface,
            truth.latitude.values, truth.longitude.values,
        )  # fmt: skip
        grid = TileGrid(truth.sizes["latitude"], truth.sizes["longitude"], 2, 2)
        writer = ForecastWriter(fc_path, layout, grid, 0)
        rng = np.random.default_rng(0)
        for i, init in enumerate(inits):
            valid = truth.sel(time=init + leads).load()
            for k in range(steps):
                fields = np.concatenate(
                    [
                        valid[v].isel(time=k).values.reshape(-1, grid.n_lat, grid.n_lon)
                        for v in (*upper, *surface)
                    ]
                )
                fields = fields * (1 + 1e-3 * rng.normal(size=fields.shape))
                for rank in range(4):
                    tile = grid.tile_of(rank)
                    rows, cols = tile.slices
                    writer.write(i, k, fields[:, rows, cols].astype(np.float32), tile)
        writer.close()
    return fc_path, data, clim


INITS = 0  # score only the first N inits (0: all), the same for both


def xarray_wb2(fc_path: Path, truth_path: Path, clim_path: Path, eager: bool = False) -> dict:
    """WB2's formulas written plainly with xarray: on dask as WB2 opens stores (one compute), or
    ``eager``: the needed truth and climatology fields loaded into memory first, then numpy."""
    chunks = None if eager else {}
    fc, truth, clim = (xr.open_zarr(p, chunks=chunks) for p in (fc_path, truth_path, clim_path))
    names = list(fc.data_vars)
    fc = fc[names].isel(time=slice(0, INITS or None))
    valid = fc.time + fc.prediction_timedelta
    obs = truth[names].sel(time=valid)
    c = clim[names].sel(dayofyear=valid.dt.dayofyear, hour=valid.dt.hour)
    pers = truth[names].sel(time=fc.time)
    if eager:
        fc, obs, c, pers = (x.load() for x in (fc, obs, c, pers))
    lat = np.deg2rad(np.sort(fc.latitude.values))
    edges = np.concatenate([[-np.pi / 2], (lat[1:] + lat[:-1]) / 2, [np.pi / 2]])
    w = np.sin(edges[1:]) - np.sin(edges[:-1])
    w = xr.DataArray(w / w.mean(), dims="latitude", coords={"latitude": np.sort(fc.latitude.values)})

    def mean(x):
        return x.weighted(w).mean(("latitude", "longitude"), skipna=False)

    out = {}
    for label, f in {"forecast": fc, "persistence": pers, "climatology": c}.items():
        out[(label, "rmse")] = np.sqrt(mean((f - obs) ** 2).mean("time", skipna=False))
        out[(label, "bias")] = mean(f - obs).mean("time", skipna=False)
        if label != "climatology":
            fa, oa = f - c, obs - c
            out[(label, "acc")] = (mean(fa * oa) / np.sqrt(mean(fa**2) * mean(oa**2))).mean(
                "time", skipna=False
            )
    return dict(zip(out, dask.compute(*out.values())))


def ours(fc_path: Path, truth_path: Path, clim_path: Path) -> list:
    fc, truth, clim = (xr.open_zarr(p, chunks=None) for p in (fc_path, truth_path, clim_path))
    return evaluate(fc.isel(time=slice(0, INITS or None)), truth, clim)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", type=Path, default=Path("runs/bench-score"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--inits", type=int, default=0, help="score only the first N inits (0: all)")
    args = parser.parse_args()
    global INITS
    INITS = args.inits
    dask.config.set(scheduler="threads", num_workers=1)  # one core, as this engine
    paths = make_stores(args.dir)
    size = sum(f.stat().st_size for f in paths[0].rglob("*") if f.is_file())
    print(f"forecast store {paths[0]}: {size / 2**20:.1f} MiB on disk", flush=True)
    c0 = time.process_time()
    rows = ours(*paths)
    c1 = time.process_time()
    ref = xarray_wb2(*paths)
    print(f"first pass CPU: ours {c1 - c0:.2f} s, xarray {time.process_time() - c1:.2f} s", flush=True)
    worst = {"rmse": 0.0, "acc": 0.0, "bias": 0.0}  # relative for RMSE and ACC, absolute for bias (≈ 0)
    for r in rows:
        da = ref[(r["model"], r["metric"])][r["variable"]]
        sel = da.sel(prediction_timedelta=np.timedelta64(int(r["lead_hours"]), "h"))
        if r["level"] is not None:
            sel = sel.sel(level=r["level"])
        diff = abs(r["value"] - float(sel))
        worst[r["metric"]] = max(
            worst[r["metric"]], diff if r["metric"] == "bias" else diff / abs(float(sel))
        )
    print(
        f"{len(rows)} scores; largest difference from the xarray implementation: RMSE {worst['rmse']:.1e} "
        f"and ACC {worst['acc']:.1e} relative, bias {worst['bias']:.1e} absolute (float32 stores)",
        flush=True,
    )
    runs = {
        "ours": ours,
        "xarray-dask": xarray_wb2,
        "xarray-eager": lambda *p: xarray_wb2(*p, eager=True),
    }
    ratios: dict[str, list[tuple[float, float]]] = {"xarray-dask": [], "xarray-eager": []}
    for rep in range(args.repeats):
        timings = {}
        for name in list(runs) if rep % 2 == 0 else list(runs)[::-1]:  # alternate the order
            c0, w0 = time.process_time(), time.perf_counter()
            runs[name](*paths)
            timings[name] = (time.process_time() - c0, time.perf_counter() - w0)
        line = "; ".join(f"{n} {w:.2f} s wall / {c:.2f} s CPU" for n, (c, w) in timings.items())
        print(f"repeat {rep}: {line}", flush=True)
        for other in ratios:
            ratios[other].append(
                (timings["ours"][0] / timings[other][0], timings["ours"][1] / timings[other][1])
            )
    for other, rs in ratios.items():
        print(
            f"median ratio ours/{other}: CPU {statistics.median(r[0] for r in rs):.3f}, "
            f"wall {statistics.median(r[1] for r in rs):.3f} (< 1: ours is faster)"
        )


if __name__ == "__main__":
    main()
