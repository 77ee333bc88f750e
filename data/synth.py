"""A synthetic ERA5-like store in the WB2 conventions: the bundled default for demo and tests.

Fields are built from one shared "weather" state: Rossby-like waves (zonal wavenumbers 4–7 in
each hemisphere's mid-latitudes) travelling eastward at a latitude-dependent speed with slowly
pulsing amplitudes, plus red noise (AR(1) spectral modes, 6-hourly correlation 0.85). Every
variable adds latitude-dependent means, a seasonal cycle and (2m temperature) a diurnal cycle
tied to local solar time and stronger over land; winds are geostrophic from the wave field
plus a jet. Magnitudes follow ERA5 (z500 ≈ 5.0–5.9e4 m²/s², t850 ≈ 255–295 K, msl ≈ 1e5 Pa), so
RMSE figures mean something. A model that learns the advection beats persistence and
climatology 24 h ahead; the noise keeps it from being perfect. ``stochastic`` (``data synth
--stochastic SIGMA``) adds a second, less persistent red-noise stream of amplitude ``SIGMA × 200``
m²/s² to the waves (``dynamics.py``): weather an ensemble can learn the spread of (off by default,
and then the store is the same as without the option).

The climatology store (WB2 layout: hour, dayofyear, [level], latitude, longitude) holds the
deterministic mean part, i.e. the fields without waves and noise.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from jigsaw_earth.data.batch import DEFAULT_LEVELS, DEFAULT_SURFACE, DEFAULT_UPPER_AIR
from jigsaw_earth.data.dynamics import Dynamics
from jigsaw_earth.data.stats import RunningStats, write_statistics
from jigsaw_earth.data.writer import ChunkLayout, atomic_store, create_variable, mark_complete, write_coords

__all__ = ["SynthConfig", "climatology_path", "synth_store"]

log = logging.getLogger(__name__)
WB2_LEVELS = (50, 100, 150, 200, 250, 300, 400, 500, 600, 700, 850, 925, 1000)


@dataclass(frozen=True)
class SynthConfig:
    """What ``jigsaw-earth data synth`` writes. Times run from ``start`` to ``end`` inclusive."""

    n_lat: int = 32
    n_lon: int = 64
    start: str = "2019-01-01T00"
    end: str = "2020-12-31T18"
    step_hours: int = 6
    levels: tuple[int, ...] = DEFAULT_LEVELS
    upper_air: tuple[str, ...] = DEFAULT_UPPER_AIR
    surface: tuple[str, ...] = DEFAULT_SURFACE
    seed: int = 0
    stochastic: float = 0.0  # amplitude of the unpredictable red-noise stream (dynamics.py); 0 = off
    layout: ChunkLayout = field(default_factory=lambda: ChunkLayout(time_shard=124, compression="none"))

    def times(self) -> np.ndarray:
        start, end = np.datetime64(self.start, "h"), np.datetime64(self.end, "h")
        if end < start:
            raise ValueError(f"--end {self.end} is before --start {self.start}; swap them")
        out = np.arange(start, end + np.timedelta64(1, "h"), np.timedelta64(self.step_hours, "h"))
        if len(out) < 2:
            raise ValueError(f"{self.start}..{self.end} holds {len(out)} time(s); give a longer range")
        return out.astype("datetime64[ns]")

    def check(self) -> None:
        bad = [lev for lev in self.levels if lev not in WB2_LEVELS]
        if bad:
            raise ValueError(f"levels {bad} are not WB2 levels; choose from {list(WB2_LEVELS)}")
        if self.n_lon % 2 or self.n_lat < 2:
            raise ValueError(f"grid {self.n_lat}x{self.n_lon}: need >= 2 rows and an even column count")


def climatology_path(out: str | Path) -> Path:
    """Where ``synth`` writes the climatology of store ``out``: ``<out stem>-climatology.zarr``."""
    out = Path(out)
    stem = out.name[: -len(".zarr")] if out.name.endswith(".zarr") else out.name
    return out.with_name(f"{stem}-climatology.zarr")


def _write_fields(
    group,
    dyn: Dynamics,
    cfg: SynthConfig,
    times: np.ndarray,
    time_dims: list[str],
    layout: ChunkLayout,
    block: int,
    stats: RunningStats,
) -> None:
    levels = np.array(sorted(cfg.levels))
    arrays = {}
    for v in cfg.upper_air:
        arrays[v] = create_variable(
            group,
            v,
            (len(times), len(levels), cfg.n_lat, cfg.n_lon),
            [*time_dims, "level", "latitude", "longitude"],
            layout,
        )
    for v in cfg.surface:
        arrays[v] = create_variable(
            group, v, (len(times), cfg.n_lat, cfg.n_lon), [*time_dims, "latitude", "longitude"], layout
        )

    def write(t0: int, fields: dict[str, np.ndarray]) -> None:
        for v, arr in arrays.items():
            arr[t0 : t0 + block] = fields[v]

    # overlap writing block k with generating block k + 1
    with ThreadPoolExecutor(1) as pool:
        pending = None
        for t0 in range(0, len(times), block):
            fields = dyn.fields(times[t0 : t0 + block], levels, [*cfg.upper_air, *cfg.surface])
            for v in arrays:
                stats.update(v, fields[v])
            if pending is not None:
                pending.result()
            pending = pool.submit(write, t0, fields)
        if pending is not None:
            pending.result()


def synth_store(
    out: str | Path, cfg: SynthConfig | None = None, *, overwrite: bool = False, climatology: bool = True
) -> dict:
    """Write the synthetic store (with statistics) and, by default, its climatology store."""
    cfg = cfg or SynthConfig()
    cfg.check()
    times = cfg.times()
    dyn = Dynamics(cfg.n_lat, cfg.n_lon, seed=cfg.seed, stochastic=cfg.stochastic)
    levels = np.array(sorted(cfg.levels))
    block = max(cfg.layout.time_shard, 1) * max(1, 124 // max(cfg.layout.time_shard, 1))
    import zarr

    with atomic_store(out, overwrite) as tmp:
        group = zarr.open_group(tmp, mode="w", zarr_format=3)
        write_coords(group, times, levels if cfg.upper_air else None, dyn.lat_deg, dyn.lon_deg)
        dims = ["latitude", "longitude"]
        group.create_array(
            "land_sea_mask", data=dyn.lsm.astype(np.float32), dimension_names=dims, attributes={"units": "1"}
        )
        group.create_array(
            "geopotential_at_surface",
            data=dyn.zs.astype(np.float32),
            dimension_names=dims,
            attributes={"units": "m**2 s**-2"},
        )
        running = RunningStats()
        _write_fields(group, dyn, cfg, times, ["time"], cfg.layout, block, running)
        attrs = {
            "period": [str(times[0])[:19], str(times[-1])[:19]],
            "n_lat": cfg.n_lat,
            "n_lon": cfg.n_lon,
            "lat_range": [float(dyn.lat_deg[0]), float(dyn.lat_deg[-1])],
            "lon_range": [float(dyn.lon_deg[0]), float(dyn.lon_deg[-1])],
        }
        static = {"land_sea_mask": dyn.lsm, "geopotential_at_surface": dyn.zs}
        write_statistics(tmp, running.result(levels if cfg.upper_air else None, static, attrs))
        extra = {"stochastic": cfg.stochastic} if cfg.stochastic else {}  # default: the attributes of old
        grid = [cfg.n_lat, cfg.n_lon]
        mark_complete(tmp, source="synth", grid=grid, seed=cfg.seed, layout=cfg.layout.describe(), **extra)
    info = {"store": str(out), "times": len(times), "grid": [cfg.n_lat, cfg.n_lon], "levels": levels.tolist()}
    if climatology:
        info["climatology"] = str(write_climatology(climatology_path(out), dyn, cfg, overwrite))
    return info


def write_climatology(path: Path, dyn: Dynamics, cfg: SynthConfig, overwrite: bool = False) -> Path:
    """WB2-layout climatology: (hour = 0, 6, 12, 18; dayofyear = 1…366; [level]; lat; lon)."""
    import zarr

    hours = np.arange(0, 24, cfg.step_hours)
    doys = np.arange(1, 367)
    levels = np.array(sorted(cfg.levels))
    variables = [*cfg.upper_air, *cfg.surface]
    with atomic_store(path, overwrite, kind="climatology") as tmp:
        g = zarr.open_group(tmp, mode="w", zarr_format=3)
        g.create_array("hour", data=hours.astype(np.int64), dimension_names=["hour"])
        g.create_array("dayofyear", data=doys.astype(np.int64), dimension_names=["dayofyear"])
        if cfg.upper_air:
            g.create_array("level", data=levels.astype(np.int64), dimension_names=["level"])
        g.create_array("latitude", data=dyn.lat_deg, dimension_names=["latitude"])
        g.create_array("longitude", data=dyn.lon_deg, dimension_names=["longitude"])
        arrays = {}
        for v in variables:
            lev = [len(levels)] if v in cfg.upper_air else []
            dims = ["hour", "dayofyear", *(["level"] if lev else []), "latitude", "longitude"]
            arrays[v] = g.create_array(
                v,
                shape=(len(hours), len(doys), *lev, cfg.n_lat, cfg.n_lon),
                dtype="float32",
                chunks=(1, 61, *lev, cfg.n_lat, cfg.n_lon),
                dimension_names=dims,
                fill_value=np.nan,
            )
        base = np.datetime64("2020-01-01T00", "h")  # a leap year: dayofyear 1…366
        for i, h in enumerate(hours):
            times = base + ((doys - 1) * 24 + int(h)).astype("timedelta64[h]")
            fields = dyn.fields(times.astype("datetime64[ns]"), levels, variables, mean_only=True)
            for v in variables:
                arrays[v][i] = fields[v]
        mark_complete(tmp, "climatology", source="synth-climatology", grid=[cfg.n_lat, cfg.n_lon])
    return path
