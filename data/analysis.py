"""Initial states from any analysis: ``predict --init SOURCE [--time T …]``.

The source is a GRIB file or folder as centres publish them (IFS open data, GFS, ERA5 from the CDS:
``grib.py``), netCDF files or a Zarr store (``prepare.open_source``: the same names, units and
merging as ``data prepare``). ``open_analysis`` checks it against the trained model before any
model is built: the grid must be the training store's (latitudes in any order, longitudes 0…360 or
−180…180; compared to 1e-5°), every configured variable on every configured level at every chosen
time (the error names the variable, level or time lacking, with the GRIB message keys found), and
``--time`` among the source's times. Nothing is written: no ``.idx`` file beside GRIB data.

``Analysis.fields`` reads one rank's tile of one initial state, in physical units, in the model's
channel order; the caller normalises it with the model's own statistics (``TrainData``), and static
fields come from the training store, as in training.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from jigsaw_earth.data.batch import Batch, VariableSpec
from jigsaw_earth.data.prepare import netcdf_files, open_source
from jigsaw_earth.data.samples import TrainData
from jigsaw_earth.data.store import StoreView

from jigsaw_earth.config.schema import DataConfig
from jigsaw_earth.distributed.tiles import Tile

__all__ = ["GRID_TOLERANCE_DEG", "Analysis", "fingerprint", "open_analysis"]

log = logging.getLogger(__name__)

GRID_TOLERANCE_DEG = 1e-5  # GRIB 2 stores degrees in millionths


def _grid_text(lat: np.ndarray, lon: np.ndarray) -> str:
    return (
        f"{len(lat)}x{len(lon)} (latitude {lat.max():g}…{lat.min():g}, longitude {lon.min():g}…{lon.max():g})"
    )


def _match(source: np.ndarray, model: np.ndarray, what: str, where: str, grids: str) -> np.ndarray:
    """Storage index in ``source`` of each of the model's coordinate values, or a clear error."""
    order = np.argsort(source, kind="stable")
    pos = np.clip(np.searchsorted(source[order], model), 1, len(source) - 1)
    near = np.where(
        np.abs(source[order][pos - 1] - model) <= np.abs(source[order][pos] - model), pos - 1, pos
    )
    off = np.abs(source[order][near] - model)
    if len(source) != len(model) or (off > GRID_TOLERANCE_DEG).any():
        bad = int(np.argmax(off)) if len(source) == len(model) else 0
        raise ValueError(
            f"--init {where} is on another grid than the model: {grids}; its {what} differ (the model's "
            f"{model[bad]:g} is {off[bad]:g}° from the nearest). Regrid the analysis to the training store's "
            f"grid first (e.g. `cdo remapbil`), or predict with a model trained on its grid"
        )
    return order[near]


@dataclass
class Analysis:
    """The initial states of ``--init``: ``times`` (datetime64[ns]) and where each field lies."""

    path: str
    view: StoreView
    times: np.ndarray
    spec: VariableSpec
    rows: np.ndarray  # storage row of each model row (latitude descending)
    cols: np.ndarray  # storage column of each model column (longitude ascending from the model's first)
    time_index: np.ndarray  # storage time index of each of ``times``

    @property
    def channels(self) -> list[str]:
        return self.spec.channels

    def batch(self, data: TrainData, positions: np.ndarray) -> Batch:
        """The initial states at ``positions`` (of ``times``) as a forecast's batch of ``data``'s tile,
        normalised with the model's statistics, static fields from the training store."""
        fields = np.stack([self.fields(int(k), data.tile) for k in positions])
        return data.batch_of(fields, self.times[np.asarray(positions)])

    def fields(self, k: int, tile: Tile) -> np.ndarray:
        """``(C, h, w)`` float32, physical units: initial state ``k`` (of ``times``) on ``tile``."""
        view, names = self.view, self.view.coord_names
        rows, cols = self.rows[tile.lat_start : tile.lat_stop], self.cols[tile.lon_start : tile.lon_stop]
        at = {names["time"]: int(self.time_index[k]), names["latitude"]: rows, names["longitude"]: cols}
        parts = []
        for var in self.spec.upper_air:
            name = view.resolve(var, upper_air=True)
            levels = view.level_indices(var, self.spec.levels)
            da = view.dataset[name].isel({**at, names["level"]: levels})
            parts.append(da.transpose(names["level"], names["latitude"], names["longitude"]).values)
        for var in self.spec.surface:
            da = view.dataset[view.resolve(var, upper_air=False)].isel(at)
            parts.append(da.transpose(names["latitude"], names["longitude"]).values[None])
        out = np.concatenate(parts).astype(np.float32)
        if np.isnan(out.max()):
            bad = [c for c, m in zip(self.channels, out) if np.isnan(m).any()]
            raise ValueError(
                f"--init {self.path} holds NaN values in {bad} at {self.times[k]} (this rank's tile {tile}); "
                f"fill them in the analysis or choose another --time"
            )
        return out


def _times(view: StoreView, wanted: Sequence[str] | None) -> tuple[np.ndarray, np.ndarray]:
    have = np.asarray(view.times, "datetime64[ns]")
    if not wanted:
        return have, np.arange(len(have))
    idx = []
    for text in wanted:
        try:
            t = np.datetime64(text, "ns")
        except ValueError:
            raise ValueError(f"--time {text!r} is not a date; write YYYY-MM-DDTHH") from None
        hit = np.nonzero(have == t)[0]
        if not len(hit):
            listed = ", ".join(str(x)[:16] for x in have[:8]) + (" …" if len(have) > 8 else "")
            raise ValueError(
                f"--time {text} is not in --init {view.path} (it holds {len(have)} times: {listed})"
            )
        idx.append(int(hit[0]))
    idx = sorted(set(idx))
    return have[idx], np.asarray(idx)


def open_analysis(
    source: str | Path,
    data: DataConfig,
    times: Sequence[str] | None = None,
    model_grid: StoreView | None = None,
) -> Analysis:
    """Open ``--init`` and check it against the model's grid, variables and levels (``data``: the
    run's data config; ``model_grid``: the training store's view, opened from ``data.store`` if None)."""
    where = str(source)
    if "://" not in where and not Path(where).exists():
        raise FileNotFoundError(
            f"--init {where} does not exist; give a GRIB or netCDF file, a folder of them, or a Zarr store"
        )
    view = open_source(where)
    model = model_grid if model_grid is not None else StoreView.open(data.store)
    raw_lat = np.asarray(view.dataset[view.coord_names["latitude"]].values, np.float64)
    raw_lon = np.asarray(view.dataset[view.coord_names["longitude"]].values, np.float64) % 360.0
    grids = f"{_grid_text(raw_lat, raw_lon)} against the model's {_grid_text(model.lat, model.lon)}"
    rows = _match(raw_lat, np.asarray(model.lat, np.float64), "latitudes", where, grids)
    cols = _match(raw_lon, np.asarray(model.lon, np.float64) % 360.0, "longitudes", where, grids)
    chosen, index = _times(view, times)
    spec = VariableSpec(tuple(data.upper_air), tuple(data.levels), tuple(data.surface), ())
    for var in spec.upper_air:
        view.resolve(var, upper_air=True)  # a missing variable: named, with what the source has
        view.level_indices(var, spec.levels)
    for var in spec.surface:
        view.resolve(var, upper_air=False)
    if view.messages is not None:  # GRIB: each field at each chosen time, or the message keys found
        fix = (
            f"The model needs {list(spec.upper_air)} on levels {list(spec.levels)} and {list(spec.surface)} "
            f"at every initial time: add the messages, or choose other --time"
        )
        for var in spec.upper_air:
            view.messages.require(var, spec.levels, chosen, fix)
        for var in spec.surface:
            view.messages.require(var, None, chosen, fix)
    log.info("--init %s: %d initial state(s) %s … %s on the model's %dx%d grid", where, len(chosen),
             str(chosen[0])[:16], str(chosen[-1])[:16], len(model.lat), len(model.lon))  # fmt: skip
    return Analysis(where, view, chosen, spec, rows, cols, index)


def fingerprint(source: str | Path) -> str | None:
    """SHA-256 of what ``--init`` reads, so a resume knows the analysis it started from: each GRIB or
    netCDF file's bytes (a folder's files with their names); for a Zarr store its metadata files' bytes
    and every chunk file's name, size and modification time (reading a whole store would take as long
    as the forecast). None for a URL."""
    text = str(source)
    if "://" in text:
        return None
    digest = hashlib.sha256()
    files = netcdf_files(text)
    root = Path(text) if Path(text).is_dir() else None
    if not files and root is not None:  # a Zarr store
        meta = {"zarr.json", ".zgroup", ".zarray", ".zattrs", ".zmetadata"}
        files = sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            stat = path.stat()
            digest.update(f"{path.relative_to(root)}\0{stat.st_size}\0".encode())
            if path.name in meta:
                digest.update(path.read_bytes())
            else:
                digest.update(str(stat.st_mtime_ns).encode())
        return digest.hexdigest()
    for path in files:
        digest.update(f"{path.relative_to(root) if root else path.name}\0".encode())
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                digest.update(block)
    return digest.hexdigest()
