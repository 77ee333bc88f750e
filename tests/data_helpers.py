"""Small ERA5-like stores written with plain xarray (independently of jigsaw_earth.data)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from jigsaw_earth.distributed.halo import Halo, pad_reference
from jigsaw_earth.distributed.tiles import Tile

UPPER = ("geopotential", "temperature")
SURFACE = ("2m_temperature", "mean_sea_level_pressure")
LEVELS = (250, 500, 850)
RENAME = {
    "geopotential": "z",
    "temperature": "t",
    "2m_temperature": "t2m",
    "mean_sea_level_pressure": "msl",
    "land_sea_mask": "lsm",
}


def synth_argv(out: str | Path, grid: str, end: str, *extra: str) -> list[str]:
    """``jigsaw-earth data synth`` of a small store laid out for mesh 2x2: levels 500 and 850 from
    2020-01-01 to ``end``, no climatology, then ``extra``."""
    return ["data", "synth", "--out", str(out), "--grid", grid, "--start", "2020-01-01", "--end", end,
            "--levels", "500,850", "--for-mesh", "2x2", "--no-climatology", *extra]  # fmt: skip


def truth(n_lat: int = 13, n_lon: int = 16, n_time: int = 10, seed: int = 0) -> dict[str, Any]:
    """Random global fields in the normalised order: latitude descending, levels ascending."""
    rng = np.random.default_rng(seed)
    lat = 90.0 - (np.arange(n_lat) + 0.5) * 180.0 / n_lat
    lon = np.arange(n_lon) * 360.0 / n_lon
    times = np.datetime64("2020-01-01T00", "ns") + np.arange(n_time) * np.timedelta64(6, "h")
    fields = {v: rng.normal(size=(n_time, len(LEVELS), n_lat, n_lon)).astype(np.float32) for v in UPPER}
    fields.update({v: rng.normal(size=(n_time, n_lat, n_lon)).astype(np.float32) for v in SURFACE})
    static = {
        "land_sea_mask": rng.uniform(size=(n_lat, n_lon)).astype(np.float32),
        "geopotential_at_surface": rng.normal(size=(n_lat, n_lon)).astype(np.float32),
    }
    return {"lat": lat, "lon": lon, "times": times, "fields": fields, "static": static}


def dataset(
    t: dict[str, Any],
    *,
    ascending: bool = False,
    swap: bool = False,
    rename: bool = False,
    levels_desc: bool = False,
    pascal: bool = False,
) -> xr.Dataset:
    """The truth as a store would hold it, in one of several layouts."""
    lat_idx = np.arange(len(t["lat"]))[::-1] if ascending else np.arange(len(t["lat"]))
    lev_idx = np.arange(len(LEVELS))[::-1] if levels_desc else np.arange(len(LEVELS))
    names = {"latitude": "lat", "longitude": "lon", "level": "plev"} if rename else {}
    la, lo, le = (names.get(d, d) for d in ("latitude", "longitude", "level"))
    sp = (lo, la) if swap else (la, lo)
    data = {}
    for v in UPPER:
        x = t["fields"][v][:, lev_idx][:, :, lat_idx]
        data[RENAME[v] if rename else v] = (("time", le, *sp), np.swapaxes(x, -1, -2) if swap else x)
    for v in SURFACE:
        x = t["fields"][v][:, lat_idx]
        data[RENAME[v] if rename else v] = (("time", *sp), np.swapaxes(x, -1, -2) if swap else x)
    for v, x in t["static"].items():
        x = x[lat_idx]
        data[RENAME.get(v, v) if rename else v] = (sp, x.T if swap else x)
    levels = np.array(LEVELS)[lev_idx] * (100 if pascal else 1)
    return xr.Dataset(data, coords={"time": t["times"], la: t["lat"][lat_idx], lo: t["lon"], le: levels})


def write(ds: xr.Dataset, path: str | Path, chunks: dict[str, int] | None = None, **kw: Any) -> str:
    enc = {}
    for v, da in ds.data_vars.items():
        enc[v] = {
            "chunks": tuple(
                min((chunks or {}).get(d, 1 if d == "time" else n), n) for d, n in zip(da.dims, da.shape)
            )
        }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(
            path if "://" not in str(path) else str(path), mode="w", encoding=enc, consolidated=False, **kw
        )
    return str(path)


def channels_global(t: dict[str, Any], time_index: int, levels=LEVELS) -> np.ndarray:
    """(C, n_lat, n_lon) in the documented channel order."""
    parts = [t["fields"][v][time_index][[LEVELS.index(lev) for lev in levels]] for v in UPPER]
    parts += [t["fields"][v][time_index][None] for v in SURFACE]
    return np.concatenate(parts)


def padded_window(field: np.ndarray, tile: Tile, halo: Halo) -> np.ndarray:
    """The tile's window of ``pad_reference`` of a global ``(..., n_lat, n_lon)`` field."""
    ref = pad_reference(torch.from_numpy(np.ascontiguousarray(field)), halo).numpy()
    return ref[
        ..., tile.lat_start : tile.lat_stop + sum(halo.lat), tile.lon_start : tile.lon_stop + sum(halo.lon)
    ]
