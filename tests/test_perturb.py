"""The perturbations of ``predict --perturb`` without a model: the sphere's random fields (Legendre
functions, the requested correlation and variance, exact on tiles), which draw each member takes, and
the one-line refusals of requests that cannot be made."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import sph_harm_y

from jigsaw_earth.distributed.tiles import TileGrid
from jigsaw_earth.inference.perturb import Perturbation, check_history, check_perturbation
from jigsaw_earth.sphere import column_longitudes, row_latitudes
from jigsaw_earth.sphere_field import (
    EARTH_RADIUS_KM,
    TileField,
    angular_spectrum,
    coefficients,
    correlation,
    degree_cutoff,
    legendre_table,
)


def test_legendre_functions_are_the_orthonormal_ones() -> None:
    lat = np.deg2rad(np.array([89.9, 60.0, 12.5, 0.0, -33.0, -90.0]))
    q = legendre_table(lat, 16)
    for ell, m in [(0, 0), (1, 0), (1, 1), (5, 3), (12, 12), (16, 7)]:
        y = sph_harm_y(ell, m, np.pi / 2 - lat, 0.0).real * (math.sqrt(2) if m else 1)
        np.testing.assert_allclose(np.abs(q[m, ell]), np.abs(y), rtol=1e-10, atol=1e-12)
    # the addition theorem: Σ_m of the real harmonics' squares is (2l + 1)/(4π) at every latitude
    np.testing.assert_allclose((q**2).sum(0), ((2 * np.arange(17) + 1) / (4 * np.pi))[:, None] + 0 * lat)
    assert not q[5, :5].any()  # zero where l < m


def _sample_fields(length_km: float, n_lat: int, n_lon: int, draws: int) -> np.ndarray:
    l_max = degree_cutoff(length_km, n_lat, n_lon)
    spectrum = angular_spectrum(length_km, l_max)
    lat, lon = row_latitudes(n_lat, centred=True), column_longitudes(n_lon)
    field = TileField(spectrum, lat, lon)
    coef = coefficients(7, "test/correlated", torch.arange(draws), 1, l_max)
    return field.evaluate(coef)[:, 0].double().numpy()


def test_correlated_noise_has_the_requested_correlation_and_variance() -> None:
    """Measured over 200 fields on a 48 × 96 grid: the variance is 1 on every row (poles included) and
    the correlation at distance is the requested spectrum's — ≈ exp(−d²/2L²), 0.61 at the length
    scale L — within 10 %, along parallels and along meridians."""
    length, n_lat, n_lon = 1500.0, 48, 96
    f = _sample_fields(length, n_lat, n_lon, 200)
    lat = row_latitudes(n_lat, centred=True)
    var_rows = (f**2).mean(axis=(0, 2))
    assert np.abs(var_rows - 1).max() < 0.1, var_rows
    spectrum = angular_spectrum(length, degree_cutoff(length, n_lat, n_lon))
    sigma = length / EARTH_RADIUS_KM
    for lags in (1, 2, 3, 4):  # along the parallels of |lat| < 40°, and along meridians
        rows = np.nonzero(np.abs(lat) < np.deg2rad(40))[0]
        dlon = 2 * np.pi * lags / n_lon
        for i in rows[:: max(1, len(rows) // 4)]:
            gamma = np.arccos(np.sin(lat[i]) ** 2 + np.cos(lat[i]) ** 2 * np.cos(dlon))
            measured = (f[:, i] * np.roll(f[:, i], -lags, axis=-1)).mean()
            want = correlation(np.array([gamma]), spectrum)[0]
            assert abs(measured - want) < 0.1 * max(want, 0.1), (lags, i, measured, want)
        gamma = np.pi * lags / n_lat  # rows lags apart on one meridian
        measured = (f[:, 10 : 38 - lags] * f[:, 10 + lags : 38]).mean()
        want = correlation(np.array([gamma]), spectrum)[0]
        assert abs(measured - want) < 0.1 * max(want, 0.1), (lags, measured, want)
    at_scale = correlation(np.array([sigma]), spectrum)[0]
    assert abs(at_scale - math.exp(-0.5)) < 0.1 * math.exp(-0.5), at_scale


def test_a_tile_evaluates_its_part_of_the_global_field_exactly() -> None:
    n_lat, n_lon, length = 13, 24, 2500.0  # odd rows: uneven tiles, both poles on the grid
    l_max = degree_cutoff(length, n_lat, n_lon)
    spectrum = angular_spectrum(length, l_max)
    lat, lon = row_latitudes(n_lat), column_longitudes(n_lon)
    coef = coefficients(3, "test/tiles", torch.tensor([438_000, 438_012]), 2, l_max)
    whole = TileField(spectrum, lat, lon).evaluate(coef)
    grid = TileGrid(n_lat, n_lon, 3, 5)
    for tile in grid.tiles():
        rows, cols = tile.slices
        part = TileField(spectrum, lat[rows], lon[cols]).evaluate(coef)
        torch.testing.assert_close(part, whole[..., rows, cols], rtol=1e-6, atol=1e-7)


def test_member_draws_pairs_control_and_lags() -> None:
    plain = Perturbation("gaussian", 0.1)
    assert [plain.draw(m) for m in range(3)] == [(0, 1.0), (1, 1.0), (2, 1.0)]
    both = Perturbation("bred", 0.1, pairs=True, control=True)
    assert [both.draw(m) for m in range(6)] == [None, (0, 1.0), (0, -1.0), (1, 1.0), (1, -1.0), (2, 1.0)]
    lagged = Perturbation("lagged", 1.0)
    assert [lagged.draw(m) for m in range(3)] == [None, (1, 1.0), (2, 1.0)]
    assert Perturbation("bred", 2.0).describe()["scale"] == "tendency"
    assert lagged.describe() == {"scheme": "lagged", "amplitude": 1.0, "pairs": False, "control": False,
                                 "lag_hours": 0}  # fmt: skip


@pytest.mark.parametrize(
    ("p", "total", "first", "init", "words"),
    [
        (Perturbation("gaussian", -0.1), 4, 0, False, "--amplitude -0.1: must be positive"),
        (Perturbation("gaussian", 0.1, scale="var"), 4, 0, False, "--scale 'var': choose tendency or std"),
        (Perturbation("correlated", float("nan")), 4, 0, False, "--amplitude nan: must be positive"),
        (Perturbation("bred", 0.1), 4, 0, True, "--perturb bred makes its members from data.store's earlier"),
        (Perturbation("lagged", 1.0), 4, 0, True, "--perturb lagged makes its members from data.store's"),
        (Perturbation("lagged", 1.0, pairs=True), 4, 0, False, "--pairs: a lagged member is an earlier"),
        (Perturbation("gaussian", 0.1, pairs=True), 3, 0, False, "--members 3 --first-member 0 would split"),
        (Perturbation("gaussian", 0.1, pairs=True), 2, 1, False, "--members 2 --first-member 1 would split"),
        (Perturbation("gaussian", 0.1, pairs=True, control=True), 4, 0, False, "e.g. --members 5"),
        (Perturbation("bred", 0.1, bred_cycle_hours=9), 4, 0, False, "--bred-cycle-hours 9: must be a"),
        (Perturbation("bred", 0.1, bred_cycles=0), 4, 0, False, "--bred-cycles 0: give at least 1"),
        (Perturbation("lagged", 1.0, lag_hours=-6), 4, 0, False, "--lag-hours -6: must be a positive"),
    ],
)
def test_requests_that_cannot_be_made_are_refused(p, total, first, init, words) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(")) as err:
        check_perturbation(p.with_defaults(6), total, first, 6, init)
    assert "\n" not in str(err.value)


def test_earlier_analyses_a_member_needs_must_be_in_the_store() -> None:
    times = np.arange(np.datetime64("2020-01-01T00"), np.datetime64("2020-01-05T00"), np.timedelta64(6, "h"))
    inits = np.array([4, 8])  # 2020-01-02T00 and 2020-01-03T00
    check_history(Perturbation("lagged", 1.0, lag_hours=6), range(0, 5), times, inits)
    with pytest.raises(ValueError, match=r"member 5 is the forecast from 5 × 6 h before init 2020-01-02T00"):
        check_history(Perturbation("lagged", 1.0, lag_hours=6), range(3, 6), times, inits)
    with pytest.raises(ValueError, match=r"--first-init 2020-01-02T06 or after"):
        check_history(Perturbation("bred", 0.1, bred_cycles=5, bred_cycle_hours=6), range(2), times, inits)
    with pytest.raises(ValueError, match=r"--length-scale 300 km is finer than the 32x64 grid resolves"):
        degree_cutoff(300.0, 32, 64)
