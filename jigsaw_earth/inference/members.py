"""``predict --members N``: which members a rank runs, their noise, and who may run an ensemble.

Members differ only by their noise (``model.noise_channels``; ``models/noise.py`` defines the
stream): member ``m`` of init ``t`` at rollout step ``k`` draws ``member_noise(seed, member=m,
sample_index=forecast_sample_index(t), step=k)`` — the same numbers on any mesh, batch or split of
members, so a member keeps its own noise stream through the rollout. A deterministic model would
give identical members: ``--members`` above 1 is refused for it unless ``--perturb`` perturbs their
initial states (``perturb.py``; combined with a stochastic model's noise where it has one).

Members are spread over the mesh's ``ensemble`` axis as the trainer spreads them: group ``e`` of
``E`` runs members ``e·N/E … (e+1)·N/E − 1``, batched: rows ``[i·B, (i+1)·B)`` of the state are
member ``mine[i]`` (member-major). ``--first-member K`` numbers the ensemble ``K … K + N − 1``:
the same members (and noise) as those of one larger run, so stores of runs with consecutive ranges
join into one ensemble (``xr.concat(..., "number")``). Scoring needs every member of a point on
one rank: ``everyone``
gathers the ensemble groups' tiles (an all-gather over the ensemble axis, the same tile of every
group), and every group then scores the whole ensemble of its tile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..config.schema import TrainConfig
from ..distributed.collectives import all_gather
from ..distributed.comm import comm_site
from ..distributed.mesh import Axis, DomainMesh
from ..models.noise import forecast_sample_index, member_noise

__all__ = ["Members", "noise_channels"]


def noise_channels(cfg: TrainConfig) -> int:
    """The model's noise channels (0: deterministic)."""
    return int(cfg.model.noise_channels)


@dataclass(frozen=True)
class Members:
    """An ensemble of ``total`` members; this rank runs ``mine`` (global numbers), all batched."""

    total: int
    mine: range
    seed: int
    channels: int
    axis: Axis | None = None  # the mesh's ensemble axis (None: every member on this rank)
    first: int = 0  # the ensemble's first member number (``--first-member``)

    @classmethod
    def plan(
        cls, cfg: TrainConfig, mesh: DomainMesh, total: int, seed: int | None, first: int = 0,
        perturbed: bool = False,
    ) -> Members:  # fmt: skip
        """The members this rank runs — numbers ``first … first + total − 1`` of the ensemble, so a
        second run with ``first`` = the first run's total draws further members of the same
        ensemble; a clear error when the ensemble cannot differ or split (``perturbed``: their
        initial states are perturbed, so a deterministic model's members differ too)."""
        check(cfg, total, mesh.shape.ensemble, first, perturbed)
        m = total // mesh.shape.ensemble
        e = mesh.ensemble_index
        axis = mesh.ensemble if mesh.shape.ensemble > 1 else None
        seed = cfg.run.seed if seed is None else int(seed)
        return cls(total, range(first + e * m, first + (e + 1) * m), seed, noise_channels(cfg), axis, first)

    def expand(self, x: torch.Tensor) -> torch.Tensor:
        """Rows of ``x`` ``(B, …)`` repeated for every member of this rank: ``(m·B, …)``."""
        m = len(self.mine)
        return x if m == 1 else x.repeat(m, *([1] * (x.dim() - 1)))

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """``(m·B, …)`` → ``(m, B, …)``."""
        return x.view(len(self.mine), -1, *x.shape[1:])

    def noise(
        self, data: Any, init_times: np.ndarray, step: int, device: torch.device
    ) -> torch.Tensor | None:
        """This rank's noise ``(m·B, K, h, w)`` for rollout step ``step`` (0-based) of the inits at
        ``init_times``; None for a deterministic model."""
        if not self.channels:
            return None
        g, tile = data.grid, data.tile
        shape = (len(init_times), self.channels, *tile.shape)
        samples = forecast_sample_index(init_times)
        parts = [
            member_noise(
                shape,
                seed=self.seed,
                member=m,
                sample_index=samples,
                step=step,
                tile=tile,
                grid=(g.n_lat, g.n_lon),
                device=device,
            )
            for m in self.mine
        ]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def everyone(self, x: torch.Tensor) -> torch.Tensor:
        """Every member's ``(M, B, …)`` from this rank's ``(m, B, …)``: gathered over the ensemble
        axis (collective over it), in member order."""
        if self.axis is None:
            return x
        with comm_site("predict.members"):
            return all_gather(x.contiguous(), self.axis, dim=0, sizes=[x.shape[0]] * self.axis.size)


PERTURB_FIX = "or perturb their initial states (--perturb gaussian|correlated|bred|lagged, docs/ensembles.md)"


def check(cfg: TrainConfig, total: int, groups: int = 1, first: int = 0, perturbed: bool = False) -> None:
    """Refuse an ensemble that cannot be: no members, a negative first member, identical members
    of a deterministic model (unless ``perturbed``), or members that do not split evenly over
    ``groups`` ensemble groups."""
    if total < 1:
        raise ValueError(f"--members {total}: give at least 1 (e.g. --members 10)")
    if first < 0:
        raise ValueError(f"--first-member {first}: member numbers start at 0; give 0 or more")
    if first > 0 and not noise_channels(cfg) and not perturbed:
        raise ValueError(
            f"--first-member {first}: the model is deterministic (model.noise_channels=0), so member "
            f"{first} would equal member 0; further members need a stochastic model {PERTURB_FIX}"
        )
    if total % groups:
        raise ValueError(
            f"--members {total} must split evenly over mesh.ensemble={groups} groups; use a multiple "
            f"of {groups} (e.g. --members {groups * max(1, total // groups)}) or another mesh.ensemble"
        )
    if total > 1 and not noise_channels(cfg) and not perturbed:
        raise ValueError(
            f"--members {total}: the model is deterministic (model.noise_channels=0), so its "
            f"{total} members would be identical; train a stochastic model (model.noise_channels, "
            f"e.g. 4, and loss.kind fair_crps), {PERTURB_FIX}, or use --members 1 (CRPS is then the MAE)"
        )
