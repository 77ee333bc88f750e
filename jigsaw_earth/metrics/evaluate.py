"""Score a forecast store against truth (and a climatology) the WeatherBench 2 way.

``normalise`` maps the names other ERA5 sources use (``lat``, ``t2m``, ``lead_time`` …) to WB2's;
``evaluate`` aligns forecast, truth and climatology by coordinate values (within 1e-3°) and returns
one long table row per (region, variable, level, lead, metric), for the forecast and for the
persistence and climatology baselines. A forecast with a member dimension (``number``, or an alias
such as ``realization``) is an ensemble: its RMSE, bias and ACC are the ensemble mean's, and it
gains WB2's ensemble metrics (``ensemble.ENSEMBLE_METRICS``: CRPS with its skill and spread terms,
ensemble standard deviation, spread/skill ratio).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr
from tqdm.auto import tqdm

from ..data.store import ALIASES, SURFACE_VARIABLES, UPPER_AIR_VARIABLES
from .engine import MEMBER, block_size, plan_regions, score_variable
from .grid import ForecastGrid
from .regions import get_regions
from .significance import IntervalOptions, score_rows
from .statistics import Statistics, check_times
from .units import unit_of

__all__ = [
    "DIM_ALIASES",
    "VAR_ALIASES",
    "check_members",
    "evaluate",
    "evaluate_statistics",
    "members",
    "normalise",
]

SPACE = ("latitude", "longitude")

log = logging.getLogger(__name__)

# Other sources' dimension names -> WB2 names, from the data package's one naming table.
DIMENSIONS = ("time", "prediction_timedelta", MEMBER, "level", "latitude", "longitude")
DIM_ALIASES = {alias: dim for dim in DIMENSIONS for alias in ALIASES[dim]}
# Other sources' variable names -> WB2 names, from the data package's one table (upper-air first,
# so ``z`` is geopotential, as in forecast files on pressure levels).
VAR_ALIASES = {
    alias: name
    for name in (*UPPER_AIR_VARIABLES, *SURFACE_VARIABLES)
    for alias in ALIASES.get(name, ())
    if alias not in {"z"} or name == "geopotential"
}


def normalise(ds: xr.Dataset, what: str = "dataset") -> xr.Dataset:
    """WB2 names for dims and variables; a dimension that cannot be mapped is an error."""
    # the first alias present is renamed, and only where its WB2 name is free (a forecast's
    # ``valid_time`` coordinate beside its ``time`` or ``init_time`` dimension stays as it is)
    renames: dict[str, str] = {}
    for k, v in DIM_ALIASES.items():
        if (k in ds.dims or k in ds.coords) and v not in ds.variables and v not in renames.values():
            renames[k] = v
    ds = ds.rename(renames)
    ds = ds.rename({k: v for k, v in VAR_ALIASES.items() if k in ds.data_vars})
    known = {"time", "prediction_timedelta", MEMBER, "level", "latitude", "longitude", "hour", "dayofyear"}
    unknown = sorted(str(d) for d in ds.dims if d not in known)
    if unknown:
        raise ValueError(
            f"{what}: cannot map dimension(s) {unknown}; expected names among {sorted(known)} "
            f"or the aliases {sorted(DIM_ALIASES)}"
        )
    if "level" in ds.coords:
        level = ds["level"].values.astype(np.float64)
        if level.size and level.max() > 2000:  # Pa → hPa
            level = level / 100
        ds = ds.assign_coords(level=np.rint(level).astype(np.int64))
    return ds


def members(ds: xr.Dataset) -> int | None:
    """The member count of a (normalised) ensemble forecast; None for a deterministic one."""
    return int(ds.sizes[MEMBER]) if MEMBER in ds.dims else None


def check_members(forecast: xr.Dataset, names: list[str]) -> None:
    """Refuse an ensemble whose members repeat: a member number twice, or two members with the
    same values (compared on the first variable's first init and lead): the ensemble would count
    them twice and its spread would shrink."""
    if MEMBER not in forecast.dims:
        return
    fix = (
        "draw further members of the same ensemble with predict --members N --first-member K (K: the "
        "members already drawn), not the same ones again"
    )
    if MEMBER in forecast.coords:
        numbers = forecast[MEMBER].values
        values, counts = np.unique(numbers, return_counts=True)
        if (counts > 1).any():
            dup = values[counts > 1].tolist()
            raise ValueError(
                f"forecast members {dup[:10]} appear {int(counts.max())} times in its {MEMBER!r} dimension "
                f"(joined stores of runs with the same members?): each would be counted twice; {fix}"
            )
    if not names or forecast.sizes[MEMBER] < 2:
        return
    field = forecast[names[0]].isel(time=0, prediction_timedelta=0)
    seen: dict[bytes, int] = {}
    for k in range(forecast.sizes[MEMBER]):
        key = np.ascontiguousarray(field.isel({MEMBER: k}).values).tobytes()
        if key in seen:
            a, b = forecast[MEMBER].values[[seen[key], k]] if MEMBER in forecast.coords else (seen[key], k)
            raise ValueError(
                f"forecast members {int(a)} and {int(b)} are identical ({names[0]!r} at the first init and "
                f"lead): the same member drawn twice (two predict runs with the same seed and member "
                f"numbers, renumbered?); {fix}"
            )
        seen[key] = k


def _levels(ref: xr.DataArray, other: xr.DataArray, what: str) -> xr.DataArray:
    """``other`` on the forecast variable's levels (exact hPa values)."""
    if "level" not in ref.dims:
        return other
    if "level" not in other.dims:
        raise ValueError(f"{what} {ref.name} has no 'level' dimension but the forecast has")
    want, have = ref["level"].values, other["level"].values
    missing = np.setdiff1d(want, have)
    if missing.size:
        raise ValueError(
            f"{what} {ref.name} lacks levels {missing.tolist()[:5]} of the forecast (it has "
            f"{have.tolist()}); use a store with those levels or score --variables without them"
        )
    return other.sel(level=want)


def _lacks(name: str, fc: xr.Dataset, other: xr.Dataset | None, what: str) -> str | None:
    """Why ``other`` cannot verify forecast variable ``name`` (missing, or missing levels)."""
    if other is None:
        return None
    if name not in other.data_vars:
        return f"the {what} has no {name!r} (it has {sorted(map(str, other.data_vars))})"
    if "level" in fc[name].dims and "level" in other[name].dims:
        missing = np.setdiff1d(fc[name]["level"].values, other[name]["level"].values)
        if missing.size:
            return (
                f"the {what} has {name!r} without levels {missing.tolist()[:5]} of the forecast "
                f"(it has {other[name]['level'].values.tolist()})"
            )
    return None


def _variables(
    forecast: xr.Dataset, truth: xr.Dataset, clim: xr.Dataset | None, variables: Sequence[str] | None
) -> list[str]:
    """The variables to score: every forecast variable (all must be verifiable, or an error names
    the first that is not), or those of ``variables`` (unverifiable ones skipped with a warning)."""
    names = list(variables) if variables else [str(v) for v in forecast.data_vars]
    absent = [v for v in names if v not in forecast.data_vars]
    if absent:
        have = sorted(map(str, forecast.data_vars))
        raise ValueError(f"--variables {absent} not in the forecast; it has {have}")
    kept = []
    for name in names:
        why = _lacks(name, forecast, truth, "truth store") or _lacks(name, forecast, clim, "climatology")
        if why is None:
            kept.append(name)
        elif variables:
            log.warning("skipped %s: %s", name, why)
        else:
            raise ValueError(
                f"forecast variable {name!r} cannot be scored: {why}; use a store that has "
                f"it, or score --variables without it"
            )
    if not kept:
        raise ValueError(f"none of --variables {names} can be scored against this truth/climatology")
    return kept


def _collect(
    per_variable: list[tuple[xr.DataArray, str, dict[tuple[str, str, str], np.ndarray]]], regions: list[str]
) -> tuple[dict[str, dict[str, np.ndarray]], list[tuple[str, int | None]], list[str]]:
    """The engine's per-variable statistics as ``{model: {stat: (time, lead, field, region)}}``, the
    fields (variable, level) and their units."""
    values: dict[str, dict[str, list[np.ndarray]]] = {}
    fields, units = [], []
    for fc, unit, scores in per_variable:
        levels = list(fc["level"].values) if "level" in fc.dims else [None]
        fields += [(str(fc.name), None if lev is None else int(lev)) for lev in levels]
        units += [unit] * len(levels)
        keys = dict.fromkeys((m, q) for m, q, _ in scores)
        for m, q in keys:
            per_region = [scores[(m, q, r)] for r in regions]  # (time, lead[, level]) each
            a = np.stack(per_region, axis=-1)
            a = a[:, :, None] if "level" not in fc.dims else a  # (time, lead, field, region)
            values.setdefault(m, {}).setdefault(q, []).append(a)
    joined = {m: {q: np.concatenate(parts, axis=2) for q, parts in qs.items()} for m, qs in values.items()}
    return joined, fields, units


def evaluate(
    forecast: xr.Dataset,
    truth: xr.Dataset,
    climatology: xr.Dataset | None = None,
    *,
    interval: IntervalOptions | None = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """``score_rows`` of ``evaluate_statistics`` (same arguments): RMSE, bias (and ACC with a
    climatology) per region, variable, level and lead as table rows, with their intervals by
    ``interval`` (None: none)."""
    return score_rows(evaluate_statistics(forecast, truth, climatology, **options), interval)


def evaluate_statistics(
    forecast: xr.Dataset,
    truth: xr.Dataset,
    climatology: xr.Dataset | None = None,
    *,
    variables: Sequence[str] | None = None,
    baselines: bool = True,
    model: str = "forecast",
    regions: Sequence[str] | None = None,
    progress: bool = False,
) -> Statistics:
    """The per-init statistics (``statistics.Statistics``) of RMSE, bias (and ACC with a climatology)
    per region, variable, level and lead; for an ensemble forecast (a ``number`` dimension) those of
    its mean and WB2's ensemble terms.

    With ``baselines`` the persistence (and climatology) forecasts are scored on the same inits.
    ``regions``: names from ``REGIONS`` or ``["all"]`` (default: global). Every chunk of the three
    stores is read once (``engine.score_variable``).
    """
    forecast, truth = normalise(forecast, "forecast"), normalise(truth, "truth")
    for dim in ("time", "prediction_timedelta"):
        if dim not in forecast.dims:
            raise ValueError(f"forecast has no {dim!r} dimension: is it a forecast store (init, lead)?")
    if climatology is not None:
        climatology = normalise(climatology, "climatology")
    for what, ds in (("truth", truth), ("climatology", climatology)):
        if ds is not None and MEMBER in ds.dims:
            raise ValueError(
                f"the {what} store has a member dimension {MEMBER!r} ({ds.sizes[MEMBER]}); verify "
                f"against one analysis: select it first (e.g. ds.isel({MEMBER}=0))"
            )
    n_members = members(forecast)
    if n_members is not None and n_members < 1:
        raise ValueError(f"forecast has an empty member dimension {MEMBER!r}; write at least one member")
    names = _variables(forecast, truth, climatology, variables)
    check_times(forecast["time"].values, "forecast init times")
    check_members(forecast, names)
    if "time" in truth.dims:
        check_times(truth["time"].values, "truth times")
    grid = ForecastGrid.match(forecast, truth)
    plans = plan_regions(get_regions(regions), grid, truth)
    per_variable = []
    blocks = {n: block_size(forecast[n]) for n in names}
    total = sum(-(-forecast.sizes["time"] // b) for b in blocks.values())
    with tqdm(total=total, desc="score", unit="block", disable=not progress, leave=False) as bar:
        for name in names:
            fc = forecast[name]
            inner = [d for d in (MEMBER, "level") if d in fc.dims]
            fc = fc.transpose("time", "prediction_timedelta", *inner, *SPACE)
            obs = _levels(fc, truth[name], "truth")
            obs = obs.transpose("time", *[d for d in obs.dims if d == "level"], *SPACE)
            clim = None
            if climatology is not None:
                clim = _levels(fc, climatology[name], "climatology")
                clim = clim.transpose("hour", "dayofyear", *[d for d in clim.dims if d == "level"], *SPACE)
            scores = score_variable(fc, obs, clim, grid, plans, baselines=baselines, model=model, bar=bar)
            per_variable.append((fc, unit_of(name, fc.attrs, truth[name].attrs), scores))
    log.info(
        "scored %d variables × %d inits × %d leads%s in %d region(s)",
        len(names), forecast.sizes["time"], forecast.sizes["prediction_timedelta"],
        "" if n_members is None else f" × {n_members} members", len(plans),
    )  # fmt: skip
    regions_scored = [p.name for p in plans]
    values, fields, units = _collect(per_variable, regions_scored)
    hours = forecast["prediction_timedelta"].values / np.timedelta64(1, "h")
    return Statistics.build(values, forecast["time"].values, hours, fields, regions_scored, units,
                            members=n_members)  # fmt: skip
