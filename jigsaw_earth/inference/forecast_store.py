"""A WeatherBench-2-layout forecast store that all ranks write together, each its own tile.

Layout (WB2 forecast convention): upper-air variables ``(time, prediction_timedelta, level,
latitude, longitude)``, surface variables ``(time, prediction_timedelta, latitude, longitude)``;
``time`` is the initialisation time; latitude as the data (descending, WB2), levels ascending.

Chunks are aligned with every tile boundary of the mesh (the greatest common divisor of the tile
offsets along each axis), so no two ranks ever write the same chunk and no locking is needed. An
even split gives one chunk per tile; an uneven one (721 rows over 4 ranks) gives finer chunks —
rechunk afterwards if a reader needs larger ones. The store is written under ``PATH.tmp-<run>``
and renamed to ``PATH`` by rank 0 only after every rank has finished (``close``), so an
interrupted run leaves nothing that looks complete.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import dask.array as da
import numpy as np
import torch.distributed as dist
import xarray as xr
import zarr

from ..distributed.tiles import Tile, TileGrid
from ..metrics.units import CF_ATTRS, UNITS

__all__ = ["ForecastLayout", "ForecastWriter", "aligned_chunk"]

log = logging.getLogger(__name__)


COORD_ATTRS = {
    "time": {"standard_name": "forecast_reference_time", "long_name": "initialisation time"},
    "prediction_timedelta": {"standard_name": "forecast_period", "long_name": "lead time"},
    "latitude": {"standard_name": "latitude", "units": "degrees_north"},
    "longitude": {"standard_name": "longitude", "units": "degrees_east"},
    "level": {"standard_name": "air_pressure", "long_name": "pressure level", "units": "hPa"},
}


def aligned_chunk(offsets: tuple[int, ...]) -> int:
    """Largest chunk size whose chunk boundaries include every interior tile boundary."""
    interior = offsets[1:-1]
    if not interior:
        return offsets[-1]
    return math.gcd(*interior)


@dataclass(frozen=True)
class ForecastLayout:
    """What the forecast store holds; coordinates are global."""

    init_times: np.ndarray  # datetime64
    leads: np.ndarray  # timedelta64
    upper_air: tuple[str, ...]
    levels: tuple[int, ...]
    surface: tuple[str, ...]
    latitude: np.ndarray
    longitude: np.ndarray

    @property
    def channels(self) -> list[str]:
        """Channel order of the arrays passed to ``ForecastWriter.write`` (as the data batch)."""
        levs = sorted(self.levels)
        return [f"{v}@{lev}" for v in self.upper_air for lev in levs] + list(self.surface)


def _run_token() -> str:
    return (
        os.environ.get("TORCHELASTIC_RUN_ID")
        or os.environ.get("SLURM_JOB_ID")
        or os.environ.get("MASTER_PORT", "local")
    )


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


class ForecastWriter:
    """Collective: every rank constructs it, writes its tiles, and calls ``close``."""

    def __init__(
        self,
        path: str | Path,
        layout: ForecastLayout,
        grid: TileGrid,
        rank: int = 0,
        *,
        overwrite: bool = False,
    ):
        self.path = Path(path)
        self.layout, self.grid, self.rank = layout, grid, rank
        if self.path.exists() and not overwrite:
            raise ValueError(
                f"forecast store {self.path} already exists; pass overwrite or choose another path"
            )
        if (len(layout.latitude), len(layout.longitude)) != (grid.n_lat, grid.n_lon):
            raise ValueError(
                f"layout grid {len(layout.latitude)}x{len(layout.longitude)} does not match the model grid "
                f"{grid.n_lat}x{grid.n_lon}"
            )
        self.tmp = self.path.with_name(f"{self.path.name}.tmp-{_run_token()}")
        if rank == 0:
            if self.tmp.exists():
                shutil.rmtree(self.tmp)
            self._template().to_zarr(self.tmp, mode="w", compute=False, zarr_format=3, consolidated=False)
        _barrier()
        self._arrays = {name: zarr.open_array(self.tmp / name, mode="r+") for name in self._variables()}

    def _variables(self) -> list[str]:
        return [*self.layout.upper_air, *self.layout.surface]

    def _template(self) -> xr.Dataset:
        lay, grid = self.layout, self.grid
        c_lat, c_lon = aligned_chunk(grid.lat_offsets), aligned_chunk(grid.lon_offsets)
        n_t, n_l, n_lev = len(lay.init_times), len(lay.leads), len(lay.levels)
        data_vars = {}
        for name in lay.upper_air:
            shape = (n_t, n_l, n_lev, grid.n_lat, grid.n_lon)
            arr = da.full(shape, np.nan, dtype=np.float32, chunks=(1, 1, n_lev, c_lat, c_lon))
            data_vars[name] = (("time", "prediction_timedelta", "level", "latitude", "longitude"), arr)
        for name in lay.surface:
            arr = da.full(
                (n_t, n_l, grid.n_lat, grid.n_lon), np.nan, dtype=np.float32, chunks=(1, 1, c_lat, c_lon)
            )
            data_vars[name] = (("time", "prediction_timedelta", "latitude", "longitude"), arr)
        for name, (dims, arr) in data_vars.items():  # CF attributes: units as WB2 writes them
            data_vars[name] = xr.Variable(
                dims, arr, attrs={**CF_ATTRS.get(name, {}), "units": UNITS.get(name, "")}
            )
        coords = {
            "time": ("time", np.asarray(lay.init_times, dtype="datetime64[ns]"), COORD_ATTRS["time"]),
            "prediction_timedelta": (
                "prediction_timedelta",
                np.asarray(lay.leads, dtype="timedelta64[ns]"),
                COORD_ATTRS["prediction_timedelta"],
            ),
            "latitude": ("latitude", np.asarray(lay.latitude, dtype=np.float64), COORD_ATTRS["latitude"]),
            "longitude": ("longitude", np.asarray(lay.longitude, dtype=np.float64), COORD_ATTRS["longitude"]),
        }
        if lay.upper_air:
            coords["level"] = ("level", np.asarray(sorted(lay.levels), dtype=np.int64), COORD_ATTRS["level"])
        attrs = {"jigsaw_earth": {"complete": False}, "Conventions": "CF-1.8"}
        return xr.Dataset(data_vars, coords=coords, attrs=attrs)

    def write(self, init_index: int, lead_index: int, fields: np.ndarray, tile: Tile) -> None:
        """Write this rank's tile: ``fields`` is ``(channels, h, w)`` in physical units."""
        channels = self.layout.channels
        if fields.shape != (len(channels), *tile.shape):
            raise ValueError(
                f"forecast tile has shape {fields.shape}, expected {(len(channels), *tile.shape)} "
                f"(channels {channels[:3]}...)"
            )
        rows, cols = tile.slices
        n_lev, k = len(self.layout.levels), 0
        for name in self.layout.upper_air:
            self._arrays[name][init_index, lead_index, :, rows, cols] = fields[k : k + n_lev]
            k += n_lev
        for name in self.layout.surface:
            self._arrays[name][init_index, lead_index, rows, cols] = fields[k]
            k += 1

    def close(self) -> Path:
        """Collective: wait for every rank, then publish the store (rank 0 renames)."""
        _barrier()
        if self.rank == 0:
            group = zarr.open_group(self.tmp, mode="r+")
            group.attrs["jigsaw_earth"] = {"complete": True}
            with (
                warnings.catch_warnings()
            ):  # consolidated metadata is not in the v3 spec (yet): xarray reads it
                warnings.filterwarnings("ignore", message="Consolidated metadata")
                zarr.consolidate_metadata(self.tmp)
            if self.path.exists():
                shutil.rmtree(self.path)
            self.tmp.rename(self.path)
            log.info("wrote forecast store %s", self.path)
        _barrier()
        return self.path
