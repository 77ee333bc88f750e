"""Every score as a function of time means of per-init series, with its interval (the delta method).

A score is ``f(x̄₁, …, x̄ₖ)`` of the means over inits of a few per-init series (``Statistics.series``):
RMSE = √mean MSE, spread/skill = √mean variance / √mean MSE, CRPS = mean skill − mean spread / 2 … Its
linearised per-init values (``linearise``) are ∇f(x̄)·(xᵢ − x̄): their mean's variance is the delta
method's variance of ``f(x̄)`` (exact for a linear ``f``), so ``intervals.t_interval`` applies to any score;
the bootstrap resamples the series themselves. A comparison of two forecasts on the same inits is
``f(x̄ᴬ) − f(x̄ᴮ)`` (or relative: ``f(x̄ᴬ)/f(x̄ᴮ) − 1``) with the paired series: one more smooth function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .intervals import Interval, bootstrap, t_interval

__all__ = ["SCORES", "TIE", "ScoreFunction", "compare", "estimate", "linearise"]

Arrays = dict[str, np.ndarray]
# paired per-init statistics this close (relative) are equal: float64 sums of the same float32 fields
# taken in another order (other chunks, other leads beside them) differ by at most about N·2⁻⁵³ of the
# value, 1e-10 on a 0.25° grid's million points; forecasts that differ at all differ by float32
# roundings (6e-8 of a value) in many points
TIE = 1e-9


@dataclass(frozen=True)
class ScoreFunction:
    """``value(*means)`` and its ``gradient(*means)`` (one array per input) of the means of the per-init
    series named in ``inputs``; ``better``: +1 where higher is better, −1 where lower is, 0 neither."""

    inputs: tuple[str, ...]
    value: Callable[..., np.ndarray]
    gradient: Callable[..., tuple]
    better: int = -1


def _linear(name: str, better: int = -1) -> ScoreFunction:
    return ScoreFunction((name,), lambda x: x, lambda x: (np.ones_like(x),), better)


def _root(name: str, better: int = -1) -> ScoreFunction:
    return ScoreFunction((name,), np.sqrt, lambda x: (0.5 / np.sqrt(x),), better)


def _spread_skill_gradient(v: np.ndarray, se: np.ndarray) -> tuple:
    ratio = np.sqrt(v / se)
    return 0.5 * ratio / v, -0.5 * ratio / se


SCORES: dict[str, ScoreFunction] = {
    "rmse": _root("se"),
    "mse": _linear("se"),
    "bias": _linear("e", 0),
    "acc": _linear("acc", +1),
    "crps": ScoreFunction(
        ("crps_skill", "crps_spread"),
        lambda s, p: s - 0.5 * p,
        lambda s, p: (np.ones_like(s), np.full_like(p, -0.5)),
    ),
    "crps_skill": _linear("crps_skill"),
    "crps_spread": _linear("crps_spread", 0),
    "ensemble_stddev": _root("ensemble_variance", 0),
    "spread_skill": ScoreFunction(
        ("ensemble_variance", "se"), lambda v, se: np.sqrt(v / se), _spread_skill_gradient, 0
    ),
}


def _tied(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``b`` with each value within ``TIE`` (relative) of ``a``'s replaced by ``a``'s."""
    with np.errstate(invalid="ignore"):
        return np.where(np.abs(a - b) <= TIE * np.maximum(np.abs(a), np.abs(b)), a, b)


def _means(fn: ScoreFunction, series: Arrays, prefix: str = "") -> list[np.ndarray]:
    return [series[prefix + name].mean(0) for name in fn.inputs]


def linearise(fn: ScoreFunction, series: Arrays, prefix: str = "") -> tuple[np.ndarray, np.ndarray]:
    """``f(x̄)`` ``(C,)`` and the linearised per-init values ∇f(x̄)·(xᵢ − x̄) ``(n, C)`` of ``series``
    (``(n, C)`` each; ``prefix``: the names' prefix, for one side of a comparison)."""
    means = _means(fn, series, prefix)
    with np.errstate(invalid="ignore", divide="ignore"):
        value, grads = fn.value(*means), fn.gradient(*means)
        tangents = sum(g * (series[prefix + name] - m) for name, g, m in zip(fn.inputs, grads, means))
    return value, tangents


def _resampled(fn: ScoreFunction, prefix: str = "") -> Callable[[Arrays], np.ndarray]:
    def score(means: Arrays) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return fn.value(*[means[prefix + name] for name in fn.inputs])

    return score


def estimate(
    fn: ScoreFunction, series: Arrays, method: str, confidence: float, replicates: int = 1000, seed: int = 0
) -> Interval:
    """The score's value, standard error and interval by ``method`` (``intervals.METHODS``)."""
    value, tangents = linearise(fn, series)
    if method == "bootstrap":
        used = {k: series[k] for k in fn.inputs}
        return bootstrap(used, _resampled(fn), tangents, confidence, replicates, seed)
    return t_interval(value, tangents, method, confidence)


def compare(
    fn: ScoreFunction,
    a: Arrays,
    b: Arrays,
    method: str,
    confidence: float,
    *,
    relative: bool = False,
    replicates: int = 1000,
    seed: int = 0,
) -> Interval:
    """``f(A) − f(B)`` (``relative``: ``f(A)/f(B) − 1``) on paired per-init series of the same inits, its
    interval and the p-value of "no difference". Paired values equal to ``TIE`` (relative) count as
    equal: the same forecast's statistics summed in another order differ in their last bits, and those
    bits are no difference (identical forecasts give 0 with p = 1)."""
    b = {k: _tied(a[k], b[k]) if k in a else v for k, v in b.items()}
    va, ta = linearise(fn, a)
    vb, tb = linearise(fn, b)
    with np.errstate(invalid="ignore", divide="ignore"):
        if relative:
            value, tangents = va / vb - 1, ta / vb - va * tb / vb**2
        else:
            value, tangents = va - vb, ta - tb
    if method != "bootstrap":
        return t_interval(value, tangents, method, confidence)
    score_a, score_b = _resampled(fn, "a:"), _resampled(fn, "b:")

    def paired(means: Arrays) -> np.ndarray:
        fa, fb = score_a(means), score_b(means)
        with np.errstate(invalid="ignore", divide="ignore"):
            return fa / fb - 1 if relative else fa - fb

    joint = {f"a:{k}": a[k] for k in fn.inputs} | {f"b:{k}": b[k] for k in fn.inputs}
    return bootstrap(joint, paired, tangents, confidence, replicates, seed)
