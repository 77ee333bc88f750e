"""``store_preflight``: a training config checked against its store before any process starts.

One function, called by ``jigsaw-earth config validate`` (when the store is reachable, or with
``--store``) and at the start of training (``data.sources.build_data``). It returns every
problem found (an empty list when the store fits the config); each names the config key to
change and the value that would work:

- variables (``data.upper_air``, ``data.surface``, ``data.static``) and ``data.levels`` exist,
  and their values are on disk (``integrity.missing_files``: a deleted array folder reads as NaN);
- statistics cover them on the store's grid;
- the time axis is regular, ``data.step_hours`` is a multiple of its step, the periods hold
  enough samples, and gaps are refused unless ``data.allow_gaps``;
- the climatology (``data.climatology`` or the default beside the store) is on the store's grid
  and holds the variables.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
from jigsaw_earth.data.batch import VariableSpec
from jigsaw_earth.data.integrity import missing_files, read_values
from jigsaw_earth.data.store import StoreView
from jigsaw_earth.data.times import TimeAxis, period_mask, sample_index

__all__ = ["NAN_SCANS", "default_climatology_path", "store_nans", "store_preflight"]

NAN_SCANS = ("auto", "sample", "full", "none")
FULL_SCAN_BYTES = 2 << 30  # ``auto`` scans every time of the periods up to this many float32 bytes

log = logging.getLogger(__name__)


def default_climatology_path(store: str | Path) -> str | Path:
    """``<store stem>-climatology.zarr`` beside the store (what ``data synth`` writes); a URL for a
    store given as a URL (``Path`` would fold its ``//``)."""
    text = str(store).rstrip("/")
    if "://" in text:
        head, _, name = text.rpartition("/")
        return f"{head}/{name.removesuffix('.zarr')}-climatology.zarr"
    p = Path(store)
    stem = p.name[: -len(".zarr")] if p.name.endswith(".zarr") else p.name
    return p.with_name(f"{stem}-climatology.zarr")


def _yaml_list(items: list[Any]) -> str:
    return "[" + ", ".join(str(x) for x in items) + "]"


def _check_variables(view: StoreView, d: Any) -> list[str]:
    problems = []
    store_upper, store_surface, store_static = view.known_variables()
    for key, wanted, upper, held in (
        ("data.upper_air", d.upper_air, True, store_upper),
        ("data.surface", d.surface, False, store_surface),
        ("data.static", d.static, False, store_static),
    ):
        missing = []
        for v in wanted:
            try:
                view.resolve(v, upper_air=upper)
            except ValueError:
                missing.append(v)
        if missing:
            keep = [v for v in wanted if v not in missing]
            problems.append(
                f"{key} lists {missing}, which store {view.path!r} does not hold (its {key.split('.')[1]} "
                f"variables: {held or 'none'}); set {key}: {_yaml_list(keep)}"
                + (f" (or any of {held})" if set(held) - set(keep) else "")
            )
    if d.upper_air:
        have = (
            []
            if view.levels is None
            else [int(x) if float(x).is_integer() else float(x) for x in view.levels]
        )
        missing = [lev for lev in d.levels if not np.isclose(have, lev).any()] if have else list(d.levels)
        if missing:
            keep = [lev for lev in d.levels if lev not in missing] or sorted(have)[:2]
            problems.append(
                f"data.levels has {missing} hPa, not in store {view.path!r} (levels {sorted(have) or 'none'})"
                + (f"; set data.levels: {_yaml_list(keep)}" if have else "; set data.upper_air: []")
            )
    return problems


def _check_files(view: StoreView, d: Any) -> list[str]:
    """The values of every configured variable are on disk (``integrity.missing_files``)."""
    problems = []
    for key, names, upper in (("data.upper_air", d.upper_air, True), ("data.surface", d.surface, False),
                              ("data.static", d.static, False)):  # fmt: skip
        for v in names:
            try:
                why = missing_files(view, view.resolve(v, upper_air=upper))
            except ValueError:
                continue  # not in the store: _check_variables names it
            if why is not None:
                problems.append(f"{key} {v!r}: {why}; or drop {v!r} from {key}")
    return problems


def _check_statistics(view: StoreView, spec: VariableSpec) -> list[str]:
    from jigsaw_earth.data.stats import Normalizer, read_statistics

    try:
        Normalizer.from_stats(read_statistics(view.path), spec, view, 4)
    except (ValueError, FileNotFoundError, KeyError) as err:
        return [f"statistics of store {view.path!r}: {err}"]
    return []


def _check_times(view: StoreView, cfg: Any) -> list[str]:
    d, problems = cfg.data, []
    t = np.asarray(view.times).astype("datetime64[s]")
    try:
        TimeAxis.of(t).require_regular(f"store {view.path!r}")
    except ValueError as err:
        return [str(err)]
    leads = max(cfg.validation.lead_hours or [d.step_hours]) // max(d.step_hours, 1)
    for key, period, lead_steps, what, need in (
        (
            "data.train_period",
            d.train_period,
            cfg.training.rollout_steps,
            "training",
            cfg.training.batch_size,
        ),
        ("data.val_period", d.val_period, leads, "validation", 1),
    ):
        mask = period_mask(t, period, unit="s")
        if not mask.any():
            problems.append(
                f"{key} {period} holds no time of store {view.path!r} ({t[0]} .. {t[-1]}); "
                f"choose a period inside it"
            )
            continue
        try:
            inits, targets = sample_index(
                t, np.nonzero(mask)[0], d.step_hours, lead_steps, d.allow_gaps, f"store {view.path!r}", what
            )
        except ValueError as err:
            problems.append(f"{key}: {err}")
            continue
        n = int(mask[targets[:, -1]].sum()) if len(inits) else 0
        if n < need:
            hours = lead_steps * d.step_hours
            problems.append(
                f"{key} {period} holds {n} {what} sample(s) with {hours} h of targets; at least "
                f"{need} needed: widen {key}"
            )
    return problems


def _check_climatology(view: StoreView, cfg: Any, spec: VariableSpec) -> list[str]:
    from jigsaw_earth.data.climatology import open_climatology

    d = cfg.data
    path = d.climatology or str(default_climatology_path(view.path))
    if not d.climatology and not (Path(path).exists() or "://" in path):
        log.warning("no climatology at %s: validation will skip the climatology baseline", path)
        return []
    try:
        clim = open_climatology(path, view)
    except (ValueError, FileNotFoundError, OSError) as err:
        key = "data.climatology" if d.climatology else "the default climatology (data.climatology: null)"
        return [f"{key} {path!r}: {err}"]
    problems = []
    for v in [*spec.upper_air, *spec.surface]:
        if v not in clim.data_vars:
            held = sorted(map(str, clim.data_vars))
            problems.append(
                f"climatology {path!r} has no {v!r} (it has {held}); use a climatology with "
                f"every trained variable or drop {v!r}"
            )
        elif v in spec.upper_air and "level" in clim[v].dims:
            missing = [lev for lev in spec.levels if lev not in clim["level"].values]
            if missing:
                problems.append(
                    f"climatology {path!r} lacks levels {missing} of {v!r}; set data.levels to "
                    f"levels it has ({clim['level'].values.tolist()})"
                )
    return problems


def store_nans(cfg: Any, store: str | None = None, scan: str = "auto") -> tuple[list[str], str]:
    """NaNs in the values training reads: each configured variable (at ``data.levels``) at the times
    of ``data.train_period`` and ``data.val_period`` — 5 of them spread over the periods
    (``sample``), every one (``full``), or every one when that is at most ``FULL_SCAN_BYTES``
    (``auto``); ``none``: no scan. Returns one problem per variable holding any (its count, how
    many times, the first) and what was scanned (``"sample"``, ``"full"`` or ``"none"``)."""
    if scan not in NAN_SCANS:
        raise ValueError(f"--nans {scan!r}: choose one of {', '.join(NAN_SCANS)}")
    if scan == "none":
        return [], "none"
    d = cfg.data
    view = StoreView.open(store or d.store)
    t = np.asarray(view.times).astype("datetime64[s]")
    mask = np.zeros(len(t), dtype=bool)
    for period in (d.train_period, d.val_period):
        if period:
            mask |= period_mask(t, period, unit="s")
    idx = np.nonzero(mask)[0]
    if scan == "auto":
        channels = len(d.upper_air) * len(d.levels) + len(d.surface)
        scan = (
            "full" if len(idx) * channels * len(view.lat) * len(view.lon) * 4 <= FULL_SCAN_BYTES else "sample"
        )
    if scan == "sample" and len(idx) > 5:
        idx = idx[np.unique(np.linspace(0, len(idx) - 1, 5).round().astype(int))]
    tdim, ldim = view.coord_names["time"], view.coord_names.get("level")
    problems = []
    wanted = [(v, True) for v in d.upper_air] + [(v, False) for v in (*d.surface, *d.static)]
    for v, upper in wanted:
        da = view.dataset[view.resolve(v, upper_air=upper)]
        if upper and ldim in da.dims:
            levels = np.asarray(view.levels)
            da = da.isel({ldim: [int(np.argmin(np.abs(levels - lev))) for lev in d.levels]})
        if tdim in da.dims:
            da = da.isel({tdim: idx})
        bad = np.isnan(read_values(view, view.resolve(v, upper_air=upper), da))
        if not bad.any():
            continue
        key = "data.upper_air" if upper else ("data.static" if v in d.static else "data.surface")
        if tdim in da.dims:
            per_time = np.moveaxis(bad, da.dims.index(tdim), 0).reshape(len(idx), -1).any(-1)
            hit = np.nonzero(per_time)[0]
            first = np.datetime_as_string(t[idx[hit[0]]], unit="h")
            sampled = "sampled " if scan == "sample" else ""
            where = f"in {hit.size} of the {len(idx)} {sampled}times (first {first})"
        else:
            where = "(a static field)"
        problems.append(
            f"{key} {v!r}: {int(bad.sum())} NaN values {where} in store {view.path!r}; training stops at "
            f"the first step that reads one: fill them (data prepare --nans fill), or choose periods or "
            f"variables without them"
        )
    return problems, scan


def store_preflight(cfg: Any, store: str | None = None) -> list[str]:
    """Every problem between ``cfg`` (a ``TrainConfig``) and its store; [] when they fit.

    ``store`` overrides ``cfg.data.store`` (``config validate --store``).
    """
    d = cfg.data
    path = store or d.store
    try:
        view = StoreView.open(path)
    except (ValueError, FileNotFoundError, OSError) as err:
        return [f"data.store {path!r}: {err}"]
    problems = _check_variables(view, d)
    problems += _check_times(view, cfg)
    problems += _check_files(view, d)
    if problems:
        return problems  # statistics and climatology checks assume the variables exist
    try:
        spec = VariableSpec(tuple(d.upper_air), tuple(d.levels), tuple(d.surface), tuple(d.static))
    except ValueError as err:
        return [f"data.upper_air / data.levels / data.surface: {err}"]
    return _check_statistics(view, spec) + _check_climatology(view, cfg, spec)
