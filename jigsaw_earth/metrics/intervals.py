"""Standard errors, confidence intervals and p-values of time means of autocorrelated per-init series.

Every function works on ``(n, C)`` arrays: ``n`` inits (in time order, equally spaced) down axis 0,
``C`` independent cells (variable, level, lead, region …) across. A score that is a smooth function
``f`` of the means of several per-init series (RMSE = √mean MSE, spread/skill …) enters as its
*linearised per-init values* — ``tangents`` = ∇f(x̄)·(xᵢ − x̄), zero-mean, whose mean's variance is the
delta method's variance of ``f(x̄)`` — so each method below only estimates the variance of a mean.

The methods (``METHODS``) follow WeatherBench-X's ``statistical_inference`` (google-research/weatherbenchX)
and, for ``dm``, the ``scores`` package (nci/scores):

* ``iid``: the t interval, s/√n with n − 1 degrees of freedom: assumes independent inits.
* ``ar2``: Geer (2016, Tellus A 68:30229): s/√n inflated by k, with k² = (1 − ρ₁φ₁ − ρ₂φ₂)/(1 − φ₁ − φ₂)²
  from the lag-1 and lag-2 autocorrelations ρ₁, ρ₂ through the AR(2) Yule–Walker coefficients
  φ₁ = ρ₁(1 − ρ₂)/(1 − ρ₁²), φ₂ = (ρ₂ − ρ₁²)/(1 − ρ₁²); n − 1 degrees of freedom.
* ``ewc``: Lazarus, Lewis, Stock & Watson (2018): the long-run variance from the first
  v = ⌊0.4 n^⅔⌋ cosine-transform (DCT-II) coefficients of the series, v degrees of freedom.
* ``dm``: Diebold–Mariano with Hering & Genton's (2011) long-run variance: an exponential model
  σ² e^(−3k/θ) fitted by least squares to the sample autocovariances up to lag ⌊(n − 1)/2⌋, summed
  over all lags; normal quantiles.
* ``bootstrap``: Politis & Romano's (1994) stationary bootstrap, its mean block length chosen per cell by
  Politis & White (2004, with Patton et al.'s 2009 correction) from the tangents; percentile intervals.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = [
    "METHODS",
    "Interval",
    "block_length",
    "bootstrap",
    "stationary_counts",
    "t_interval",
]

METHODS = ("ar2", "ewc", "iid", "dm", "bootstrap")
EWC_V0 = 0.4  # Lazarus et al.'s recommended constant
BLOCK_ROUNDING = 30  # block lengths rounded to 30 steps per decade (as WeatherBench-X caches them)


@dataclass(frozen=True)
class Interval:
    """A score's estimate, standard error, interval bounds and two-sided p-value of "value = 0" (all
    ``(C,)``); ``dof``: the t distribution's degrees of freedom (inf: normal; NaN: bootstrap)."""

    value: np.ndarray
    se: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    p_value: np.ndarray
    dof: np.ndarray


def _t_dist(dof: np.ndarray):
    from scipy import stats

    return stats.t(df=dof)


def _variance(d: np.ndarray) -> np.ndarray:
    return (d**2).sum(0) / (d.shape[0] - 1)


def _autocorrelation(d: np.ndarray, var: np.ndarray, lag: int) -> np.ndarray:
    """Lag-``lag`` autocorrelation: the mean lagged product over the variance (0 where it is 0)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (d[:-lag] * d[lag:]).mean(0) / var
    return np.where(var != 0, r, 0.0)


def _ar2_inflation(d: np.ndarray, var: np.ndarray) -> np.ndarray:
    r1, r2 = _autocorrelation(d, var, 1), _autocorrelation(d, var, 2)
    with np.errstate(invalid="ignore", divide="ignore"):
        den = 1 - r1**2
        phi1, phi2 = r1 * (1 - r2) / den, (r2 - r1**2) / den
        return np.sqrt((1 - r1 * phi1 - r2 * phi2) / (1 - phi1 - phi2) ** 2)


def ewc_terms(n: int) -> int:
    """The number of cosine terms EWC keeps: ⌊0.4 n^⅔⌋, within 1 … n − 1."""
    return int(min(max(1, int(EWC_V0 * n ** (2 / 3))), n - 1))


def _ewc_variance(d: np.ndarray) -> np.ndarray:
    from scipy.fft import dct

    v = ewc_terms(d.shape[0])
    return (dct(d, type=2, axis=0, norm="ortho")[1 : v + 1] ** 2).mean(0)


def _hering_genton_variance(d: np.ndarray) -> np.ndarray:
    """Long-run variance Σₖ a·r^|k| (|k| < n) of the exponential autocovariance a·r^k, r = e^(−3/θ),
    fitted by least squares (a, r ≥ 0) to the sample autocovariances of lags 0 … ⌊(n − 1)/2⌋ − 1.
    For a given r the best a is closed-form; r is found by a grid and golden-section refinement."""
    n = d.shape[0]
    lags = max(int((n - 1) // 2), 1)
    e = d - d.mean(0)
    acv = np.stack([(e[: n - k] * e[k:]).sum(0) / n for k in range(lags)])  # (lags, C)
    k = np.arange(lags)[:, None]

    def fit(r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        basis = r[None] ** k  # (lags, C)
        a = np.maximum((basis * acv).sum(0) / (basis**2).sum(0), 0.0)
        return a, ((a * basis - acv) ** 2).sum(0)

    grid = np.linspace(0.0, 0.999, 64)
    losses = np.stack([fit(np.full(acv.shape[1], r))[1] for r in grid])
    best = np.argmin(losses, axis=0)
    lo, hi = grid[np.maximum(best - 1, 0)], grid[np.minimum(best + 1, grid.size - 1)]
    golden = (np.sqrt(5) - 1) / 2
    for _ in range(40):
        x1, x2 = hi - golden * (hi - lo), lo + golden * (hi - lo)
        left = fit(x1)[1] <= fit(x2)[1]
        hi, lo = np.where(left, x2, hi), np.where(left, lo, x1)
    r = (lo + hi) / 2
    a = fit(r)[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        tail = np.where(r > 0, r * (1 - r ** (n - 1)) / (1 - r), 0.0)
    return a * (1 + 2 * tail)


def t_interval(value: np.ndarray, tangents: np.ndarray, method: str, confidence: float) -> Interval:
    """``iid``, ``ar2``, ``ewc`` or ``dm`` interval of ``value`` from its linearised per-init values
    ``tangents`` ``(n, C)`` (zero-mean)."""
    n = tangents.shape[0]
    if method in ("iid", "ar2"):
        var = _variance(tangents)
        se = np.sqrt(var / n)
        if method == "ar2":
            se = se * _ar2_inflation(tangents, var)
        dof = np.full(se.shape, float(n - 1))
    elif method == "ewc":
        se = np.sqrt(_ewc_variance(tangents) / n)
        dof = np.full(se.shape, float(ewc_terms(n)))
    elif method == "dm":
        se = np.sqrt(_hering_genton_variance(tangents) / n)
        dof = np.full(se.shape, np.inf)
    else:
        raise ValueError(f"unknown interval method {method!r}; choose one of {', '.join(METHODS)}")
    dist = _t_dist(dof)
    half = -dist.ppf((1 - confidence) / 2) * se
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.where((value == 0) & (se == 0), 0.0, value / se)  # 0/0: the null value itself
    p = 2 * (1 - dist.cdf(np.abs(z)))
    return Interval(value, se, value - half, value + half, p, dof)


def block_length(tangents: np.ndarray) -> np.ndarray:
    """The stationary bootstrap's mean block length per cell (Politis & White 2004, corrected by
    Patton, Politis & White 2009), as the ``arch`` package estimates it: the lag window m is twice
    the first lag after which k = max(5, ⌊log₁₀ n⌋) autocorrelations in a row lie within
    ±2√(log₁₀ n / n) (at most ⌈√n⌉ + k), b = (2G²/D)^⅓ n^⅓ with D = 2σ̂⁴, capped at ⌈min(3√n, n/3)⌉;
    then at least 1 and rounded to 30 steps per decade (as WeatherBench-X does)."""
    n, c = tangents.shape
    if n < 8:
        raise ValueError(
            f"the bootstrap's block length needs at least 8 inits, got {n}; score more inits or choose "
            f"--method ar2"
        )
    eps = tangents - tangents.mean(0)
    b_max = np.ceil(min(3 * np.sqrt(n), n / 3))
    kn = max(5, int(np.log10(n)))
    m_max = int(np.ceil(np.sqrt(n))) + kn
    band = 2 * np.sqrt(np.log10(n) / n)
    acv = np.zeros((m_max + 1, c))
    inside = np.zeros((m_max + 1, c), dtype=bool)
    with np.errstate(invalid="ignore", divide="ignore"):
        for i in range(m_max + 1):
            cross = (eps[i:] * eps[: n - i]).sum(0)
            later, earlier = eps[i + 1 :], eps[: max(n - i - 1, 0)]  # arch's normalisers: lag i + 1
            acv[i] = cross / n
            inside[i] = np.abs(cross) / np.sqrt((later**2).sum(0) * (earlier**2).sum(0)) < band
    run = np.concatenate([np.zeros((1, c), int), np.cumsum(inside, axis=0)])  # run[i]: inside[:i] count
    starts = np.arange(kn, m_max + 1)
    quiet = (run[starts] - run[starts - kn]) == kn  # inside[i - kn : i] all true, per i ≥ kn
    found = quiet.any(0)
    opt_m = starts[np.argmax(quiet, axis=0)] - kn
    m = np.minimum(np.where(found, 2 * np.maximum(opt_m, 1), m_max), m_max)
    g = np.zeros(c)
    lr = acv[0].copy()
    for k in range(1, m_max + 1):
        lam = np.where(k / m <= 0.5, 1.0, 2 * (1 - k / m))
        use = k <= m
        g = g + np.where(use, 2 * lam * k * acv[k], 0.0)
        lr = lr + np.where(use, 2 * lam * acv[k], 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        b = np.minimum((2 * g**2 / (2 * lr**2)) ** (1 / 3) * n ** (1 / 3), b_max)
    b = np.where(b >= 1, b, 1.0)  # NaN (a constant series) and values below 1: 1
    return 10 ** (np.round(np.log10(b) * BLOCK_ROUNDING) / BLOCK_ROUNDING)


def stationary_counts(n: int, mean_block: float, replicates: int, rng: np.random.Generator) -> np.ndarray:
    """``(replicates, n)``: how often each init appears in each stationary-bootstrap resample. A
    resample starts at a random init and at each next step jumps to a random init with probability
    1/``mean_block``, else takes the next one (wrapping around the end)."""
    jump = rng.random((replicates, n)) < 1 / mean_block
    jump[:, 0] = True
    starts = rng.integers(n, size=(replicates, n))
    steps = np.arange(n)
    last = np.maximum.accumulate(np.where(jump, steps, 0), axis=1)  # the step of the last jump
    index = (np.take_along_axis(starts, last, axis=1) + steps - last) % n
    flat = (np.arange(replicates)[:, None] * n + index).ravel()
    return np.bincount(flat, minlength=replicates * n).reshape(replicates, n).astype(np.float64)


@functools.lru_cache(maxsize=64)  # about as many rounded block lengths as 730 inits give
def _cached_counts(n: int, mean_block: float, replicates: int, seed: int) -> np.ndarray:
    """``stationary_counts`` of one rounded block length, drawn from ``seed`` and the block length (so
    a cell's resamples do not depend on which other cells are scored), kept for the next cells."""
    rng = np.random.default_rng([seed, round(mean_block * 1e6)])
    return stationary_counts(n, mean_block, replicates, rng).astype(np.uint16)  # 2 bytes a count


def bootstrap(
    series: dict[str, np.ndarray],
    score: Callable[[dict[str, np.ndarray]], np.ndarray],
    tangents: np.ndarray,
    confidence: float,
    replicates: int = 1000,
    seed: int = 0,
) -> Interval:
    """Stationary-bootstrap interval of ``score(means of series)``: ``series`` maps names to ``(n, C)``
    per-init values (the paired series of a comparison resample together), ``tangents`` (``(n, C)``)
    choose each cell's block length. Cells of one rounded block length share their resamples (drawn
    from ``seed`` and the block length, and kept for the next call, as WeatherBench-X keeps them). The
    interval is the percentile interval, the standard error the resampled scores' (ddof 1), the
    p-value of "score = 0" twice the smaller tail (mid-rank at 0: a score of exactly 0 everywhere has
    p = 1)."""
    n, c = tangents.shape
    blocks = block_length(tangents)
    value = score({k: v.mean(0) for k, v in series.items()})
    alpha = 1 - confidence
    se, lower, upper, p = (np.full(c, np.nan) for _ in range(4))
    for b in np.unique(blocks):
        cells = np.nonzero(blocks == b)[0]
        counts = _cached_counts(n, float(b), replicates, seed).astype(np.float64)
        names = list(series)
        stacked = np.concatenate([series[k][:, cells] for k in names], axis=1)  # (n, names × cells)
        means = np.split(counts @ stacked / n, len(names), axis=1)
        resampled = score(dict(zip(names, means)))  # (B, cells)
        se[cells] = resampled.std(0, ddof=1)
        lower[cells], upper[cells] = np.quantile(resampled, [alpha / 2, 1 - alpha / 2], axis=0)
        below = (resampled < 0).mean(0) + 0.5 * (resampled == 0).mean(0)
        p[cells] = np.minimum(1.0, 2 * np.minimum(below, 1 - below))
    nan = np.isnan(value)
    for a in (se, lower, upper, p):
        a[nan] = np.nan
    return Interval(value, se, lower, upper, p, np.full(c, np.nan))
