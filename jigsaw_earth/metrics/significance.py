"""Scores with their intervals, and paired comparisons with p-values, from per-init statistics.

``score_rows`` gives ``score``'s table rows (model, metric, region, variable, level, lead, value, unit)
with ``se``, ``lower`` and ``upper`` by the chosen method (``intervals.METHODS``); ``compare_rows``
compares one model with another on the inits both have: the difference of each score
(``COMPARED``), its relative difference, interval and two-sided p-value, adjusted over all the cells
compared at once (``CORRECTIONS``: Holm's step-down, Benjamini–Hochberg's false discovery rate).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from .delta import SCORES, compare, estimate
from .ensemble import ENSEMBLE_METRICS
from .intervals import METHODS, Interval
from .statistics import Statistics, shared

__all__ = [
    "COMPARED",
    "CORRECTIONS",
    "MIN_INITS",
    "IntervalOptions",
    "adjust",
    "compare_rows",
    "score_rows",
]

log = logging.getLogger(__name__)

COMPARED = ("rmse", "acc", "crps")  # the scorecard's scores: each has a better direction
CORRECTIONS = ("holm", "bh", "none")
# the fewest inits each method's interval holds its level on; below, ``FALLBACK``'s (with a warning).
# The 95 % interval's coverage of AR(1) series with rho1 0.7 (scripts/interval_coverage.py, docs/metrics.md
# "How many inits"): ar2 65 % on 10 inits, 82 % on 30, 88 % on 50; dm alike; the bootstrap 79 % on 10, 87 %
# on 30; ewc 92-93 % from 5 inits on (wide: few cosine terms, few degrees of freedom). iid assumes
# independent inits whatever their number.
MIN_INITS = {"iid": 2, "ar2": 50, "ewc": 2, "dm": 50, "bootstrap": 30}
FALLBACK = "ewc"
UNITLESS = ("acc", "spread_skill")


class IntervalOptions:
    """``method`` (``intervals.METHODS``), ``confidence`` (0 < c < 1), bootstrap ``replicates`` and
    ``seed``, and the multiple-testing ``correction`` (``CORRECTIONS``)."""

    def __init__(self, method: str = "ar2", confidence: float = 0.95, replicates: int = 1000, seed: int = 0,
                 correction: str = "holm"):  # fmt: skip
        if method not in METHODS:
            raise ValueError(f"--method {method!r} is not one of {', '.join(METHODS)}; e.g. --method ar2")
        if not 0 < confidence < 1:
            raise ValueError(f"--confidence {confidence} must be between 0 and 1; e.g. --confidence 0.95")
        if correction not in CORRECTIONS:
            raise ValueError(f"--correction {correction!r} is not one of {', '.join(CORRECTIONS)}")
        if replicates < 100:
            raise ValueError(f"--replicates {replicates}: the bootstrap needs at least 100; e.g. 1000")
        self.method, self.confidence, self.correction = method, confidence, correction
        self.replicates, self.seed = replicates, seed
        self._said: set[int] = set()  # numbers of inits warned about

    def method_for(self, n_inits: int, say: bool = True) -> str:
        """The method that gives ``n_inits`` a valid interval: ``method``, or ``FALLBACK`` when they are
        fewer than it needs (``MIN_INITS``; with ``say``, a warning says so, once per number of inits)."""
        if n_inits >= MIN_INITS[self.method]:
            return self.method
        if say and n_inits not in self._said:  # once: the scores and each comparison ask
            self._said.add(n_inits)
            log.warning("%d inits are too few for --method %s: on fewer than %d its interval is too narrow "
                        "(docs/metrics.md, 'How many inits'); the intervals are %s's, which hold their level "
                        "on few inits (and are wider)", n_inits, self.method, MIN_INITS[self.method],
                        FALLBACK)  # fmt: skip
        return FALLBACK

    def info(self, n_inits: int) -> dict[str, Any]:
        """What the score file records about its intervals (``method``: the one used; ``requested``:
        the one asked for, when the inits were too few for it)."""
        method = self.method_for(n_inits, say=False)
        out: dict[str, Any] = {"method": method, "confidence": self.confidence, "inits": n_inits}
        if method != self.method:
            out["requested"] = self.method
        out["correction"] = self.correction
        if method == "bootstrap":
            out.update(replicates=self.replicates, seed=self.seed)
        return out


def _metrics(series: dict[str, np.ndarray]) -> list[str]:
    names = ["rmse", "mse", "bias"] + (["acc"] if "acc" in series else [])
    return names + (list(ENSEMBLE_METRICS) if "crps_skill" in series else [])


def _flat(series: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.reshape(v.shape[0], -1) for k, v in series.items()}


def _check_spacing(times: np.ndarray, method: str) -> None:
    steps = np.unique(np.diff(np.asarray(times).astype("datetime64[h]")).astype(np.int64))
    if method != "iid" and steps.size > 1:
        log.warning("the inits are not equally spaced (steps of %s hours): %s treats them as "
                    "consecutive; its interval assumes a stationary, evenly sampled series", steps.tolist(),
                    method)  # fmt: skip


def _method(n: int, opts: IntervalOptions | None) -> str | None:
    """The interval method for ``n`` inits (None: no interval: no options, or a single init)."""
    if opts is None:
        return None
    if n < MIN_INITS[FALLBACK]:
        log.warning("%d init: no interval (any method needs at least %d inits); scores without one", n,
                    MIN_INITS[FALLBACK])  # fmt: skip
        return None
    return opts.method_for(n)


def _unit(metric: str, unit: str) -> str:
    return "1" if metric in UNITLESS else (f"({unit})^2" if metric == "mse" else unit)


def _cells(stats: Statistics):
    """(lead hours, variable, level, region, unit) per cell, in the flattened (lead, field, region)
    order of the series."""
    hours = stats.ds["lead_hours"].values
    units = stats.ds["unit"].values
    regions = stats.ds["region"].values
    for h in hours:
        for fi, (var, lev) in enumerate(stats.fields):
            for region in regions:
                yield float(h), var, lev, str(region), str(units[fi])


def score_rows(stats: Statistics, opts: IntervalOptions | None = None) -> list[dict[str, Any]]:
    """A row per model, metric, region, variable, level and lead: WB2's time-mean score as ``value``,
    with ``se``, ``lower`` and ``upper`` by ``opts`` (None: no interval)."""
    n = stats.times.size
    method = _method(n, opts)
    if method is not None:
        _check_spacing(stats.times, method)
    rows = []
    for model in stats.models:
        series = _flat(stats.series(model))
        for metric in _metrics(series):
            fn = SCORES[metric]
            used = {k: series[k] for k in fn.inputs}
            if method is not None:
                iv = estimate(fn, used, method, opts.confidence, opts.replicates, opts.seed)
            else:
                value = fn.value(*[v.mean(0) for v in used.values()])
                iv = Interval(value, *(np.full(value.shape, np.nan) for _ in range(5)))
            for c, (h, var, lev, region, unit) in enumerate(_cells(stats)):
                hide = metric == "spread_skill" and h <= 0  # WB2 leaves lead 0 out of the ratio
                rows.append({
                    "model": model, "metric": metric, "region": region, "variable": var, "level": lev,
                    "lead_hours": h, "value": np.nan if hide else float(iv.value[c]),
                    "unit": _unit(metric, unit),
                    "se": np.nan if hide else float(iv.se[c]),
                    "lower": np.nan if hide else float(iv.lower[c]),
                    "upper": np.nan if hide else float(iv.upper[c]),
                })  # fmt: skip
    return rows


def adjust(p: np.ndarray, correction: str) -> np.ndarray:
    """p-values adjusted over all of ``p`` (NaN left out): Holm's step-down (family-wise error) or
    Benjamini–Hochberg's step-up (false discovery rate); ``none`` leaves them."""
    p = np.asarray(p, dtype=np.float64)
    out = p.copy()
    ok = np.nonzero(~np.isnan(p))[0]
    m = ok.size
    if correction == "none" or m == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    ranked = p[order]
    if correction == "holm":
        adjusted = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * ranked))
    elif correction == "bh":
        adjusted = np.minimum.accumulate((m * ranked / np.arange(1, m + 1))[::-1])[::-1]
        adjusted = np.minimum(adjusted, 1.0)
    else:
        raise ValueError(f"unknown correction {correction!r}; choose one of {', '.join(CORRECTIONS)}")
    out[order] = adjusted
    return out


def compare_rows(
    a: Statistics, model: str, b: Statistics, against: str, opts: IntervalOptions, label: str | None = None
) -> list[dict[str, Any]]:
    """``model`` of ``a`` against model ``against`` of ``b`` (the same object for a built-in baseline)
    on their shared inits: per score of ``COMPARED`` both have, region, field and lead, the difference
    (``value``, A − B), ``relative`` (A/B − 1), ``se``, ``lower``, ``upper``, ``p_value``,
    ``p_adjusted`` (over every row returned), ``significant`` (``p_adjusted`` < 1 − confidence) and
    ``better`` (A is better by this score's direction). ``label``: the name the rows give B."""
    if a is not b:
        a, b = shared(a, b)
    n = a.times.size
    sa, sb = _flat(a.series(model)), _flat(b.series(against))
    metrics = [m for m in COMPARED if set(SCORES[m].inputs) <= sa.keys() & sb.keys()]
    method = _method(n, opts)
    if method is not None:
        _check_spacing(a.times, method)
    rows = []
    for metric in metrics:
        fn = SCORES[metric]
        if method is not None:
            boot = {"replicates": opts.replicates, "seed": opts.seed}
            diff = compare(fn, sa, sb, method, opts.confidence, **boot)
            rel = compare(fn, sa, sb, method, opts.confidence, relative=True, **boot)
        else:
            va = fn.value(*[sa[k].mean(0) for k in fn.inputs])
            vb = fn.value(*[sb[k].mean(0) for k in fn.inputs])
            nan = np.full(va.shape, np.nan)
            diff = Interval(va - vb, nan, nan, nan, nan, nan)
            rel = Interval(va / vb - 1, nan, nan, nan, nan, nan)
        for c, (h, var, lev, region, unit) in enumerate(_cells(a)):
            rows.append({
                "model": model, "against": label or against, "metric": metric, "region": region,
                "variable": var, "level": lev, "lead_hours": h, "value": float(diff.value[c]),
                "relative": float(rel.value[c]), "unit": _unit(metric, unit), "se": float(diff.se[c]),
                "lower": float(diff.lower[c]), "upper": float(diff.upper[c]),
                "relative_lower": float(rel.lower[c]), "relative_upper": float(rel.upper[c]),
                "p_value": float(diff.p_value[c]), "better": bool(diff.value[c] * fn.better > 0),
            })  # fmt: skip
    p = adjust(np.array([r["p_value"] for r in rows]), opts.correction)
    for r, q in zip(rows, p):
        r["p_adjusted"] = float(q)
        r["significant"] = bool(q < 1 - opts.confidence)
    return rows
