"""Streaming WeatherBench 2 scoring: every chunk read once for all metrics, leads, models, regions.

The forecast is read in blocks of initialisation times (whole time chunks); the truth one field
per needed time (valid times, and init times for persistence) and the climatology one field per
(dayofyear, hour), each kept in memory while later blocks still need it, so no field is read twice.
Per block, in float64: MSE, bias and the ACC terms per (init, lead, [level]) as WB2 defines them
(the per-init statistics of ``statistics.STATS``),
for the forecast and the persistence and climatology baselines, and every region (latitude weights
of the global grid restricted to the region). A forecast with a member dimension (``number``, after
the lead) is an ensemble: its MSE, bias and ACC are the ensemble mean's, and it adds WB2's
ensemble terms (``ensemble.pointwise``: CRPS skill and spread, ensemble variance). NaNs propagate
as in WB2 (``skipna=False``): a NaN in a field makes that (init, lead) score NaN in every region
that contains it, and the time mean NaN; a warning names the variable, level, lead and count.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import xarray as xr
from tqdm.auto import tqdm

from ..data.times import hour_dayofyear
from .ensemble import POINTWISE, ensemble_mean, pointwise
from .grid import ForecastGrid, match_coordinate, read_rows_cols
from .regions import Region

__all__ = ["MEMBER", "RegionPlan", "block_size", "plan_regions", "score_variable"]

log = logging.getLogger(__name__)

READ_BYTES = 64 * 2**20  # forecast bytes read per block (whole time chunks)
WORK_BYTES = 16 * 2**20  # float64 bytes per computed slice of a block
MEMBER = "number"  # an ensemble forecast's member dimension (WB2's convention)


@dataclass(frozen=True)
class RegionPlan:
    """A region on the forecast grid: rows, columns (None: all) and normalised row weights."""

    name: str
    rows: np.ndarray
    cols: np.ndarray | None
    row_weights: np.ndarray  # w[rows] / (sum(w[rows]) * number of columns)


def plan_regions(regions: Sequence[Region], grid: ForecastGrid, truth: xr.Dataset) -> list[RegionPlan]:
    """Regions on the forecast grid; on a cropped forecast, 'global' becomes 'domain' (the forecast's
    area) and a region reaching outside the forecast is skipped with a warning."""
    t_lat, t_lon = truth["latitude"].values, truth["longitude"].values
    plans = []
    for region in regions:
        name = region.name
        rows, cols = np.nonzero(region.row_mask(grid.lat))[0], np.nonzero(region.col_mask(grid.lon))[0]
        if grid.cropped and name == "global":
            name = "domain"
        elif grid.cropped:
            need_rows = set(np.nonzero(region.row_mask(t_lat))[0]) - set(grid.truth_rows.tolist())
            need_cols = set(np.nonzero(region.col_mask(t_lon))[0]) - set(grid.truth_cols.tolist())
            if need_rows or need_cols:
                log.warning("region %s reaches outside the forecast's area: not scored", name)
                continue
        if rows.size == 0 or cols.size == 0:
            log.warning("region %s has no grid point on this %dx%d grid: not scored", name,
                        grid.lat.size, grid.lon.size)  # fmt: skip
            continue
        w = grid.weights[rows]
        all_cols = cols.size == grid.lon.size
        plans.append(RegionPlan(name, rows, None if all_cols else cols, w / (w.sum() * cols.size)))
    if not plans:
        raise ValueError("no region left to score on this grid; choose regions inside the forecast's area")
    return plans


def _spatial_means(q: np.ndarray, plans: Sequence[RegionPlan]) -> dict[str, np.ndarray]:
    """Weighted means over the last two axes (latitude, longitude) for every region."""
    sums: dict[bytes | None, np.ndarray] = {}
    out = {}
    for p in plans:
        key = None if p.cols is None else p.cols.tobytes()
        if key not in sums:
            sums[key] = q.sum(-1) if p.cols is None else q[..., p.cols].sum(-1)
        out[p.name] = sums[key][..., p.rows] @ p.row_weights
    return out


class _FieldCache:
    """Fields by key, each read once; ``keep`` drops the ones no later block needs."""

    def __init__(self, read: Callable[[list], dict], what: str):
        self.read, self.what, self.fields = read, what, {}
        self.nan: dict = {}

    def get(self, keys: np.ndarray) -> dict:
        missing = sorted(set(keys.ravel().tolist()) - self.fields.keys())
        if missing:
            for k, a in self.read(missing).items():
                n = int(np.isnan(a).sum())
                if n:
                    self.nan[k] = n
                self.fields[k] = a
        return self.fields

    def keep(self, predicate: Callable) -> None:
        self.fields = {k: v for k, v in self.fields.items() if predicate(k)}


def _time_indices(times: np.ndarray, have: np.ndarray, what: str) -> np.ndarray:
    idx = pd.Index(have).get_indexer(times.ravel()).reshape(times.shape)
    if (idx < 0).any():
        missing = np.unique(times[idx < 0])
        raise ValueError(
            f"{what} lacks {missing.size} of the {np.unique(times).size} times needed (first {missing[0]}); "
            f"it covers {have.min()} … {have.max()}: score a period inside it"
        )
    return idx


def _clim_indices(valid: np.ndarray, clim: xr.DataArray) -> np.ndarray:
    """(dayofyear index, hour index) of each valid time, as one integer key per valid time."""
    hours, days = hour_dayofyear(valid.ravel())
    keys = []
    for name, want in (("dayofyear", days), ("hour", hours)):
        if name not in clim.dims:
            raise ValueError(f"climatology has no {name!r} dimension (dims {sorted(map(str, clim.dims))})")
        idx = pd.Index(clim[name].values).get_indexer(np.asarray(want))
        if (idx < 0).any():
            lacking = np.unique(np.asarray(want)[idx < 0]).tolist()
            raise ValueError(
                f"climatology has no {name} {lacking[:5]} needed by the valid times; it has "
                f"{clim[name].values.tolist()[:8]}…; use a climatology with those values"
            )
        keys.append(idx)
    return (keys[0] * clim.sizes["hour"] + keys[1]).reshape(valid.shape)


def _reader(da: xr.DataArray, dim: str, reorder: Callable) -> Callable[[list], dict]:
    def read(keys: list) -> dict:
        block = reorder(np.asarray(da.isel({dim: keys}).values, dtype=np.float64))
        return dict(zip(keys, block))

    return read


def _clim_reader(da: xr.DataArray, reorder: Callable) -> Callable[[list], dict]:
    n_hour = da.sizes["hour"]

    def read(keys: list) -> dict:
        out = {}
        for h in sorted({k % n_hour for k in keys}):  # one read per hour
            doys = [k // n_hour for k in keys if k % n_hour == h]
            block = reorder(np.asarray(da.isel(hour=h, dayofyear=doys).values, dtype=np.float64))
            out.update({d * n_hour + h: a for d, a in zip(doys, block)})
        return out

    return read


def block_size(fc: xr.DataArray) -> int:
    """Inits per block: whole time chunks, about ``READ_BYTES`` of forecast."""
    chunks = fc.encoding.get("chunks") or (fc.chunks and [c[0] for c in fc.chunks])
    t_chunk = int(chunks[0]) if chunks else 1
    per_init = fc[0].size * fc.dtype.itemsize
    return max(1, READ_BYTES // (per_init * t_chunk)) * t_chunk


def score_variable(
    fc: xr.DataArray,
    truth: xr.DataArray,
    clim: xr.DataArray | None,
    grid: ForecastGrid,
    plans: Sequence[RegionPlan],
    *,
    baselines: bool,
    model: str,
    bar: tqdm | None = None,
) -> dict[tuple[str, str, str], np.ndarray]:
    """Per-init statistics ``{(model, quantity, region): (time, lead, [level])}`` of one variable:
    the region's weighted means of the error² (``se``), the error (``e``), and with a climatology of
    the anomalies' product and squares (``fo``, ``ff``, ``oo``: per-init ACC = fo/√(ff·oo)), and for an
    ensemble ``model`` also the ``ensemble.POINTWISE`` terms (``statistics.STATS``).
    ``fc`` is (time, lead, [number], [level], lat, lon) with time
    ascending; ``truth`` (time, [level], lat, lon) and ``clim`` (hour, dayofyear, [level], lat, lon)
    are on the forecast's levels, their grids matched to ``grid``."""
    init, lead = fc["time"].values, fc["prediction_timedelta"].values
    valid_idx = _time_indices(init[:, None] + lead[None, :], truth["time"].values, "truth")
    init_idx = _time_indices(init, truth["time"].values, "truth") if baselines else None
    t_sub, t_order = read_rows_cols(truth, grid.truth_rows, grid.truth_cols)
    truth_cache = _FieldCache(_reader(t_sub, "time", t_order), "truth")
    clim_cache = clim_keys = None
    if clim is not None:
        c_rows = match_coordinate(grid.lat, clim["latitude"].values, "latitude", "climatology")
        c_cols = match_coordinate(grid.lon, clim["longitude"].values, "longitude", "climatology")
        c_sub, c_order = read_rows_cols(clim, c_rows, c_cols)
        clim_cache = _FieldCache(_clim_reader(c_sub, c_order), "climatology")
        clim_keys = _clim_indices(init[:, None] + lead[None, :], clim)
    models = [model] + (["persistence"] + (["climatology"] if clim is not None else []) if baselines else [])
    ens = MEMBER in fc.dims
    if ens and fc.dims.index(MEMBER) != 2:
        raise ValueError(f"the member dimension must follow the lead: {fc.dims}")
    extra = tuple(n for d, n in zip(fc.dims[2:-2], fc.shape[2:-2]) if d != MEMBER)
    out = {
        (m, q, p.name): np.full((init.size, lead.size, *extra), np.nan)
        for m in models
        for q in ("se", "e", *(("fo", "ff", "oo") if clim is not None and m != "climatology" else ()),
                  *(POINTWISE if ens and m == model else ()))
        for p in plans
    }  # fmt: skip
    nan_values = np.zeros((lead.size, *extra), np.int64)
    nan_inits = np.zeros((lead.size, *extra), np.int64)
    step = block_size(fc)
    field_bytes = int(np.prod(fc.shape[2:])) * 8
    for t0 in range(0, init.size, step):
        t1 = min(t0 + step, init.size)
        raw = np.asarray(fc.isel(time=slice(t0, t1)).values)
        isnan = np.isnan(raw)
        counts, anywhere = isnan.sum(axis=(-2, -1)), isnan.any(axis=(-2, -1))
        if ens:  # counted over members
            counts, anywhere = counts.sum(axis=2), anywhere.any(axis=2)
        nan_values += counts.sum(axis=0)
        nan_inits += anywhere.sum(axis=0)
        need = valid_idx[t0:t1].ravel()
        if init_idx is not None:
            need = np.concatenate([need, init_idx[t0:t1]])
        truth_fields = truth_cache.get(need)
        clim_fields = clim_cache.get(clim_keys[t0:t1]) if clim_cache else None
        n_lead = max(1, WORK_BYTES // (field_bytes * (t1 - t0)))
        for l0 in range(0, lead.size, n_lead):
            l1 = min(l0 + n_lead, lead.size)
            sl = (slice(t0, t1), slice(l0, l1))
            f = raw[:, l0:l1].astype(np.float64)
            members = None
            if ens:
                members = torch.from_numpy(f)
                f = ensemble_mean(members, 2).numpy()
            o = np.stack([truth_fields[k] for k in valid_idx[sl].ravel()]).reshape(f.shape)
            candidates = {model: f}
            if init_idx is not None:
                candidates["persistence"] = np.stack([truth_fields[k] for k in init_idx[t0:t1]])[:, None]
            c = oa = oa2 = None
            if clim_fields is not None:
                c = np.stack([clim_fields[k] for k in clim_keys[sl].ravel()]).reshape(f.shape)
                oa = o - c
                oa2 = _spatial_means(oa * oa, plans)
                if init_idx is not None:
                    candidates["climatology"] = c
            for m, pred in candidates.items():
                err = pred - o
                for name, v in _spatial_means(err * err, plans).items():
                    out[(m, "se", name)][sl] = v
                for name, v in _spatial_means(err, plans).items():
                    out[(m, "e", name)][sl] = v
                if c is not None and m != "climatology":
                    fa = pred - c
                    for q, x in (("fo", fa * oa), ("ff", fa * fa)):
                        for name, v in _spatial_means(x, plans).items():
                            out[(m, q, name)][sl] = v
                    for name, v in oa2.items():
                        out[(m, "oo", name)][sl] = v
            if members is not None:
                for q, x in pointwise(members, torch.from_numpy(o), 2).items():
                    for name, v in _spatial_means(x.numpy(), plans).items():
                        out[(model, q, name)][sl] = v
        oldest = int(need.min())  # later blocks need no earlier time (inits ascending)
        truth_cache.keep(lambda k: k >= oldest)  # noqa: B023
        if clim_cache is not None:
            keys_now = set(clim_keys[t0:t1].ravel().tolist())
            clim_cache.keep(lambda k: k in keys_now)  # noqa: B023
        if bar is not None:
            bar.update(1)
    _warn_nan(str(fc.name), fc, nan_values, nan_inits, truth_cache, clim_cache)
    return out


def _warn_nan(name, fc, nan_values, nan_inits, truth_cache, clim_cache) -> None:
    levels = fc["level"].values if "level" in fc.dims else [None]
    where = []
    for li, lead in enumerate(fc["prediction_timedelta"].values):
        hours = lead / np.timedelta64(1, "h")
        for ki, lev in enumerate(levels):
            n = int(nan_values[li] if lev is None else nan_values[li, ki])
            if n:
                k = int(nan_inits[li] if lev is None else nan_inits[li, ki])
                at = f"{name}" + ("" if lev is None else f"@{int(lev)}")
                where.append(f"{at} at {hours:g} h: {n} values in {k} of {fc.sizes['time']} inits")
    if where:
        more = f"; and {len(where) - 6} more" if len(where) > 6 else ""
        log.warning(
            "forecast has NaN: %s%s. As in WB2 (skipna=False) every score that includes them is NaN",
            "; ".join(where[:6]), more,
        )  # fmt: skip
    for cache in (truth_cache, clim_cache):
        if cache is not None and cache.nan:
            log.warning(
                "%s %s has NaN in %d fields read (%d values): the scores that include them are NaN",
                cache.what, name, len(cache.nan), sum(cache.nan.values()),
            )  # fmt: skip
