"""The ensemble losses against independent numpy formulas (single process; the same losses with
members and tiles over ranks are checked in ``test_ensemble_train.py``)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from jigsaw_earth.training.crps import crps_alpha, ensemble_crps, ensemble_loss

M, B, C, H, W = 4, 2, 3, 5, 7


def _case(members: int = M, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    pred = torch.randn(members, B, C, H, W, generator=g, dtype=torch.float64)
    target = torch.randn(B, C, H, W, generator=g, dtype=torch.float64)
    lat_w = torch.rand(H, generator=g, dtype=torch.float64) + 0.5
    ch_w = torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64)
    return pred, target, lat_w, ch_w


def _numpy_crps(x: np.ndarray, y: np.ndarray, alpha: float) -> np.ndarray:
    """anemoi's double-sum form, written out member pair by member pair (x: (M, ...))."""
    m = x.shape[0]
    if m == 1:
        return np.abs(x[0] - y)
    eps = (1 - alpha) / m
    total = np.zeros_like(y)
    for j, k in itertools.permutations(range(m), 2):
        total += np.abs(x[j] - y) + np.abs(x[k] - y) - (1 - eps) * np.abs(x[j] - x[k])
    return total / (2 * m * (m - 1))


def _weighted(point: np.ndarray, lat_w, ch_w) -> float:
    return float((point * ch_w.numpy()[:, None, None] * lat_w.numpy()[:, None]).sum())


@pytest.mark.parametrize("alpha", [0.0, 0.95, 1.0])
def test_crps_matches_numpy(alpha):
    pred, target, lat_w, ch_w = _case()
    got = ensemble_crps(pred, target, lat_w, ch_w, alpha=alpha)
    want = _weighted(_numpy_crps(pred.numpy(), target.numpy(), alpha), lat_w, ch_w)
    assert got.item() == pytest.approx(want, rel=1e-6)


def test_plain_crps_is_the_empirical_distributions_crps():
    """α = 0: ∫ (F_ens(z) − 1{z ≥ y})² dz of the empirical distribution, integrated exactly."""
    x = np.array([0.3, -1.2, 2.0, 0.7])
    y = 0.1
    knots = np.sort(np.append(x, y))
    integral = 0.0
    for a, b in itertools.pairwise(knots):
        mid = 0.5 * (a + b)
        integral += (b - a) * ((x <= mid).mean() - float(mid >= y)) ** 2
    one = torch.ones(1, dtype=torch.float64)
    got = ensemble_crps(torch.tensor(x).view(4, 1, 1, 1, 1), torch.tensor([[[[y]]]]), one, one, alpha=0.0)
    assert got.item() == pytest.approx(integral, rel=1e-6)


def test_fair_crps_is_unbiased():
    """E[fair CRPS of M draws] is the CRPS of the distribution, for any M (here N(0,1) vs y = 0)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 200_000, 1, 1, 1, generator=g, dtype=torch.float64)
    one = torch.ones(1, dtype=torch.float64)
    fair = ensemble_crps(x, torch.zeros(200_000, 1, 1, 1, dtype=torch.float64), one, one, alpha=1.0)
    exact = np.sqrt(2 / np.pi) - 1 / np.sqrt(np.pi)  # CRPS(N(0,1), 0)
    assert fair.item() / 200_000 == pytest.approx(exact, abs=5e-3)


def test_one_member_is_the_absolute_error_and_mse_mix():
    pred, target, lat_w, ch_w = _case(members=1)
    for alpha in (0.0, 1.0):
        got = ensemble_crps(pred, target, lat_w, ch_w, alpha=alpha, mse_weight=0.5)
        err = (pred[0] - target).numpy()
        want = _weighted(np.abs(err) + 0.5 * err**2, lat_w, ch_w)
        assert got.item() == pytest.approx(want, rel=1e-6)


def test_gradient_equals_the_full_formulas():
    pred, target, lat_w, ch_w = _case()
    a = pred.clone().requires_grad_(True)
    ensemble_crps(a, target, lat_w, ch_w, alpha=0.95, mse_weight=0.3).backward()
    b = pred.clone().requires_grad_(True)
    eps = 0.05 / M
    pairs = sum((b[j] - b[k]).abs() for j, k in itertools.permutations(range(M), 2))
    point = (b - target).abs().mean(0) - (1 - eps) / (2 * M * (M - 1)) * pairs
    point = point + 0.3 * (b - target).square().mean(0)
    (point * ch_w.view(-1, 1, 1) * lat_w.view(-1, 1)).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12)


def test_bad_shapes_and_alpha():
    pred, target, lat_w, ch_w = _case()
    with pytest.raises(ValueError, match="members"):
        ensemble_crps(pred[0], target, lat_w, ch_w, alpha=1.0)
    with pytest.raises(ValueError, match="alpha"):
        ensemble_crps(pred, target, lat_w, ch_w, alpha=1.5)
    assert crps_alpha("fair_crps", 0.3) == 1.0 and crps_alpha("almost_fair_crps", 0.3) == 0.3


def test_members_split_over_calls_add_up():
    """The local-term convention: two halves of the members, each seeing all members (as the
    ensemble axis's gather gives them), sum to the loss, and their input gradients are the loss's."""
    pred, target, lat_w, ch_w = _case()
    full = pred.clone().requires_grad_(True)
    whole = ensemble_crps(full, target, lat_w, ch_w, alpha=0.95, mse_weight=0.2)
    whole.backward()
    halves = [pred[:2].clone().requires_grad_(True), pred[2:].clone().requires_grad_(True)]

    class _Axis:  # both halves on one process: the "gather" is the fixed full ensemble
        size = 2

    import jigsaw_earth.training.crps as crps

    original = crps.gather_members
    crps.gather_members = lambda local, members: pred if members is not None else local.detach()
    try:
        parts = [
            ensemble_crps(h, target, lat_w, ch_w, alpha=0.95, mse_weight=0.2, members=_Axis()) for h in halves
        ]
    finally:
        crps.gather_members = original
    sum(parts).backward()
    assert sum(p.item() for p in parts) == pytest.approx(whole.item(), rel=1e-10)
    torch.testing.assert_close(torch.cat([h.grad for h in halves]), full.grad, rtol=1e-10, atol=1e-12)


def test_loss_kinds():
    pred, target, lat_w, ch_w = _case()
    mse = ensemble_loss("mse", pred, target, lat_w, ch_w, n_members=M)
    want = _weighted(((pred - target) ** 2).mean(0).numpy(), lat_w, ch_w)
    assert mse.item() == pytest.approx(want, rel=1e-6)
    for kind, alpha in (("crps", 0.0), ("fair_crps", 1.0), ("almost_fair_crps", 0.9)):
        got = ensemble_loss(kind, pred, target, lat_w, ch_w, n_members=M, alpha=0.9)
        want = _weighted(_numpy_crps(pred.numpy(), target.numpy(), alpha), lat_w, ch_w)
        assert got.item() == pytest.approx(want, rel=1e-6), kind
    with pytest.raises(ValueError, match="the ensemble has 8"):
        ensemble_loss("fair_crps", pred, target, lat_w, ch_w, n_members=8)
