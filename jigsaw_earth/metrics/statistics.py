"""Per-init sufficient statistics of every score: what ``score`` and ``predict --score`` keep and write.

Per model (the forecast, ``persistence``, ``climatology`` …), init time, lead, field (variable and level)
and region, the region's weighted spatial means (``STATS``) — of the error² (``se``), the error (``e``),
the forecast and truth anomalies' product and squares (``fo``, ``ff``, ``oo``: ACC) and, for an
ensemble, WB2's pointwise terms (``ensemble.POINTWISE``). Small (independent of the grid), they give
every score (``delta.SCORES``) and its interval, and two runs can be compared or joined later without
forecasting again. On disk: a netCDF file ``PREFIX-stats.nc`` beside ``PREFIX.json``, one variable
``MODEL.STAT`` (time, lead, field, region) each.

They carry what they were computed against: the ``truth`` and ``climatology`` stores (attributes, by
absolute path), the leads, fields and regions (coordinates) and the inits (sorted, each once: a file
that repeats or shuffles them is refused). A join (``join``) or a comparison (``shared``) of statistics
computed against another truth or climatology is refused naming both (``check_reference``); a comparison
names the leads, fields and regions it leaves out.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from .ensemble import POINTWISE

__all__ = [
    "FORMAT",
    "REFERENCES",
    "STATS",
    "SUFFIX",
    "Statistics",
    "check_reference",
    "check_times",
    "field_name",
    "shared",
    "stats_path",
]

log = logging.getLogger(__name__)

STATS = ("se", "e", "fo", "ff", "oo", *POINTWISE)
FORMAT = "jigsaw-earth score statistics 1"
SUFFIX = "-stats.nc"
DIMS = ("time", "lead", "field", "region")
NO_LEVEL = -1  # a surface field's level on disk
REFERENCES = ("truth", "climatology")  # the stores the statistics were computed against (attributes)


def check_times(times: np.ndarray, what: str) -> None:
    """Refuse empty, duplicated or unsorted times (a duplicate would be scored twice), listing them."""
    times = np.asarray(times)
    if times.size == 0:
        raise ValueError(f"{what}: none (an empty store?); score a forecast with at least one init time")
    stamps = [str(np.datetime_as_string(t, unit="h")) if np.issubdtype(times.dtype, np.datetime64) else str(t)
              for t in times]  # fmt: skip
    values, counts = np.unique(times, return_counts=True)
    if (counts > 1).any():
        dup = [stamps[int(np.nonzero(times == v)[0][0])] for v in values[counts > 1]]
        more = " …" if len(dup) > 10 else ""
        raise ValueError(
            f"{what} repeat {dup[:10]}{more} ({len(dup)} duplicated): each would be counted "
            f"twice; write each init once (e.g. ds.drop_duplicates('time'))"
        )
    back = np.nonzero(times[1:] < times[:-1])[0]
    if back.size:
        k = int(back[0])
        raise ValueError(
            f"{what} are not sorted: {stamps[k]} comes before {stamps[k + 1]}; sort them first "
            f"(ds.sortby('time'))"
        )


def field_name(variable: str, level: int | None) -> str:
    """``geopotential@500``, or the variable of a surface field."""
    return variable if level is None else f"{variable}@{int(level)}"


def stats_path(prefix: str | os.PathLike) -> Path:
    """``PREFIX-stats.nc``: where the statistics of ``PREFIX.json`` go."""
    prefix = Path(prefix)
    return prefix.with_name(prefix.name + SUFFIX)


class Statistics:
    """The per-init statistics of one scoring run, an ``xarray.Dataset`` underneath (``ds``)."""

    def __init__(self, ds: xr.Dataset, source: str = "statistics"):
        if ds.attrs.get("format") != FORMAT:
            if "prediction_timedelta" in ds.dims:  # a forecast written as netCDF (predict --format netcdf)
                raise ValueError(
                    f"{source} is a forecast in netCDF (predict --format netcdf), not statistics of "
                    f"jigsaw-earth score; score reads a forecast as a Zarr store: predict it with --format "
                    f"zarr, or score it as it runs (predict --score --scores PREFIX)"
                )
            raise ValueError(
                f"{source} is not a statistics file of jigsaw-earth score (format "
                f"{ds.attrs.get('format')!r}, expected {FORMAT!r}); write one with `jigsaw-earth score`"
            )
        self.ds, self.source = ds, source

    @classmethod
    def build(
        cls,
        values: dict[str, dict[str, np.ndarray]],
        times: np.ndarray,
        lead_hours: Sequence[float],
        fields: Sequence[tuple[str, int | None]],
        regions: Sequence[str],
        units: Sequence[str],
        **attrs: Any,
    ) -> Statistics:
        """From ``{model: {stat: (time, lead, field, region)}}`` and the coordinates; ``attrs``: the
        run's information (stores, members …; None left out)."""
        data = {f"{m}.{s}": (DIMS, np.asarray(a, float)) for m, q in values.items() for s, a in q.items()}
        coords = {
            "time": np.asarray(times).astype("datetime64[ns]"),
            "lead_hours": ("lead", np.asarray(lead_hours, dtype=np.float64)),
            "field": [field_name(v, lev) for v, lev in fields],
            "variable": ("field", [v for v, _ in fields]),
            "level": ("field", np.array([NO_LEVEL if lev is None else lev for _, lev in fields], np.int64)),
            "unit": ("field", list(units)),
            "region": list(regions),
        }
        kept = {k: v for k, v in attrs.items() if v is not None}
        return cls(xr.Dataset(data, coords=coords, attrs={"format": FORMAT, **kept}))

    # ------------------------------------------------------------------ what it holds
    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys(str(k).split(".", 1)[0] for k in self.ds.data_vars))

    @property
    def times(self) -> np.ndarray:
        return self.ds["time"].values

    @property
    def fields(self) -> list[tuple[str, int | None]]:
        pairs = zip(self.ds["variable"].values, self.ds["level"].values)
        return [(str(v), None if lev == NO_LEVEL else int(lev)) for v, lev in pairs]

    def stats(self, model: str) -> dict[str, np.ndarray]:
        """``{stat: (time, lead, field, region)}`` of ``model``."""
        if model not in self.models:
            raise ValueError(f"{self.source} has no model {model!r}; it has {self.models}")
        return {s: self.ds[f"{model}.{s}"].values for s in STATS if f"{model}.{s}" in self.ds}

    def series(self, model: str) -> dict[str, np.ndarray]:
        """The per-init series the scores are functions of (``delta.SCORES``' inputs): the statistics,
        and ``acc`` = ``fo / √(ff·oo)`` per init (WB2's ACC is the mean over inits of this)."""
        out = dict(self.stats(model))
        if {"fo", "ff", "oo"} <= out.keys():
            with np.errstate(invalid="ignore", divide="ignore"):
                out["acc"] = out["fo"] / np.sqrt(out["ff"] * out["oo"])
        return out

    def renamed(self, model: str, new: str) -> Statistics:
        mine = [str(k) for k in self.ds.data_vars if str(k).startswith(model + ".")]
        names = {k: f"{new}.{k.split('.', 1)[1]}" for k in mine}
        return Statistics(self.ds.rename(names), self.source)

    def only(self, models: Sequence[str]) -> Statistics:
        keep = [k for k in self.ds.data_vars if str(k).split(".", 1)[0] in models]
        return Statistics(self.ds[keep], self.source)

    # ------------------------------------------------------------------ on disk
    def write(self, path: str | os.PathLike) -> Path:
        """netCDF, whole or not at all."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        self.ds.to_netcdf(tmp, engine="netcdf4")
        tmp.replace(path)
        return path

    @classmethod
    def read(cls, path: str | os.PathLike) -> Statistics:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"statistics file {path} not found; `jigsaw-earth score` writes them to PREFIX{SUFFIX}"
            )
        try:
            ds = xr.open_dataset(path, engine="netcdf4").load()
        except (OSError, ValueError) as err:
            raise ValueError(f"{path} is not a statistics file of jigsaw-earth score ({err})") from None
        stats = cls(ds, str(path))
        check_times(stats.times, f"statistics file {path}: its init times")  # each once, in order
        return stats

    def reference(self, what: str) -> str | None:
        """The ``truth`` or ``climatology`` store these statistics were computed against (None: none,
        or not recorded)."""
        value = self.ds.attrs.get(what)
        return None if value is None or value == "" else str(value)

    @staticmethod
    def recognise(path: Path) -> bool:
        """Whether ``path`` is a statistics file (what an output check may replace)."""
        try:
            with xr.open_dataset(path, engine="netcdf4") as ds:
                return ds.attrs.get("format") == FORMAT
        except (OSError, ValueError):
            return False

    # ------------------------------------------------------------------ joining and pairing
    @classmethod
    def join(cls, parts: Sequence[Statistics]) -> Statistics:
        """Campaigns of the same fields, leads, regions and models joined on their init times (an init
        in two parts is refused)."""
        if len(parts) == 1:
            return parts[0]
        first, rest = parts[0], []
        for p in parts[1:]:
            same = all(set(p.ds[c].values) == set(first.ds[c].values) for c in ("field", "region"))
            if same:  # the same cells in another order (predict's and score's field orders differ)
                order = {c: first.ds[c].values for c in ("field", "region")}
                p = Statistics(p.ds.sel(order), p.source)
            rest.append(p)
            for coord in ("lead_hours", "field", "region"):
                if not np.array_equal(p.ds[coord].values, first.ds[coord].values):
                    raise ValueError(
                        f"{p.source} has other {coord} ({p.ds[coord].values.tolist()}) than {first.source} "
                        f"({first.ds[coord].values.tolist()}); join statistics of the same fields, leads and "
                        f"regions"
                    )
            if set(p.ds.data_vars) != set(first.ds.data_vars):
                raise ValueError(
                    f"{p.source} holds {sorted(map(str, p.ds.data_vars))} but {first.source} holds "
                    f"{sorted(map(str, first.ds.data_vars))}; join statistics of the same models"
                )
        parts = [first, *rest]
        for p in parts[1:]:
            check_reference(first, p, "joined")
        times = np.concatenate([p.times for p in parts])
        values, counts = np.unique(times, return_counts=True)
        if (counts > 1).any():
            raise ValueError(
                f"init {values[counts > 1][0]} is in more than one of {[p.source for p in parts]}: it would "
                f"count twice; join campaigns of different inits"
            )
        ds = xr.concat([p.ds for p in parts], "time", data_vars="all", coords="minimal").sortby("time")
        return cls(ds.assign_attrs(first.ds.attrs), " + ".join(p.source for p in parts))

    def at(self, times: np.ndarray) -> Statistics:
        return Statistics(self.ds.sel(time=times), self.source)


def check_reference(a: Statistics, b: Statistics, doing: str = "compared") -> None:
    """Refuse statistics computed against another truth or climatology store than ``a``'s: their scores
    measure distances to different references. Where one side did not record its store (a file of an
    earlier version) a warning says the same one is assumed."""
    for what in REFERENCES:
        mine, theirs = a.reference(what), b.reference(what)
        if mine is not None and theirs is not None and mine != theirs:
            raise ValueError(
                f"{b.source} was scored against the {what} {theirs} but {a.source} against {mine}: "
                f"statistics against another {what} cannot be {doing}. Score both against the same "
                f"--{what} (a store is scored again with score STORE --{what} {mine})"
            )
        for known, unknown in ((a, b), (b, a)):
            stats = {str(k).split(".", 1)[-1] for k in unknown.ds.data_vars}
            used = what == "truth" or "fo" in stats  # ACC's statistics need a climatology
            if known.reference(what) is not None and unknown.reference(what) is None and used:
                log.warning("%s records no %s store (%s was scored against %s): %s assuming the same one",
                            unknown.source, what, known.source, known.reference(what), doing)  # fmt: skip


def _dropped(a: Statistics, b: Statistics, coord: str, kept: list[Any]) -> None:
    """Say which values of ``coord`` each side loses in a comparison (nothing is dropped silently)."""
    for s in (a, b):
        lost = [v for v in s.ds[coord].values.tolist() if v not in kept]
        if lost:
            log.warning("%s's %s %s are not in the other forecast's statistics: left out of the comparison",
                        s.source, "lead hours" if coord == "lead_hours" else f"{coord}s", lost)  # fmt: skip


def shared(a: Statistics, b: Statistics) -> tuple[Statistics, Statistics]:
    """Both on the inits, fields, leads and regions they share (a warning says what is left out);
    refused when they share no init or no cell, or were computed against another truth or
    climatology (``check_reference``)."""
    check_reference(a, b)
    times = np.intersect1d(a.times, b.times)
    if times.size == 0:
        span = lambda s: f"{s.times.min()} … {s.times.max()} ({s.times.size} inits)"  # noqa: E731
        raise ValueError(
            f"{a.source} and {b.source} share no init time ({span(a)}; {span(b)}): a paired comparison "
            f"needs forecasts from the same inits; score them over a common period (--start, --end)"
        )
    dropped = {s.source: s.times.size - times.size for s in (a, b) if s.times.size > times.size}
    if dropped:
        log.warning("compared on the %d inits both have; left out: %s", times.size,
                    ", ".join(f"{n} of {src}" for src, n in dropped.items()))  # fmt: skip
    sel: dict[str, Any] = {"time": times}
    for coord in ("field", "region"):
        common = [v for v in a.ds[coord].values if v in set(b.ds[coord].values)]
        if not common:
            raise ValueError(
                f"{a.source} and {b.source} share no {coord} ({a.ds[coord].values.tolist()} against "
                f"{b.ds[coord].values.tolist()}); compare forecasts of the same fields and regions"
            )
        sel[coord] = common
        _dropped(a, b, coord, common)
    leads = [h for h in a.ds["lead_hours"].values if h in set(b.ds["lead_hours"].values)]
    if not leads:
        raise ValueError(f"{a.source} and {b.source} share no lead; compare forecasts of the same leads")
    _dropped(a, b, "lead_hours", leads)

    def pick(s: Statistics) -> Statistics:
        ds = s.ds.sel(sel)
        idx = [int(np.nonzero(ds["lead_hours"].values == h)[0][0]) for h in leads]
        return Statistics(ds.isel(lead=idx), s.source)

    return pick(a), pick(b)
