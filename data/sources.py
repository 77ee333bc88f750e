"""A ``Source`` over a Zarr store (this rank's tile only) and the trainer's data set-up.

Reading goes through ``jigsaw_earth.data``: ``StoreView`` maps names and orderings, ``TileReader``
reads only the chunks of this rank's tile, ``read_statistics``/``Normalizer`` give the channel
mean and std. The WB2-layout climatology store (``<store>-climatology.zarr`` as written by
``jigsaw-earth data synth``, or ``data.climatology``) gives the climatology baseline.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import xarray as xr
from jigsaw_earth.data.batch import N_GEOMETRY_CHANNELS, VariableSpec
from jigsaw_earth.data.climatology import open_climatology
from jigsaw_earth.data.preflight import default_climatology_path, store_preflight
from jigsaw_earth.data.reader import Normalisation, TileReader
from jigsaw_earth.data.report import OVER_READ_WARNING, planned_fraction
from jigsaw_earth.data.samples import TrainData
from jigsaw_earth.data.stats import Normalizer, read_statistics
from jigsaw_earth.data.store import StoreView
from jigsaw_earth.data.times import hour_dayofyear

from jigsaw_earth.config.schema import TrainConfig
from jigsaw_earth.distributed.halo import Halo
from jigsaw_earth.distributed.mesh import DomainMesh
from jigsaw_earth.distributed.tiles import Tile, TileGrid

__all__ = ["StoreSource", "TileClimatology", "build_data", "default_climatology_path"]

log = logging.getLogger(__name__)


class StoreSource:
    """This rank's tile of a store, physical units; static fields normalised by their stats."""

    def __init__(
        self,
        view: StoreView,
        spec: VariableSpec,
        grid: TileGrid,
        domain_index: int,
        normalizer: Normalizer,
        climatology: str | Path | None,
        read_threads: int | str = 1,
    ):
        self.view, self.spec = view, spec
        self.path = view.path
        self.reader = TileReader(view, spec, grid, grid.tile_of(domain_index), Halo(), threads=read_threads)
        self.tile = self.reader.tile
        self.times = np.asarray(view.times)
        self.lat = np.asarray(view.lat)
        self.channels = list(spec.channels)
        static, self.static_channels = self.reader.read_static()
        smean = normalizer.static_mean.reshape(-1, 1, 1)
        sstd = normalizer.static_std.reshape(-1, 1, 1)
        self._static = ((static - smean) / sstd).astype(np.float32)
        self._clim = TileClimatology.open(climatology, view, spec, self.tile)

    def inputs(self, t: int) -> np.ndarray:
        return self.reader.read_inputs(t)

    def targets(self, ts: np.ndarray) -> np.ndarray:
        return self.reader.read_targets(np.asarray(ts))

    def batch(
        self,
        inits: np.ndarray,
        targets: np.ndarray,
        mean: np.ndarray,
        std: np.ndarray,
        out: tuple[np.ndarray, np.ndarray] | None = None,
        check_nan: bool = True,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Normalised inputs ``(B, C, h, w)`` and targets ``(B, L, C, h, w)``, every field of every
        sample read in parallel and normalised as it lands (into ``out`` when it fits)."""
        norm = Normalisation(mean.reshape(-1), std.reshape(-1))
        return self.reader.read_batch(inits, targets, norm, out, check_nan)

    def static(self) -> np.ndarray:
        return self._static

    def climatology(self, times: np.ndarray) -> np.ndarray | None:
        """``(N, C, h, w)`` climatology at the valid times (WB2: hour and dayofyear), or None."""
        return None if self._clim is None else self._clim.at(times)


class TileClimatology:
    """One tile of a WB2-layout climatology store, the fields of ``spec``, physical units."""

    def __init__(self, ds: xr.Dataset, spec: VariableSpec, tile: Tile):
        self.ds = ds.isel(
            latitude=slice(tile.lat_start, tile.lat_stop), longitude=slice(tile.lon_start, tile.lon_stop)
        )
        self.spec = spec

    @classmethod
    def open(cls, path: str | Path | None, view: StoreView, spec: VariableSpec, tile: Tile,
             what: str = "data.climatology") -> TileClimatology | None:  # fmt: skip
        """The store at ``path`` (local or URL) on ``view``'s grid, or None (a warning) when there
        is none; ``open_climatology`` checks the WB2 layout and the grid."""
        if path is None or ("://" not in str(path) and not Path(path).exists()):
            log.warning("no climatology store at %s (%s): the climatology baseline is skipped", path, what)
            return None
        return cls(open_climatology(path, view), spec, tile)

    def at(self, times: np.ndarray) -> np.ndarray:
        """``(N, C, h, w)`` at the valid ``times``: WB2's hour and dayofyear of each."""
        hours, doy = hour_dayofyear(times)
        # one orthogonal read per variable of every (hour, dayofyear) block needed, then the points
        h_at = self.ds.indexes["hour"].get_indexer(np.asarray(hours, np.int64))
        d_at = self.ds.indexes["dayofyear"].get_indexer(np.asarray(doy, np.int64))
        if (h_at < 0).any() or (d_at < 0).any():
            raise KeyError(f"the climatology lacks hour/dayofyear of some of {len(times)} times")
        h_set, h_pos = np.unique(h_at, return_inverse=True)
        d_set, d_pos = np.unique(d_at, return_inverse=True)
        block = self.ds.isel(hour=h_set, dayofyear=d_set)
        grid, parts = ("latitude", "longitude"), []
        for v in self.spec.upper_air:
            field = block[v].sel(level=list(self.spec.levels)).transpose("hour", "dayofyear", "level", *grid)
            parts.append(field.values[h_pos, d_pos])
        for v in self.spec.surface:
            parts.append(block[v].transpose("hour", "dayofyear", *grid).values[h_pos, d_pos][:, None])
        return np.concatenate(parts, axis=1).astype(np.float32)


SMALL_GRID_POINTS = 128 * 256  # tile-chunked stores pay off from about this size (measured)


def _warn_over_read(source: StoreSource, grid: TileGrid, mesh: DomainMesh) -> None:
    """Warn (rank 0) when the store's chunks make this rank read much more than its tile."""
    if mesh.rank != 0 or grid.n_tiles == 1:
        return
    planned = planned_fraction(source.reader, 1)
    share = source.tile.shape[0] * source.tile.shape[1] / (grid.n_lat * grid.n_lon)
    if planned > OVER_READ_WARNING * share:
        # below ~128x256 points a whole-field chunk reads as fast as a tile's (docs/data.md: the
        # demo's 32x64 store, one chunk per field, read 8-sample batches faster than tile chunks)
        small = grid.n_lat * grid.n_lon < SMALL_GRID_POINTS
        (log.debug if small else log.warning)(
            "store %s: each rank reads %.2fx its tile (%.3f of every sample; its share is %.3f): the "
            "chunks do not follow the %dx%d tiles. Rewrite it: jigsaw-earth data prepare %s --out DST "
            "--for-mesh %dx%d",
            source.path,
            planned / share,
            planned,
            share,
            mesh.shape.lat,
            mesh.shape.lon,
            source.path,
            mesh.shape.lat,
            mesh.shape.lon,
        )


def build_data(cfg: TrainConfig, mesh: DomainMesh, *, training: bool = True) -> TrainData:
    """Open the store of ``cfg.data`` and return this rank's ``TrainData`` (``training``: say how
    batches are read ahead; inference reads no training batches)."""
    d = cfg.data
    problems = store_preflight(cfg)
    if problems:
        listed = problems[0] if len(problems) == 1 else "\n- " + "\n- ".join(problems)
        raise ValueError(f"the config does not fit store {d.store!r}: {listed}")
    spec = VariableSpec(tuple(d.upper_air), tuple(d.levels), tuple(d.surface), tuple(d.static))
    view = StoreView.open(d.store)
    grid = TileGrid(*view.grid_shape, mesh.shape.lat, mesh.shape.lon)
    normalizer = Normalizer.from_stats(read_statistics(d.store), spec, view, n_geometry=N_GEOMETRY_CHANNELS)
    clim = d.climatology or default_climatology_path(d.store)
    source = StoreSource(view, spec, grid, mesh.domain.index, normalizer, clim, d.read_threads)
    _warn_over_read(source, grid, mesh)
    data = TrainData(
        source,
        mesh,
        grid,
        mean=normalizer.mean,
        std=normalizer.std,
        global_batch=cfg.training.batch_size,
        seed=cfg.run.seed,
        step_hours=d.step_hours,
        train_period=d.train_period,
        val_period=d.val_period,
        rollout_steps=cfg.training.rollout_steps,
        diff_std=normalizer.diff_std,
        allow_gaps=d.allow_gaps,
        prefetch=d.prefetch,
    )
    if mesh.rank == 0 and training:
        log.info(
            "data: %d read thread(s) (data.read_threads=%s, %s), %d batch(es) read ahead; batches take "
            "%.1f MiB of host memory per rank",
            source.reader.threads,
            d.read_threads,
            "requests in flight to the bucket"
            if source.reader.source.remote
            else "at most the cores per rank",
            d.prefetch,
            (d.prefetch + 1) * data.batch_bytes() / 2**20,
        )
    return data
