"""Training-time validation metrics on sharded tiles, equal to the serial WB2 metrics on any mesh.

Each rank holds a tile ``(h, w)`` of the global grid and the matching rows of the global WB2
latitude weights (normalised over the *global* grid, e.g. ``data.geometry.tile_latitude_weights``).
Per sample, every rank adds its tile's share of the weighted sums

    Σ w·e², Σ w·e, Σ w·f′o′, Σ w·f′², Σ w·o′²   (divided by n_lat·n_lon, so the global sum is a mean)

per (lead, variable). ``compute()`` sums the shares over the domain axis (exact per-sample global
weighted means), forms per-sample MSE, bias and ACC, sums them over samples and data-parallel
replicas, and returns RMSE = sqrt(mean MSE) — the square root after the time mean.

With ``regions`` (``TileRegions``) the shares are taken for every WB2 region at once (the weights of
``score``'s region plan, cut to the tile) and every result gains a trailing region axis.

With ``members`` the forecast is an ensemble ``(B, L, M, V, h, w)``: RMSE, bias and ACC are those of
the ensemble mean, and the shares of WB2's ensemble terms (``ensemble.pointwise``) follow, giving
CRPS (skill, spread), ensemble standard deviation and spread/skill (``ensemble.time_means``). Every
member of a point must be on the rank that takes its share.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..distributed.comm import all_reduce_
from ..distributed.mesh import Axis
from .ensemble import POINTWISE, ensemble_mean, pointwise, time_means
from .tile_regions import TileRegions

__all__ = ["MetricAccumulator"]


def _all_reduce(t: torch.Tensor, axis: Axis | None) -> torch.Tensor:
    if axis is not None and axis.group is not None:
        all_reduce_(t, axis, op="metrics")
    return t


class MetricAccumulator:
    """Accumulate WB2 RMSE, bias and ACC per (lead, variable) over validation batches.

    ``lat_weights``: this tile's rows of the global WB2 weights (mean 1 over the global rows),
    shape ``(h,)``. ``grid``: the global ``(n_lat, n_lon)``. ``domain``: the mesh's domain axis;
    ``data``: its data axis (samples differ between replicas), or ``None``. ``members``: the
    ensemble size of the forecasts passed (None: deterministic forecasts). ``device``: where the
    sums are reduced over the mesh (the process group's device; default: where the shares are).
    """

    def __init__(
        self,
        lat_weights: torch.Tensor,
        grid: tuple[int, int],
        domain: Axis | None,
        data: Axis | None = None,
        variables: Sequence[str] | None = None,
        regions: TileRegions | None = None,
        members: int | None = None,
        device: torch.device | str | None = None,
    ):
        self.regions, self.members = regions, members
        self.device = torch.device(device) if device is not None else None
        self.weights = torch.as_tensor(lat_weights, dtype=torch.float64).reshape(-1, 1)
        if self.device is not None:  # the weights wait where the shares are taken
            self.weights = self.weights.to(self.device)
            self.regions = None if regions is None else regions.to(self.device)
        self.area = float(grid[0] * grid[1])
        self.domain, self.data = domain, data
        self.variables = list(variables) if variables is not None else None
        self._parts: list[torch.Tensor] = []

    def reset(self) -> None:
        self._parts.clear()

    @torch.no_grad()
    def update(
        self,
        forecast: torch.Tensor,
        truth: torch.Tensor,
        climatology: torch.Tensor | None = None,
    ) -> None:
        """Add a batch: ``forecast``, ``truth`` (and ``climatology`` at the valid times) shaped
        ``(B, L, V, h, w)`` (batch, lead, variable, tile), in physical units; an ensemble forecast
        ``(B, L, M, V, h, w)``."""
        self.add(self.shares(forecast, truth, climatology))

    def add(self, shares: torch.Tensor) -> None:
        """Add per-sample tile shares from ``shares`` (e.g. one lead at a time, joined on axis 1);
        they stay on their device until ``compute``."""
        self._parts.append(shares)

    @property
    def parts(self) -> list[torch.Tensor]:
        """The shares added so far, in order (``compute`` sums them in this order)."""
        return list(self._parts)

    @torch.no_grad()
    def shares(
        self,
        forecast: torch.Tensor,
        truth: torch.Tensor,
        climatology: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """This tile's shares of the weighted sums, ``(B, L, V[, R], k)``; arguments as ``update``."""
        members = None
        if self.members is not None:
            if forecast.dim() != 6 or forecast.shape[2] != self.members:
                raise ValueError(
                    f"ensemble forecast {tuple(forecast.shape)} must be (B, L, M={self.members}, V, h, w)"
                )
            members = forecast.to(torch.float64)
            forecast = ensemble_mean(members, 2)
        if forecast.shape != truth.shape or forecast.dim() != 5:
            raise ValueError(
                f"forecast {tuple(forecast.shape)} and truth {tuple(truth.shape)} must both be "
                "(B, L, V, h, w)"
            )
        if forecast.shape[-2] != self.weights.shape[0]:
            raise ValueError(
                f"the tile has {forecast.shape[-2]} rows but {self.weights.shape[0]} latitude weights; pass "
                "this tile's rows of the global weights"
            )
        f, o = forecast.to(torch.float64), truth.to(torch.float64)
        w = self.weights.to(f.device)

        def share(x: torch.Tensor) -> torch.Tensor:
            if self.regions is not None:
                return self.regions.share(x)
            return (x * w).sum((-2, -1)) / self.area

        err = f - o
        parts = [share(err**2), share(err)]
        if climatology is not None:
            c = climatology.to(torch.float64)
            fa, oa = f - c, o - c
            parts += [share(fa * oa), share(fa**2), share(oa**2)]
        if members is not None:
            terms = pointwise(members, o, 2)
            parts += [share(terms[q]) for q in POINTWISE]
        return torch.stack(parts, dim=-1)  # (B, L, V[, R], k)

    @torch.no_grad()
    def per_sample(self) -> torch.Tensor:
        """The global weighted means of this replica's samples, in the order added: ``(N, L, V[, R],
        k)`` with ``k`` as ``shares`` (``statistics.STATS``' order). Collective over the domain axis."""
        if not self._parts:
            raise ValueError("MetricAccumulator.per_sample() called before any update()")
        device = self.device or self._parts[0].device
        return _all_reduce(torch.cat([p.to(device) for p in self._parts]), self.domain)

    @torch.no_grad()
    def compute(self) -> dict[str, torch.Tensor]:
        """``{"rmse", "mse", "bias"[, "acc"]}`` as ``(L, V)`` float64 tensors and ``"count"``; for an
        ensemble also ``ensemble.ENSEMBLE_METRICS``.

        Collective: every rank of the domain (and data) axis must call it.
        """
        if not self._parts:
            raise ValueError("MetricAccumulator.compute() called before any update()")
        k = {p.shape[-1] for p in self._parts}
        if len(k) != 1:
            raise ValueError("pass a climatology to every update() or to none")
        device = self.device or self._parts[0].device
        sums = _all_reduce(torch.cat([p.to(device) for p in self._parts]), self.domain)  # per-sample means
        per_sample = {"mse": sums[..., 0], "bias": sums[..., 1]}
        n_ens = 0 if self.members is None else len(POINTWISE)
        if sums.shape[-1] - n_ens == 5:
            per_sample["acc"] = sums[..., 2] / torch.sqrt(sums[..., 3] * sums[..., 4])
        for i, q in enumerate(POINTWISE[:n_ens]):
            per_sample[q] = sums[..., sums.shape[-1] - n_ens + i]
        stacked = torch.stack([v.sum(0) for v in per_sample.values()])
        count = torch.tensor([float(sums.shape[0])], dtype=torch.float64, device=device)
        stacked, count = _all_reduce(stacked, self.data), _all_reduce(count, self.data)
        out = {name: stacked[i] / count for i, name in enumerate(per_sample)}
        out["rmse"] = torch.sqrt(out["mse"])
        if n_ens:
            out.update(time_means({q: out.pop(q) for q in POINTWISE}, out["mse"]))
        out["count"] = count
        return out

    def as_dict(
        self, result: dict[str, torch.Tensor], leads: Sequence[str] | None = None
    ) -> dict[str, float]:
        """Flat ``{"rmse/<variable>/<lead>": value}`` for logging."""
        variables = self.variables or [str(v) for v in range(result["rmse"].shape[1])]
        lead_names = (
            list(leads) if leads is not None else [str(i + 1) for i in range(result["rmse"].shape[0])]
        )
        return {
            f"{name}/{var}/{lead}": float(result[name][i, j])
            for name in ("rmse", "bias", "acc")
            if name in result
            for i, lead in enumerate(lead_names)
            for j, var in enumerate(variables)
        }
