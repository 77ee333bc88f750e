"""The perturbations of ``perturb.py`` made on each rank's tile: the same members on every mesh.

``Perturber.apply`` adds this rank's members' perturbations to the batch's initial states (normalised,
member-major rows: rows ``[i·B, (i+1)·B)`` are member ``mine[i]``). Every random number comes from the
counter-based generator by global index (``models/noise.field_normal``, ``sphere_field.coefficients``)
with the stream ``perturb/SCHEME/draw{k}`` and the init time's sample index
(``noise.forecast_sample_index``), so a member's field depends on ``(seed, draw, init, global grid
index)`` only:

* ``gaussian``: ``field_normal`` on the tile, exact on any tile;
* ``correlated``: the coefficients of a spherical-harmonic expansion are drawn on every rank alike and
  evaluated at the tile's own latitudes and longitudes (``sphere_field.TileField``): exact, no exchange;
* ``bred``: the model runs on the mesh as the forecast does; each cycle's norm is one all-reduce of a
  number per row over the lat × lon domain;
* ``lagged``: the earlier inits are read on the tile and stepped by the model, as any forecast.

A stochastic model breeds with its noise channels at zero (their mean: the growth is the perturbation's
alone), and a lagged member runs the earlier forecast with its own noise stream (its member number, the
earlier init's sample index).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ..data.samples import TrainData
from ..distributed.collectives import all_reduce
from ..distributed.comm import comm_site
from ..models.noise import field_normal, forecast_sample_index, member_noise
from ..sphere_field import TileField, angular_spectrum, coefficients, degree_cutoff
from .members import Members
from .perturb import Perturbation

__all__ = ["Perturber", "StepFn"]

#: one model step: ``(state (N, C, h, w), static, time features (N, T), noise or None) -> state``
StepFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


def _lat_lon(data: TrainData) -> tuple[np.ndarray, np.ndarray]:
    """This tile's latitudes and longitudes in radians, from the store's coordinates."""
    rows, cols = data.tile.slices
    lat = np.asarray(data.source.lat, dtype=np.float64)[rows]
    lon = np.asarray(data.source.view.lon, dtype=np.float64)[cols]
    return np.deg2rad(lat), np.deg2rad(lon)


class Perturber:
    """This rank's members' perturbations, for the inits of a forecast (``inits``: store indices,
    ``init_times`` their times; ``step``: the forecast's model step)."""

    def __init__(self, p: Perturbation, ens: Members, data: TrainData, step: StepFn):
        self.p, self.ens, self.data, self.step = p, ens, data, step
        self.channels = len(data.channels)
        self.grid = (data.grid.n_lat, data.grid.n_lon)
        unit = data.tendency_std if p.scale == "tendency" else torch.ones(self.channels)
        self.unit = unit.to(data.mesh.device).view(
            1, -1, 1, 1
        )  # each channel's unit (``Perturbation.scale``)
        self.field: TileField | None = None
        if p.scheme == "correlated":
            l_max = degree_cutoff(p.length_scale_km, *self.grid)
            lat, lon = _lat_lon(data)
            self.field = TileField(angular_spectrum(p.length_scale_km, l_max), lat, lon, data.mesh.device)

    # -------------------------------------------------------------- white and correlated fields
    def _random(self, draw: int, samples: torch.Tensor, device: torch.device) -> torch.Tensor:
        """Draw ``draw``'s unit field ``(B, C, h, w)`` of the inits with sample indices ``samples``."""
        key = f"perturb/{self.p.scheme}/draw{draw}"
        if self.field is not None:
            coef = coefficients(self.ens.seed, key, samples.to(device), self.channels, self.field.l_max)
            return self.field.evaluate(coef)
        shape = (samples.numel(), self.channels, *self.data.tile.shape)
        return field_normal(shape, seed=self.ens.seed, key=key, sample_index=samples, tile=self.data.tile,
                            grid=self.grid, device=device)  # fmt: skip

    def apply(self, state: torch.Tensor, inits: np.ndarray, init_times: np.ndarray) -> torch.Tensor:
        """``state`` ``(m·B, C, h, w)``, every member of this rank, with its perturbation added."""
        b = len(inits)
        draws = {m: self.p.draw(m) for m in self.ens.mine}
        wanted = sorted({d[0] for d in draws.values() if d is not None})
        if not wanted:
            return state
        samples = forecast_sample_index(init_times)
        if self.p.scheme == "lagged":
            made = self._lagged(state[:b], wanted, inits)
        elif self.p.scheme == "bred":
            made = self._bred(wanted, inits, samples, state.device)
        else:
            made = {k: self.p.amplitude * self.unit * self._random(k, samples, state.device) for k in wanted}
        out = state.clone()
        for i, m in enumerate(self.ens.mine):
            if draws[m] is not None:
                k, sign = draws[m]
                out[i * b : (i + 1) * b] += sign * made[k]
        return out

    # ------------------------------------------------------------------------------ bred vectors
    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        """Area-weighted RMS ``(N, 1, 1, 1)`` in units of each row over every channel and the whole globe
        (one all-reduce over the domain)."""
        w = self.data.lat_weights.to(x.device).view(1, 1, -1, 1)
        local = ((x / self.unit) ** 2 * w).sum(dim=(1, 2, 3))
        with comm_site("predict.perturb"):
            total = all_reduce(local, self.data.mesh.domain)
        count = self.channels * self.grid[0] * self.grid[1]
        return (total / count).sqrt().view(-1, 1, 1, 1)

    def _analyses(self, inits: np.ndarray, hours: int) -> tuple:
        """The store's batch ``hours`` before each of ``inits`` (store indices)."""
        times = self.data.times
        wanted = times[np.asarray(inits)].astype("datetime64[h]") - np.timedelta64(hours, "h")
        return self.data._batch(np.searchsorted(times, wanted.astype(times.dtype)), 0)

    def _run(self, x: torch.Tensor, batch, steps: int, repeat: int, noise_of=None) -> torch.Tensor:
        """``steps`` model steps of ``x`` (``repeat`` copies of the batch's rows) from the batch's time."""
        static = batch.static.to(x.device)
        for s in range(steps):
            tf = self.data.step_time_features(batch, s).to(x.device).repeat(repeat, 1)
            noise = None
            if self.ens.channels:
                noise = (torch.zeros(x.shape[0], self.ens.channels, *x.shape[2:], device=x.device)
                         if noise_of is None else noise_of(s))  # fmt: skip
            x = self.step(x, static, tf, noise)
        return x

    def _bred(self, draws: list[int], inits: np.ndarray, samples: torch.Tensor, device: torch.device
              ) -> dict[int, torch.Tensor]:  # fmt: skip
        """Each draw's bred vector ``(B, C, h, w)`` valid at the inits, of norm ``amplitude``."""
        p, b, a = self.p, len(inits), self.p.amplitude
        delta = torch.cat([self._random(k, samples, device) for k in draws]) * self.unit
        delta = a * delta / self._norm(delta)
        steps = p.bred_cycle_hours // self.data.step_hours
        for c in range(p.bred_cycles, 0, -1):  # the cycle that ends c - 1 cycles before the init
            batch = self._analyses(inits, c * p.bred_cycle_hours)
            x = batch.inputs.to(device)
            both = torch.cat([x, x.repeat(len(draws), 1, 1, 1) + delta])
            grown = self._run(both, batch, steps, len(draws) + 1)
            delta = grown[b:] - grown[:b].repeat(len(draws), 1, 1, 1)
            delta = a * delta / self._norm(delta).clamp_min(torch.finfo(delta.dtype).tiny)
        return {k: delta[i * b : (i + 1) * b] for i, k in enumerate(draws)}

    # ------------------------------------------------------------------------------ lagged members
    def _lagged(self, now: torch.Tensor, lags: list[int], inits: np.ndarray) -> dict[int, torch.Tensor]:
        """Member ``k``'s forecast from ``k × lag_hours`` before each init, valid at it, minus the
        init's state ``now``, times the amplitude."""
        out = {}
        per = self.p.lag_hours // self.data.step_hours
        for k in lags:
            batch = self._analyses(inits, k * self.p.lag_hours)
            earlier = forecast_sample_index(batch.times)

            def noise_of(s: int, k: int = k, earlier: torch.Tensor = earlier) -> torch.Tensor:
                shape = (len(inits), self.ens.channels, *self.data.tile.shape)
                return member_noise(shape, seed=self.ens.seed, member=k, sample_index=earlier, step=s,
                                    tile=self.data.tile, grid=self.grid, device=now.device)  # fmt: skip

            x = self._run(batch.inputs.to(now.device), batch, k * per, 1, noise_of)
            out[k] = self.p.amplitude * (x - now)
        return out
