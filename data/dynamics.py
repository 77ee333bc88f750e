"""The synthetic atmosphere behind ``data synth`` (see ``synth.py`` for what it is meant to be).

``stochastic = σ > 0`` adds a second red-noise stream to the wave field, of stationary amplitude
``σ × 200`` m²/s² and 6-hourly correlation 0.9: its innovations (``σ × 200 × √(1 − 0.81)`` per step)
are unpredictable from any past state, so forecast uncertainty grows with lead (std
``σ × 200 × √(1 − 0.9^(2k))`` after ``k`` steps) and an ensemble has a spread to learn. ``σ = 0``
(the default) computes nothing more: the fields are bit-identical to those without the option.
"""

from __future__ import annotations

import logging

import numpy as np
from jigsaw_earth.data.store import UPPER_AIR_VARIABLES

from jigsaw_earth.sphere import grid_latitudes, grid_longitudes

__all__ = ["Dynamics"]

log = logging.getLogger(__name__)

G = 9.80665
OMEGA = 7.292e-5
RADIUS = 6.371e6
UPPER = UPPER_AIR_VARIABLES  # the table's upper-air variables (synth makes those it has a formula for)


def _height(p: np.ndarray) -> np.ndarray:
    """Standard-atmosphere height (m) of pressure ``p`` (hPa)."""
    return 44330.8 * (1.0 - (p / 1013.25) ** 0.190263)


def _smooth_field(rng: np.random.Generator, lat: np.ndarray, lon: np.ndarray, m_max: int = 5) -> np.ndarray:
    out = np.zeros((len(lat), len(lon)))
    for m in range(m_max + 1):
        for n in range(1, 5):
            a, ph1, ph2 = rng.normal() / (1 + m + n), rng.uniform(0, 2 * np.pi), rng.uniform(0, 2 * np.pi)
            out += a * np.sin(n * (lat[:, None] + np.pi / 2) + ph1) * np.cos(m * lon[None, :] + ph2)
    return (out - out.mean()) / out.std()


class Dynamics:
    """Synthetic fields on a ``n_lat × n_lon`` grid (latitude descending, cell-centred)."""

    def __init__(self, n_lat: int, n_lon: int, seed: int = 0, stochastic: float = 0.0):
        if not (stochastic >= 0 and np.isfinite(stochastic)):
            raise ValueError(f"stochastic amplitude {stochastic}: use a number >= 0 (0 = off, 1 = 200 m²/s²)")
        self.stochastic = float(stochastic)
        self.lat_deg = grid_latitudes(n_lat, centred=True)
        self.lon_deg = grid_longitudes(n_lon)
        self.phi = np.deg2rad(self.lat_deg)[:, None]
        self.lam = np.deg2rad(self.lon_deg)[None, :]
        rng = np.random.default_rng(seed)
        land = _smooth_field(rng, self.phi[:, 0], self.lam[0]) + 0.6 * np.sin(self.phi)
        thr = np.quantile(land, 0.7)
        self.lsm = 1.0 / (1.0 + np.exp(-(land - thr) / 0.08))
        mountains = np.maximum(_smooth_field(rng, self.phi[:, 0], self.lam[0], 7), 0.0)
        self.zs = G * 2500.0 * self.lsm * mountains / mountains.max()
        # waves: (mode m, hemisphere) amplitude period, phase
        self.modes = [
            (m, h, rng.uniform(12, 40), rng.uniform(0, 2 * np.pi), rng.uniform(0, 2 * np.pi))
            for m in (4, 5, 6, 7)
            for h in (1.0, -1.0)
        ]
        # red noise: spectral modes with AR(1) coefficients over 6-hourly steps
        self.noise_basis = np.stack(
            [
                np.sin(n * (self.phi + np.pi / 2)) * np.cos(m * self.lam + rng.uniform(0, 2 * np.pi))
                for m in range(0, 7)
                for n in range(1, 6)
            ]
        )
        power = (self.noise_basis**2).mean(axis=(1, 2), keepdims=True)
        self.noise_basis /= np.sqrt(power * len(self.noise_basis))
        self.noise_seed = seed

    # ---- shared state ---------------------------------------------------------------------
    def _noise(self, times: np.ndarray, stream: int = 0, rho: float = 0.85) -> np.ndarray:
        """AR(1) red noise, a deterministic function of the 6-hourly step index (unit std);
        ``stream`` 1 is the ``stochastic`` option's, independent of the default stream 0."""
        steps = ((times.astype("datetime64[h]") - np.datetime64("1970-01-01T00", "h")).astype(np.int64)) // 6
        lo, hi = int(steps.min()), int(steps.max())
        rng = np.random.default_rng([self.noise_seed, lo] + ([stream] if stream else []))
        k = len(self.noise_basis)
        coef = np.empty((hi - lo + 1, k))
        state = rng.normal(size=k)
        for i in range(hi - lo + 1):
            state = rho * state + np.sqrt(1 - rho**2) * rng.normal(size=k)
            coef[i] = state
        return np.einsum("tk,kyx->tyx", coef[steps - lo], self.noise_basis)

    def _waves(self, days: np.ndarray) -> np.ndarray:
        phi_deg = np.rad2deg(self.phi)
        out = np.zeros((len(days), *self.phi.shape[:1], self.lam.shape[1]))
        d = days[:, None, None]
        for m, hemi, period, chi, theta in self.modes:
            env = np.exp(-(((phi_deg - 45.0 * hemi) / 14.0) ** 2))
            speed = np.deg2rad(20.0 - m) * np.cos(self.phi) / np.cos(np.pi / 4)  # rad/day eastward
            amp = 600.0 * (0.75 + 0.25 * np.cos(2 * np.pi * d / period + chi))
            out += amp * env * np.cos(m * (self.lam - speed * d) + theta)
        return out

    # ---- fields ---------------------------------------------------------------------------
    def fields(
        self, times: np.ndarray, levels: np.ndarray, variables: list[str], mean_only: bool = False
    ) -> dict[str, np.ndarray]:
        """``{variable: (T, [L], lat, lon) float32}`` at ``times`` (datetime64)."""
        t = np.asarray(times).astype("datetime64[m]")
        days = (t - np.datetime64("2000-01-01T00:00")).astype(np.float64) / 1440.0
        doy = (t - t.astype("datetime64[Y]")).astype(np.float64) / 1440.0
        hour = (t - t.astype("datetime64[D]")).astype(np.float64) / 60.0
        season = np.cos(2 * np.pi * (doy - 15.0) / 365.25)[:, None, None]
        psi = np.zeros((len(t), *self.lsm.shape)) if mean_only else self._waves(days) + 200.0 * self._noise(t)
        if self.stochastic and not mean_only:
            psi = psi + self.stochastic * 200.0 * self._noise(t, stream=1, rho=0.9)
        phi, c2, s = self.phi, np.cos(self.phi) ** 2 - 0.5, np.sin(self.phi)
        h500 = _height(np.array(500.0))
        out: dict[str, np.ndarray] = {}

        def level_fields(p: float) -> dict[str, np.ndarray]:
            h = _height(np.array(p))
            f = (h + 2000.0) / (h500 + 2000.0)
            wave = f * psi
            z = G * h + 8000.0 * f * c2 - 1500.0 * f * s * season + wave
            t_ref = max(288.15 - 6.5e-3 * h, 216.65)
            t_anom = wave * (4.0 / 1500.0)
            temp = t_ref + 40.0 * c2 - 12.0 * s * season * (p / 1000.0) + t_anom
            jet = min(max(h / _height(np.array(250.0)), 0.2), 1.0)
            u_jet = 25.0 * jet * np.exp(-(((np.abs(np.rad2deg(phi)) - 40.0) / 12.0) ** 2)) - 5.0 * np.exp(
                -((np.rad2deg(phi) / 15.0) ** 2)
            )
            fcor = 2 * OMEGA * np.where(s >= 0, 1.0, -1.0) * np.maximum(np.abs(s), np.sin(np.deg2rad(20.0)))
            dphi = np.gradient(wave, phi[:, 0], axis=-2)
            dlon = 2 * (self.lam[0, 1] - self.lam[0, 0])
            dlam = (np.roll(wave, -1, axis=-1) - np.roll(wave, 1, axis=-1)) / dlon
            u = u_jet - dphi / (fcor * RADIUS)
            v = dlam / (fcor * RADIUS * np.cos(phi))
            q = 0.014 * (p / 1000.0) ** 3 * (0.08 + 0.92 * np.exp(-((np.rad2deg(phi) / 30.0) ** 2)))
            q = np.maximum(q * np.exp(0.06 * t_anom) * (1 + 0.15 * s * season), 1e-6)
            return {
                "geopotential": z,
                "temperature": temp,
                "u_component_of_wind": u,
                "t_anom": t_anom,
                "v_component_of_wind": v,
                "specific_humidity": q,
                "vertical_velocity": -dlam * 1e-5 * f,
            }

        upper = [v for v in variables if v in UPPER]
        per_level = {float(p): level_fields(float(p)) for p in levels} if upper else {}
        near = per_level.get(850.0) or level_fields(850.0)
        made = [v for v in UPPER if v in near]  # the upper-air variables with a formula here
        for v in upper:
            if v in made:
                out[v] = np.stack([lf[v] for lf in per_level.values()], axis=1).astype(np.float32)
        local_hour = (hour[:, None, None] + self.lon_deg[None, None, :] / 15.0) % 24.0
        diurnal = (0.8 + 4.2 * self.lsm) * np.cos(2 * np.pi * (local_hour - 15.0) / 24.0) * np.cos(phi)
        surface = {
            "2m_temperature": 300.0
            - 50.0 * s**2
            - 6.5e-3 * self.zs / G
            - 14.0 * s * season * (0.4 + 0.6 * self.lsm)
            + diurnal
            + 0.8 * near["t_anom"],
            "10m_u_component_of_wind": 0.6 * near["u_component_of_wind"],
            "10m_v_component_of_wind": 0.6 * near["v_component_of_wind"],
            "mean_sea_level_pressure": 101325.0
            + 0.9 * psi
            + 1200.0 * np.exp(-(((np.abs(np.rad2deg(phi)) - 30) / 10) ** 2))
            - 1800.0 * np.exp(-(((np.abs(np.rad2deg(phi)) - 60) / 10) ** 2)),
            "total_precipitation_6hr": np.maximum(near["specific_humidity"] - 0.006, 0.0) * 0.5,
        }
        for v in variables:
            if v in surface:
                out[v] = np.broadcast_to(surface[v], (len(t), *self.lsm.shape)).astype(np.float32)
            elif v not in out:
                raise ValueError(f"synth cannot make variable {v!r}; choose from {sorted([*made, *surface])}")
        return out
