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
  Politis & White (2004, with Patton et al.'s 2009 correction) from the tangents; studentized by the
  ar2 standard error of each resample (bootstrap-t).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = [
    "METHODS",
    "Interval",
    "block_length",
    "bootstrap",
    "stationary_indices",
    "t_interval",
]

METHODS = ("ar2", "ewc", "iid", "dm", "bootstrap")
EWC_V0 = 0.4  # Lazarus et al.'s recommended constant
BLOCK_ROUNDING = 30  # block lengths rounded to 30 steps per decade (as WeatherBench-X caches them)


@dataclass(frozen=True)
class Interval:
    """A score's estimate, standard error, interval bounds and two-sided p-value of "value = 0" (all
    ``(C,)``); ``dof``: the t distribution's degrees of freedom (inf: normal; NaN: bootstrap, whose
    quantiles are resampled)."""

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


def stationary_indices(n: int, mean_block: float, replicates: int, rng: np.random.Generator) -> np.ndarray:
    """``(replicates, n)``: the inits of each stationary-bootstrap resample, in order. A resample starts
    at a random init and at each next step jumps to a random init with probability 1/``mean_block``,
    else takes the next one (wrapping around the end)."""
    jump = rng.random((replicates, n)) < 1 / mean_block
    jump[:, 0] = True
    starts = rng.integers(n, size=(replicates, n))
    steps = np.arange(n)
    last = np.maximum.accumulate(np.where(jump, steps, 0), axis=1)  # the step of the last jump
    return (np.take_along_axis(starts, last, axis=1) + steps - last) % n


@functools.lru_cache(maxsize=64)  # about as many rounded block lengths as 730 inits give
def _cached_resamples(n: int, mean_block: float, replicates: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The resamples of one rounded block length (``stationary_indices``) and how often each init
    appears in each, drawn from ``seed`` and the block length (so a cell's resamples do not depend on
    which other cells are scored), kept for the next cells."""
    rng = np.random.default_rng([seed, round(mean_block * 1e6)])
    index = stationary_indices(n, mean_block, replicates, rng)
    flat = (np.arange(replicates)[:, None] * n + index).ravel()
    counts = np.bincount(flat, minlength=replicates * n).reshape(replicates, n)
    return index.astype(np.int32), counts.astype(np.uint16)  # 2 bytes a count


def _ar2_se(d: np.ndarray) -> np.ndarray:
    """The ar2 standard error of the mean of each column of ``d`` ``(n, C)`` (any mean)."""
    d = d - d.mean(0)
    var = _variance(d)
    return np.sqrt(var / d.shape[0]) * _ar2_inflation(d, var)


def _resampled_se(tangents: np.ndarray, index: np.ndarray, chunk_bytes: int = 64 << 20) -> np.ndarray:
    """``(B, C)``: the ar2 standard error of each resample's tangents (``index`` ``(B, n)``), cells
    in chunks of about ``chunk_bytes``."""
    replicates, n = index.shape
    out = np.empty((replicates, tangents.shape[1]))
    step = max(1, chunk_bytes // (8 * replicates * n))
    for first in range(0, tangents.shape[1], step):
        cells = slice(first, first + step)
        drawn = tangents[:, cells][index.T]  # (n, B, cells): each resample in init order
        out[:, cells] = _ar2_se(drawn.reshape(n, -1)).reshape(replicates, -1)
    return out


def bootstrap(
    series: dict[str, np.ndarray],
    score: Callable[[dict[str, np.ndarray]], np.ndarray],
    tangents: np.ndarray,
    confidence: float,
    replicates: int = 1000,
    seed: int = 0,
) -> Interval:
    """Studentized stationary-bootstrap interval of ``score(means of series)``: ``series`` maps names
    to ``(n, C)`` per-init values (the paired series of a comparison resample together), ``tangents``
    (``(n, C)``) choose each cell's block length and studentize. Each resample gives the pivot
    t* = (score* − score) / se*, se* the ar2 standard error of the resample's tangents; the interval
    is score − q*(1 − α/2)·se … score − q*(α/2)·se with se the ar2 standard error of the tangents
    (reported as the standard error), the p-value of "score = 0" twice the smaller tail of t* beyond
    score/se. The pivot's quantiles carry what the resamples' variance misses where the blocks cut
    the autocorrelation (the percentile interval covers 89 % at rho1 0.7, this one 93 %). Cells of one
    rounded block length share their resamples (drawn from ``seed`` and the block length, and kept
    for the next call, as WeatherBench-X keeps them)."""
    n, c = tangents.shape
    blocks = block_length(tangents)
    value = score({k: v.mean(0) for k, v in series.items()})
    se = _ar2_se(tangents)
    alpha = 1 - confidence
    with np.errstate(invalid="ignore", divide="ignore"):
        observed = np.where((value == 0) & (se == 0), 0.0, value / se)
    q_low, q_high, p = (np.full(c, np.nan) for _ in range(3))
    names = list(series)
    for b in np.unique(blocks):
        cells = np.nonzero(blocks == b)[0]
        index, counts = _cached_resamples(n, float(b), replicates, seed)
        stacked = np.concatenate([series[k][:, cells] for k in names], axis=1)  # (n, names × cells)
        means = np.split(counts.astype(np.float64) @ stacked / n, len(names), axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            spread = _resampled_se(tangents[:, cells], index)
            pivots = (score(dict(zip(names, means))) - value[cells]) / spread
        pivots[~np.isfinite(pivots)] = np.nan  # a resample without spread says nothing of the pivot
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN cells: constant series
            q_low[cells], q_high[cells] = np.nanquantile(pivots, [alpha / 2, 1 - alpha / 2], axis=0)
            valid = np.isfinite(pivots).sum(0)
            ref = observed[cells]
            below = ((pivots < ref).sum(0) + 0.5 * (pivots == ref).sum(0)) / valid
        p[cells] = np.minimum(1.0, 2 * np.minimum(below, 1 - below))
    flat = se == 0  # no spread at all: the value is exact
    q_low[flat], q_high[flat] = 0.0, 0.0
    p[flat] = np.where(value[flat] == 0, 1.0, 0.0)
    lower, upper = value - q_high * se, value - q_low * se
    nan = np.isnan(value)
    for a in (se, lower, upper, p):
        a[nan] = np.nan
    return Interval(value, se, lower, upper, p, np.full(c, np.nan))
