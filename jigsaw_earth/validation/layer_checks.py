"""Validator checks for the jigsaw layers: each against plain torch on the global tensor."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..distributed.matmul import channel_bytes
from ..distributed.mesh import DomainMesh
from ..layers.base import Domain
from ..layers.linear import Linear
from .layer_harness import check_module
from .registry import Record, register

GRIDS = [(8, 12), (7, 10)]  # divisible on small meshes, uneven


def _fits(mesh: DomainMesh, grid: tuple[int, int]) -> bool:
    return grid[0] >= mesh.shape.lat and grid[1] >= mesh.shape.lon


@register("linear")
def check_linear(mesh: DomainMesh) -> Iterator[Record]:
    for grid in GRIDS:
        if not _fits(mesh, grid):
            continue
        for cin, cout, bias, strategy in [(12, 20, True, "weights"), (9, 5, False, "activations")]:
            x = torch.randn(2, *grid, cin, generator=torch.Generator().manual_seed(cin))
            domain = Domain.create(mesh, *grid)
            expected = channel_bytes(strategy, domain.counts(2), cin, domain.split_sizes(cout), bias)
            yield check_module(
                mesh,
                f"linear.{strategy}",
                f"{grid[0]}x{grid[1]} b2 {cin}->{cout}",
                lambda d, cin=cin, cout=cout, bias=bias, s=strategy: Linear(d, cin, cout, bias, s),
                x,
                grid,
                layout="tokens",
                reference=lambda m, t: t @ m.weight + (m.bias if m.bias is not None else 0),
                expected_bytes=sum(expected),
            )
