"""How often each interval method's 95 % interval covers the true mean of autocorrelated series.

For AR(1) and AR(2) series of known mean (lag-1 autocorrelation up to 0.7), 2,000 series of N inits
each: the share of the 95 % intervals (``jigsaw-earth score --method``) that contain the true mean.
The tables of docs/metrics.md ("Which method", "How many inits") are this script's output:

    python scripts/interval_coverage.py --inits 400 100
    python scripts/interval_coverage.py --inits 50 30 10 5

(a method is asked on the inits it is asked on: ``score`` itself falls back to ``ewc`` below
``significance.MIN_INITS``; the bootstrap cannot run on fewer than 8: "–").
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy.signal import lfilter

from jigsaw_earth.metrics.delta import SCORES, estimate
from jigsaw_earth.metrics.intervals import METHODS

CASES = {  # name -> AR coefficients
    "independent": (0.0,),
    "AR(1) rho1 0.3": (0.3,),
    "AR(1) rho1 0.7": (0.7,),
    "AR(2) rho1 0.7": (0.9, -2 / 7),
}


def coverage(n: int, phis: tuple[float, ...], replicates: int, seed: int) -> dict[str, float]:
    e = np.random.default_rng(seed).standard_normal((n + 300, replicates))
    x = lfilter([1.0], [1.0, *(-p for p in phis)], e, axis=0)[300:] + 5.0
    out = {}
    for method in METHODS:
        if method == "bootstrap" and n < 8:
            out[method] = float("nan")
            continue
        iv = estimate(SCORES["bias"], {"e": x}, method, 0.95)
        out[method] = float(np.mean((iv.lower <= 5.0) & (iv.upper >= 5.0)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inits", type=int, nargs="+", default=[400, 100])
    p.add_argument("--replicates", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    print("| inits | series | " + " | ".join(METHODS) + " |")
    print("|---|---|" + "---|" * len(METHODS))
    for n in args.inits:
        for name, phis in CASES.items():
            got = coverage(n, phis, args.replicates, args.seed)
            cells = ["–" if np.isnan(got[m]) else f"{100 * got[m]:.1f} %" for m in METHODS]
            print(f"| {n} | {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
