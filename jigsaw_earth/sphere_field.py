"""Gaussian random fields on the sphere, evaluated exactly on any tile without gathering the globe.

A field is a sum of real spherical harmonics with random coefficients:

    f(φ, λ) = Σ_{l ≤ L} Σ_{m ≤ l} √C_l · q_lm(sin φ) · (a_lm cos mλ + b_lm sin mλ)

``q_lm`` the orthonormal associated Legendre functions (``√2`` folded in for ``m > 0``, so the real
harmonics are orthonormal on the unit sphere), ``a_lm``, ``b_lm`` standard normal (``b_l0`` unused).
The **angular power spectrum** is Gaussian in the degree,

    C_l ∝ exp(−l (l + 1) σ² / 2),   σ = length scale / 6371 km,

scaled so the field's variance is 1 at every point (``Σ (2l + 1)/(4π) C_l = 1``): the heat kernel of
the sphere, whose correlation at great-circle angle γ, ``ρ(γ) = Σ (2l + 1)/(4π) C_l P_l(cos γ)``
(``correlation``), is ≈ ``exp(−γ² / (2σ²))``: 0.61 at one length scale. The sum stops at
``L = degree_cutoff(...)``: where ``C_l`` has fallen below ``e⁻⁴⁰`` of ``C_0``, or at the grid's
resolvable degree (``min(n_lat − 1, n_lon / 2)``) if that comes first.

On a tile, ``TileField`` holds ``q_lm`` at the tile's latitudes and ``cos mλ``, ``sin mλ`` at its
longitudes; the coefficients are the same on every rank (drawn by the counter-based generator from
their ``(l, m)`` index, ``coefficients``), so each rank evaluates exactly its rows and columns of one
global field, whatever the mesh: no exchange.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .layers.base import normal_at

__all__ = [
    "EARTH_RADIUS_KM",
    "TileField",
    "angular_spectrum",
    "coefficients",
    "correlation",
    "degree_cutoff",
    "legendre_table",
]

EARTH_RADIUS_KM = 6371.0
TAIL = 40.0  # degrees whose C_l is below exp(-TAIL) of C_0 are left out
LOST_VARIANCE = 0.01  # a grid that cannot hold this share of the field's variance is too coarse


def _sigma(length_scale_km: float) -> float:
    return float(length_scale_km) / EARTH_RADIUS_KM


def _raw_spectrum(length_scale_km: float, l_max: int) -> np.ndarray:
    ell = np.arange(l_max + 1, dtype=np.float64)
    return np.exp(-ell * (ell + 1) * _sigma(length_scale_km) ** 2 / 2)


def degree_cutoff(length_scale_km: float, n_lat: int, n_lon: int) -> int:
    """The highest degree of a field of this length scale on an ``n_lat × n_lon`` grid; a clear error
    when the grid cannot resolve the length scale (it would lose over 1 % of the variance)."""
    if not length_scale_km > 0:
        raise ValueError(f"--length-scale {length_scale_km}: must be positive (km); e.g. --length-scale 1000")
    tail = math.ceil(math.sqrt(2 * TAIL) / _sigma(length_scale_km))
    grid = max(1, min(n_lat - 1, n_lon // 2))
    if tail <= grid:
        return tail
    full = _raw_spectrum(length_scale_km, tail)
    weight = 2 * np.arange(tail + 1) + 1
    kept = float((weight * full)[: grid + 1].sum() / (weight * full).sum())
    if kept < 1 - LOST_VARIANCE:
        finest = EARTH_RADIUS_KM * math.sqrt(2 * TAIL) / grid
        spacing = 180.0 / max(n_lat - 1, 1) * math.pi / 180 * EARTH_RADIUS_KM
        raise ValueError(
            f"--length-scale {length_scale_km:g} km is finer than the {n_lat}x{n_lon} grid resolves (its "
            f"rows are {spacing:.0f} km apart; degrees up to {grid} keep {kept:.0%} of the variance); give "
            f"--length-scale {math.ceil(finest / 2 / 100) * 100:g} or more"
        )
    return grid


def angular_spectrum(length_scale_km: float, l_max: int) -> np.ndarray:
    """``C_l`` for ``l = 0 … l_max`` (float64): Gaussian in the degree, unit variance at every point."""
    c = _raw_spectrum(length_scale_km, l_max)
    return c / float(((2 * np.arange(l_max + 1) + 1) / (4 * math.pi) * c).sum())


def correlation(gamma: np.ndarray, spectrum: np.ndarray) -> np.ndarray:
    """The field's correlation at great-circle angles ``gamma`` (radians): Σ (2l+1)/(4π) C_l P_l(cos γ)."""
    weights = (2 * np.arange(spectrum.size) + 1) / (4 * math.pi) * spectrum
    return np.polynomial.legendre.legval(np.cos(np.asarray(gamma, dtype=np.float64)), weights)


def legendre_table(lat_rad: np.ndarray, l_max: int) -> np.ndarray:
    """``q[m, l, i]``: orthonormal associated Legendre functions of ``sin(lat_i)`` (float64, zero where
    ``l < m``; ``√2`` folded in for ``m > 0``), by the stable recurrence in ``l`` for each ``m``. Each row
    is computed on its own, so a tile's rows equal the global table's."""
    x = np.sin(np.asarray(lat_rad, dtype=np.float64))
    u = np.cos(np.asarray(lat_rad, dtype=np.float64))
    q = np.zeros((l_max + 1, l_max + 1, x.size))
    diag = np.full(x.size, 1 / math.sqrt(4 * math.pi))
    for m in range(l_max + 1):
        if m > 0:
            diag = diag * u * math.sqrt((2 * m + 1) / (2 * m))
        q[m, m] = diag
        if m + 1 <= l_max:
            q[m, m + 1] = math.sqrt(2 * m + 3) * x * diag
        for ell in range(m + 2, l_max + 1):
            a = math.sqrt((4 * ell * ell - 1) / (ell * ell - m * m))
            b = math.sqrt(((ell - 1) ** 2 - m * m) / (4 * (ell - 1) ** 2 - 1))
            q[m, ell] = a * (x * q[m, ell - 1] - b * q[m, ell - 2])
    q[1:] *= math.sqrt(2)
    return q


def coefficients(seed: int, key: str, samples: torch.Tensor, channels: int, l_max: int) -> torch.Tensor:
    """Standard-normal coefficients ``(B, channels, 2, l_max + 1, l_max + 1)`` (cos, sin; ``[l, m]``) of
    the samples ``(B,)`` (int64): each a pure function of ``(seed, key, sample, channel, part, l, m)``,
    drawn on ``samples``' device, the same on every rank."""
    n = l_max + 1
    dev = samples.device
    idx = samples.view(-1, 1, 1, 1, 1) * channels + torch.arange(channels, device=dev).view(1, -1, 1, 1, 1)
    idx = (idx * 2 + torch.arange(2, device=dev).view(1, 1, -1, 1, 1)) * n
    idx = (idx + torch.arange(n, device=dev).view(1, 1, 1, -1, 1)) * n + torch.arange(n, device=dev)
    return normal_at(idx, seed, key)


class TileField:
    """Fields of one spectrum on one tile: ``q_lm`` at its latitudes and ``cos mλ``, ``sin mλ`` at its
    longitudes (radians), computed once and kept on ``device``."""

    def __init__(self, spectrum: np.ndarray, lat_rad: np.ndarray, lon_rad: np.ndarray,
                 device: torch.device | str | None = None):  # fmt: skip
        self.l_max = spectrum.size - 1
        q = legendre_table(lat_rad, self.l_max) * np.sqrt(spectrum)[None, :, None]
        m = np.arange(self.l_max + 1, dtype=np.float64)[:, None]
        lon = np.asarray(lon_rad, dtype=np.float64)[None, :]
        self.q = torch.from_numpy(q).to(device)  # (m, l, h), with sqrt(C_l)
        self.cos = torch.from_numpy(np.cos(m * lon)).to(device)  # (m, w)
        self.sin = torch.from_numpy(np.sin(m * lon)).to(device)

    def evaluate(self, coef: torch.Tensor) -> torch.Tensor:
        """The fields ``(..., h, w)`` float32 of coefficients ``(..., 2, l_max + 1, l_max + 1)`` (from
        ``coefficients``); computed in float64."""
        c = coef.to(self.q.device, torch.float64)
        parts = torch.einsum("...plm,mli->...pmi", c, self.q)  # Σ_l a_lm √C_l q_lm(φ_i)
        field = torch.einsum("...mi,mj->...ij", parts[..., 0, :, :], self.cos)
        field = field + torch.einsum("...mi,mj->...ij", parts[..., 1, :, :], self.sin)
        return field.float()
