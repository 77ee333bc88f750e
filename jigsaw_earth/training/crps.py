"""Ensemble losses per grid point with the MSE loss's latitude and channel weights, exact when the
members are spread over the ranks of an ensemble axis.

For ``M`` members ``x_1 … x_M`` and the truth ``y`` at one grid point, the almost-fair CRPS of
anemoi (Lang et al. 2024, AIFS-CRPS) with ``ε = (1 − α) / M`` is

    CRPS_α = 1/M Σ_i |x_i − y|  −  (1 − ε) / (2 M (M − 1)) · Σ_{i≠j} |x_i − x_j|

``α = 1`` is the fair (unbiased) CRPS of Zamo & Naveau (2018), the estimator WeatherBench 2 scores
with; ``α = 0`` is the plain ensemble CRPS ``E|X − y| − ½ E|X − X′|`` of the empirical
distribution. With one member the spread term is zero (as WB2 has it) and every form is the
absolute error. ``mse_weight`` adds that multiple of the members' mean squared error; the kind
``mse`` is that mean squared error alone. The trainer divides by the global count as for MSE.

Members may be batched on one rank (``pred`` is ``(m, B, C, h, w)``) and/or spread over the
ranks of an ensemble axis (every rank holds ``m`` of them). The other ranks' members are gathered
detached (``collectives.all_gather``, no backward), and each rank's term is its own members' share

    Σ_{i local} [ |x_i − y| / M  −  c · S_i ],   S_i = Σ_j |x_i − x_j|  (value),
                                                 ∂S_i/∂x_i = 2 Σ_j sign(x_i − x_j)  (gradient)

(``c`` the spread coefficient; each pair appears in two members' shares, hence the 2). Summed
over the ensemble axis the values give the loss and the gradients are exactly ``∂ loss / ∂ x_i``,
so the local-term convention of ``loss.py`` holds unchanged. ``S_i`` and its slope are computed
without autograd, one member at a time: no ``M × m`` fields are kept for the backward.
"""

from __future__ import annotations

import torch

from ..distributed.collectives import all_gather
from ..distributed.mesh import Axis

__all__ = [
    "LOSS_KINDS",
    "crps_alpha",
    "ensemble_crps",
    "ensemble_loss",
    "gather_members",
    "spread_coefficient",
]

# α of each CRPS loss kind; ``almost_fair_crps`` takes ``loss.alpha``
LOSS_ALPHA = {"crps": 0.0, "fair_crps": 1.0}
LOSS_KINDS = ("mse", "crps", "fair_crps", "almost_fair_crps")


def crps_alpha(kind: str, alpha: float) -> float:
    """α of the loss ``kind`` (``crps``, ``fair_crps`` or ``almost_fair_crps`` with ``alpha``)."""
    if kind == "almost_fair_crps":
        return float(alpha)
    if kind not in LOSS_ALPHA:
        raise ValueError(f"loss kind {kind!r} is no CRPS; use crps, fair_crps or almost_fair_crps")
    return LOSS_ALPHA[kind]


def spread_coefficient(members: int, alpha: float) -> float:
    """``(1 − ε) / (2 M (M − 1))`` with ``ε = (1 − α) / M``; 0 for one member."""
    if members < 2:
        return 0.0
    eps = (1.0 - alpha) / members
    return (1.0 - eps) / (2.0 * members * (members - 1))


def gather_members(local: torch.Tensor, members: Axis | None) -> torch.Tensor:
    """Every rank's members ``(M, …)`` along the ensemble axis, in axis order, detached."""
    local = local.detach()
    if members is None or members.size == 1:
        return local
    return all_gather(local.contiguous(), members, dim=0, sizes=[local.shape[0]] * members.size)


def _check(pred: torch.Tensor, target: torch.Tensor) -> None:
    if pred.dim() != 5 or pred.shape[1:] != target.shape:
        raise ValueError(
            f"ensemble prediction {tuple(pred.shape)} must be (members, *target shape) with target "
            f"{tuple(target.shape)}"
        )


def ensemble_crps(
    pred: torch.Tensor,
    target: torch.Tensor,
    lat_weights: torch.Tensor,
    ch_weights: torch.Tensor,
    *,
    alpha: float,
    members: Axis | None = None,
    mse_weight: float = 0.0,
) -> torch.Tensor:
    """This rank's share of ``Σ w_lat · w_c · (CRPS_α + mse_weight · mean_i (x_i − y)²)`` (float32,
    or float64 for float64 inputs).

    ``pred`` is ``(m, B, C, h, w)``: this rank's ``m`` members; ``target`` ``(B, C, h, w)``;
    ``lat_weights`` the tile's rows ``(h,)`` of the global weights; ``ch_weights`` ``(C,)``;
    ``members`` the ensemble axis the other members live on (``None``: all members are here).
    """
    _check(pred, target)
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"CRPS alpha={alpha} is outside [0, 1]; use 1 for fair CRPS, 0.95 as anemoi")
    dtype = torch.promote_types(pred.dtype, torch.float32)  # bf16 is computed in float32, float64 kept
    x, y = pred.to(dtype), target.to(dtype)
    every = gather_members(x, members)
    n_all = every.shape[0]
    point = (x - y).abs().sum(0) / n_all
    if mse_weight:
        point = point + mse_weight * (x - y).square().sum(0) / n_all
    coef = spread_coefficient(n_all, alpha)
    if coef:
        with torch.no_grad():
            spread, slope = torch.zeros_like(x), torch.zeros_like(x)
            for xj in every:  # one member at a time: memory of 2 m fields, not M · m
                d = x - xj
                spread += d.abs()
                slope += d.sign()
        # value S_i (the detached spread), gradient 2 Σ_j sign(x_i − x_j): the product terms cancel exactly
        pairs = spread + 2.0 * (x * slope - (x * slope).detach())
        point = point - coef * pairs.sum(0)
    w = ch_weights.view(-1, 1, 1) * lat_weights.view(1, -1, 1)
    return (point * w).sum()


def ensemble_loss(
    kind: str,
    pred: torch.Tensor,
    target: torch.Tensor,
    lat_weights: torch.Tensor,
    ch_weights: torch.Tensor,
    *,
    n_members: int,
    alpha: float = 1.0,
    mse_weight: float = 0.0,
    members: Axis | None = None,
) -> torch.Tensor:
    """This rank's share of the loss ``kind`` (``LOSS_KINDS``) over ``n_members`` members in all.

    ``mse``: ``Σ w · mean_i (x_i − y)²`` (no communication); the CRPS kinds: ``ensemble_crps``.
    """
    _check(pred, target)
    here = pred.shape[0] * (members.size if members is not None else 1)
    if here != n_members:
        raise ValueError(
            f"{pred.shape[0]} members on this rank x {here // pred.shape[0]} on the ensemble axis = {here}, "
            f"but the ensemble has {n_members}; batch training.members / mesh.ensemble per rank"
        )
    if kind == "mse":
        dtype = torch.promote_types(pred.dtype, torch.float32)
        err = (pred.to(dtype) - target.to(dtype)).square().sum(0) / n_members
        return (err * ch_weights.view(-1, 1, 1) * lat_weights.view(1, -1, 1)).sum()
    alpha = crps_alpha(kind, alpha)
    return ensemble_crps(
        pred, target, lat_weights, ch_weights, alpha=alpha, members=members, mse_weight=mse_weight
    )
