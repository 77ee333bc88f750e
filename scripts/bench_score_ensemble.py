"""Time `jigsaw-earth score` on an ensemble store against the same store's members scored as
deterministic forecasts: what WB2's ensemble metrics (CRPS skill and fair spread, ensemble variance,
the ensemble mean's RMSE/bias/ACC) cost per member field beside RMSE/bias/ACC of one forecast.

    python scripts/bench_score_ensemble.py --dir runs/bench-score-ens [--members 10] [--repeats 3]

Stores (Zarr, float32, chunks of one init × lead × member, as predict writes them): a truth on the
1.5° grid (121 × 240, poles included) with geopotential at 500 and 850 hPa and 2m temperature,
its climatology, an ensemble forecast of N members (8 inits × 4 leads) and member 0 alone as a
deterministic store. One thread. Runs alternate (ensemble, deterministic, deterministic, ensemble …);
prints per-repeat CPU and wall times and the median of ensemble / (N × deterministic).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import xarray as xr

from jigsaw_earth.metrics import evaluate

N_LAT, N_LON, N_INIT, N_LEAD = 121, 240, 8, 4


def make_stores(root: Path, members: int) -> tuple[Path, Path, Path, Path]:
    paths = [root / n for n in ("truth.zarr", "clim.zarr", f"ens{members}.zarr", "member0.zarr")]
    if all(p.exists() for p in paths):
        return tuple(paths)  # type: ignore[return-value]
    rng = np.random.default_rng(0)
    times = pd.date_range("2020-01-01", periods=2 * N_INIT + N_LEAD + 2, freq="6h").values
    grid = {"latitude": np.linspace(90, -90, N_LAT), "longitude": np.arange(N_LON) * 1.5}
    shape = (times.size, N_LAT, N_LON)
    truth = xr.Dataset(
        {
            "geopotential": (("time", "level", "latitude", "longitude"),
                             5e4 + 300 * rng.standard_normal((times.size, 2, N_LAT, N_LON), np.float32)),
            "2m_temperature": (("time", "latitude", "longitude"),
                               280 + 3 * rng.standard_normal(shape, np.float32)),
        },
        coords={"time": times, "level": [500, 850], **grid},
    )  # fmt: skip
    clim = truth.mean("time").expand_dims(hour=[0, 6, 12, 18], dayofyear=np.arange(1, 367))
    inits, leads = times[: 2 * N_INIT : 2], np.arange(1, N_LEAD + 1) * np.timedelta64(6, "h")
    fc = {}
    for name, da in truth.data_vars.items():
        valid = da.sel(time=(inits[:, None] + leads[None, :]).ravel()).values
        valid = valid.reshape(N_INIT, N_LEAD, 1, *da.shape[1:])
        noise = rng.standard_normal((N_INIT, N_LEAD, members, *da.shape[1:]), np.float32)
        fc[name] = (("time", "prediction_timedelta", "number", *da.dims[1:]), valid + noise)
    ens = xr.Dataset(fc, coords={"time": inits, "prediction_timedelta": leads, "number": np.arange(members),
                                 "level": [500, 850], **grid})  # fmt: skip
    chunks = {"time": 1, "prediction_timedelta": 1, "number": 1}
    truth.chunk({"time": 1}).to_zarr(paths[0], mode="w")
    clim.chunk({"hour": 1, "dayofyear": 1}).to_zarr(paths[1], mode="w")
    ens.chunk(chunks).to_zarr(paths[2], mode="w")
    ens.isel(number=0, drop=True).chunk({"time": 1, "prediction_timedelta": 1}).to_zarr(paths[3], mode="w")
    return tuple(paths)  # type: ignore[return-value]


def timed(fc: Path, truth: Path, clim: Path) -> tuple[float, float]:
    opened = [xr.open_zarr(p, chunks=None) for p in (fc, truth, clim)]
    c0, w0 = time.process_time(), time.perf_counter()
    evaluate(*opened, regions=["all"])
    return time.process_time() - c0, time.perf_counter() - w0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", type=Path, default=Path("runs/bench-score-ens"))
    parser.add_argument("--members", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.dir.mkdir(parents=True, exist_ok=True)
    truth, clim, ens, det = make_stores(args.dir, args.members)
    ratios_cpu, ratios_wall = [], []
    for r in range(args.repeats):
        order = ("ens", "det", "det", "ens") if r % 2 == 0 else ("det", "ens", "ens", "det")
        got: dict[str, list[tuple[float, float]]] = {"ens": [], "det": []}
        for which in order:
            got[which].append(timed(ens if which == "ens" else det, truth, clim))
        e = [sum(x) / 2 for x in zip(*got["ens"])]
        d = [sum(x) / 2 for x in zip(*got["det"])]
        ratios_cpu.append(e[0] / (args.members * d[0]))
        ratios_wall.append(e[1] / (args.members * d[1]))
        print(f"repeat {r}: ensemble of {args.members}: {e[0]:.2f} s CPU, {e[1]:.2f} s wall; one member as a "
              f"deterministic store: {d[0]:.2f} s CPU, {d[1]:.2f} s wall")  # fmt: skip
    cpu, wall = (f"{statistics.median(r):.2f} ({min(r):.2f}–{max(r):.2f})" for r in (ratios_cpu, ratios_wall))
    what = f"ensemble / ({args.members} × deterministic), median over {args.repeats} repeats"
    print(f"{what}: CPU {cpu}, wall {wall}")


if __name__ == "__main__":
    main()
