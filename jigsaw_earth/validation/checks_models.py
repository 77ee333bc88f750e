"""Validator checks for the forecast models: each model on the mesh against itself on one rank.

A composite model has no plain-torch definition, so the reference is the serial model
(``check_module(..., reference=None)``), itself built from layers that are each checked against
plain torch. Cases use the tiny presets on an uneven 33 × 64 grid (17 × 32 after one halving,
9 × 16 tokens for 4 × 4 patches, 33 × 8 for the paper arrangement's 1 × 8), batch 2, fp32,
judged against the serial model in float32 and float64 (``registry.judge``). The communication measured
by the ledger must equal the analytical figure of ``jigsaw-earth model summary``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from ..distributed.mesh import DomainMesh
from ..layers.base import Domain
from ..layers.cost import step_bytes
from ..models import MODELS, build_model
from .layer_harness import check_module
from .registry import Record, register

GRID = (33, 64)
N_STATE, N_STATIC, N_TIME, BATCH = 5, 2, 4, 2


class FieldAdapter(nn.Module):
    """One field tensor ``(B, n_state + n_static, h, w)`` → ``model(state, static, time)``.

    The static channels are taken from sample 0 and the time features are fixed, so
    ``check_module`` can drive a forecaster with the single tensor it scatters.
    """

    def __init__(self, model: nn.Module, n_state: int, time: torch.Tensor):
        super().__init__()
        self.model, self.n_state = model, n_state
        self.register_buffer("time", time, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x[:, : self.n_state], x[0, self.n_state :], self.time)


# the Jigsaw paper's arrangement (presets paper-*) at tiny size: rectangular 1 × 8 patches
# (33 × 8 tokens), hidden sizes from fractions, concat and linear residual
PAPER_TINY = dict(
    patch=(1, 8), token_hidden_fraction=0.5, channel_hidden_fraction=1.5, final_norm=True, concat=True,
    linear_residual=True, residual=False, coord_channels=False,
)  # fmt: skip


def _case(
    mesh: DomainMesh, name: str, preset: str = "tiny", op: str | None = None, label: str = "", **overrides
) -> Record:
    gen = torch.Generator().manual_seed(len(name))
    x = torch.randn(BATCH, N_STATE + N_STATIC, *GRID, generator=gen)
    time = torch.randn(BATCH, N_TIME, generator=gen)

    def build(domain: Domain) -> nn.Module:
        model = build_model(name, domain, N_STATE, N_STATIC, N_TIME, preset, **overrides)
        return FieldAdapter(model, N_STATE, time)

    expected = sum(step_bytes(build(Domain.create(mesh, *GRID)), BATCH))  # the layers' declarations
    shape = f"{GRID[0]}x{GRID[1]} b{BATCH} {N_STATE}+{N_STATIC}+{N_TIME}ch {preset}"
    if label or overrides:
        shape += " " + (label or ",".join(f"{k}={v}" for k, v in overrides.items()))
    return check_module(
        mesh,
        op or name,
        shape,
        build,
        x,
        GRID,
        reference=None,
        seed=3,
        expected_bytes=expected,
    )


def _register(name: str) -> None:
    @register(name)
    def check(mesh: DomainMesh) -> Iterator[Record]:
        yield _case(mesh, name)

    check.__name__ = f"check_{name}"


for _name in MODELS:
    _register(_name)


@register("weathermixer_paper")
def check_weathermixer_paper(mesh: DomainMesh) -> Iterator[Record]:
    yield _case(mesh, "weathermixer", op="weathermixer_paper", label="paper 1x8 concat linres", **PAPER_TINY)
