"""WeatherBench 2's ensemble scores: the pointwise terms and their time means, defined once.

Both scorers use these: ``engine.score_variable`` (``score`` of a store with a member dimension)
and ``MetricAccumulator`` (``predict --score`` on every rank's tile). WB2 (``weatherbench2/metrics.py``
and ``visualization.py``, google-research/weatherbench2) defines, for members X₁…X_M and truth Y:

* ``crps_skill`` = E|X − Y|: the mean over members of |Xₘ − Y| (``CRPSSkill``);
* ``crps_spread`` = E|X − X′|, the fair (unbiased) estimator Σᵢⱼ |Xᵢ − Xⱼ| / (M(M − 1)), computed in
  O(M log M) from the sorted members as 2 Σᵢ (2i − M − 1) X₍ᵢ₎ / (M(M − 1)) (``CRPSSpread``, after
  Zamo & Naveau 2018); 0 for one member;
* ``crps`` = skill − spread / 2 (``CRPS``): with one member it is the MAE;
* ensemble variance: the unbiased (ddof = 1) variance over members, 0 for one member
  (``EnsembleVariance``);
* the ensemble mean's squared error (``EnsembleMeanMSE``).

Each is spatially averaged per (init, lead) with the latitude weights of the region (by the
caller) and then averaged over inits (NaN propagates: WB2's ``skipna=False``). The time means give
``ensemble_stddev = sqrt(mean variance)`` and ``ensemble_mean_rmse = sqrt(mean MSE)`` — the square
root after the time mean, as RMSE — and ``spread_skill = ensemble_stddev / ensemble_mean_rmse``
(WB2's ``compute_spread_skill_ratio``; NaN at lead 0, where WB2 leaves it out).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["ENSEMBLE_METRICS", "POINTWISE", "ensemble_mean", "pointwise", "time_means"]

POINTWISE = ("crps_skill", "crps_spread", "ensemble_variance")  # the per-point terms, in this order
ENSEMBLE_METRICS = ("crps", "crps_skill", "crps_spread", "ensemble_stddev", "spread_skill")


def ensemble_mean(members: torch.Tensor, dim: int) -> torch.Tensor:
    """The mean over members (a NaN member makes the mean NaN)."""
    return members.mean(dim)


def pointwise(members: torch.Tensor, truth: torch.Tensor, dim: int) -> dict[str, torch.Tensor]:
    """``POINTWISE`` terms at every point: ``members`` has the member axis at ``dim``; ``truth`` the
    same shape without it. One member: spread and variance are 0 (WB2's ``zeros_like``)."""
    m = members.shape[dim]
    skill = (members - truth.unsqueeze(dim)).abs().mean(dim)
    if m < 2:
        zero = torch.zeros_like(skill)
        return {"crps_skill": skill, "crps_spread": zero, "ensemble_variance": zero}
    ranked = members.sort(dim).values  # NaN sorts last and keeps the sums NaN
    shape = [1] * members.dim()
    shape[dim] = m
    coef = (2 * torch.arange(1, m + 1, dtype=members.dtype, device=members.device) - m - 1).view(shape)
    spread = 2 * (coef * ranked).sum(dim) / (m * (m - 1))
    return {"crps_skill": skill, "crps_spread": spread, "ensemble_variance": members.var(dim, correction=1)}


def time_means(means: dict[str, Any], ensemble_mean_mse: Any) -> dict[str, Any]:
    """``ENSEMBLE_METRICS`` from the time means of the spatially averaged ``POINTWISE`` terms and of
    the ensemble mean's MSE (numpy arrays or tensors of one shape)."""
    stddev = means["ensemble_variance"] ** 0.5
    return {
        "crps": means["crps_skill"] - 0.5 * means["crps_spread"],
        "crps_skill": means["crps_skill"],
        "crps_spread": means["crps_spread"],
        "ensemble_stddev": stddev,
        "spread_skill": stddev / ensemble_mean_mse**0.5,
    }
