"""A/B of the channel MLP as one distributed pair (``MLP``) against two column-sharded jigsaw
``Linear`` layers (the MLP before stop 29), forward + backward, alternated in the same processes
(one torch thread per rank). ``--what mlp``: WeatherMixer small's MLP (256 -> 1024 -> 256,
batch 8) alone; ``--what model``: WeatherMixer small with its eight MLPs swapped between the two.

    python scripts/mlp_pair_ab.py --mesh 1x2 --grid 128x256 [--what model] [--rounds 10]

``--grid`` is the field grid (patch 8: 128 x 256 gives 16 x 32 tokens).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from jigsaw_earth.models.registry import build_model
from torch import nn

from jigsaw_earth.distributed.mesh import MeshShape
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.layers.base import Domain, init_model
from jigsaw_earth.layers.linear import Linear
from jigsaw_earth.layers.mlp import MLP

PATCH = 8  # WeatherMixer small's patch


class TwoLinears(nn.Module):
    """``fc2(act(fc1(x)))`` with two column-sharded ``Linear`` layers, the shapes of ``pair``."""

    def __init__(self, pair: MLP):
        super().__init__()
        domain = pair.domain
        self.fc1 = Linear(domain, pair.in_features, pair.hidden)
        self.fc2 = Linear(domain, pair.hidden, pair.out_features)
        self.act = pair.act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def _mlp_case(domain: Domain, seed: int):
    """Both MLPs on a token tile: ``(run(variant), variants)``."""
    pair = MLP(domain, 256, 1024)
    variants = {"pair": pair, "two linears": TwoLinears(pair)}
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(8, *domain.tile.shape, 256, generator=gen)
    dy = torch.randn(x.shape, generator=gen)

    def run(name: str) -> None:
        xa = x.clone().requires_grad_()
        variants[name](xa).backward(dy)

    return run, list(variants)


def _model_case(field: Domain, seed: int):
    """WeatherMixer small with its MLPs swapped between the variants."""
    model = init_model(build_model("weathermixer", field, 9, 3, 4, "small"), 0)
    pairs = [block.channel_mixing for block in model.blocks]
    variants = {"pair": pairs, "two linears": [TwoLinears(m) for m in pairs]}
    gen = torch.Generator().manual_seed(seed)
    state = torch.randn(8, 9, *field.tile.shape, generator=gen)
    static, times = torch.randn(3, *field.tile.shape, generator=gen), torch.randn(8, 4, generator=gen)

    def run(name: str) -> None:
        for block, mlp in zip(model.blocks, variants[name], strict=True):
            block.channel_mixing = mlp
        model.zero_grad(set_to_none=True)
        model(state, static, times).square().mean().backward()

    return run, list(variants)


def worker(mesh, grid: list[int], what: str, rounds: int) -> dict[str, list[float]]:
    seed = mesh.domain.index
    if what == "mlp":
        run, names = _mlp_case(Domain.create(mesh, grid[0] // PATCH, grid[1] // PATCH), seed)
    else:
        run, names = _model_case(Domain.create(mesh, *grid), seed)
    sync = torch.distributed.barrier if torch.distributed.is_initialized() else (lambda: None)
    for name in names:  # warm-up
        run(name)
    spent: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            sync()
            start = time.perf_counter()
            run(name)
            spent[name].append(time.perf_counter() - start)
    return spent


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--mesh", default="1x2", help="LATxLON (default 1x2)")
    parser.add_argument("--grid", default="128x256", help="field grid LATxLON (default 128x256)")
    parser.add_argument("--what", choices=("mlp", "model"), default="mlp")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    lat, lon = (int(v) for v in args.mesh.split("x"))
    grid = [int(v) for v in args.grid.split("x")]
    torch.set_num_threads(1)
    for rank, spent in enumerate(spawn(MeshShape(1, lat, lon), worker, grid, args.what, args.rounds)):
        ratios = [old / new for old, new in zip(spent["two linears"], spent["pair"], strict=True)]
        medians = {name: statistics.median(t) * 1e3 for name, t in spent.items()}
        print(
            f"rank {rank}: pair {medians['pair']:.0f} ms, two linears {medians['two linears']:.0f} ms; "
            f"two linears / pair per round {min(ratios):.2f}-{max(ratios):.2f}, "
            f"median {statistics.median(ratios):.2f}"
        )


if __name__ == "__main__":
    main()
