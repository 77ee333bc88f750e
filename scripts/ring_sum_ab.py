"""A/B of the rings' partial sums accumulated inside the GEMM (``matmul._addmm_``: ``acc.addmm_(a,
b)``; the first block with its bias in one ``addmm``) against a product then an add (the code
before stop 30), WeatherMixer small forward + backward, alternated in the same processes (one
torch thread per rank; ``bench.measure.time_pair``). The "before" side swaps in the old
helpers; everything else is shared.

    python scripts/ring_sum_ab.py --mesh 1x2 --grid 128x256 [--rounds 12]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from jigsaw_earth.models.registry import build_model

from jigsaw_earth.bench.measure import time_pair
from jigsaw_earth.distributed import matmul, pair
from jigsaw_earth.distributed.mesh import MeshShape
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.layers.base import Domain, init_model

NEW = (matmul._addmm_, matmul._first)


def _addmm_before(acc: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if acc is None:
        return _first_before(a, b)
    acc += a @ b
    return acc


def _first_before(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    y = a @ b
    if bias is not None:
        y = y + bias
    return y.to(matmul._acc_dtype(y.dtype))


def _use(variant: str) -> None:
    helpers = NEW if variant == "in the GEMM" else (_addmm_before, _first_before)
    for module in (matmul, pair):
        module._addmm_, module._first = helpers


def worker(mesh, grid: list[int], rounds: int) -> dict:
    field = Domain.create(mesh, *grid)
    model = init_model(build_model("weathermixer", field, 9, 3, 4, "small"), 0)
    gen = torch.Generator().manual_seed(mesh.domain.index)
    state = torch.randn(8, 9, *field.tile.shape, generator=gen)
    static, times = torch.randn(3, *field.tile.shape, generator=gen), torch.randn(8, 4, generator=gen)
    sync = torch.distributed.barrier if torch.distributed.is_initialized() else (lambda: None)

    def step(variant: str) -> Callable[[], None]:
        def run() -> None:
            _use(variant)
            sync()  # both ranks start each sample together
            model.zero_grad(set_to_none=True)
            model(state, static, times).square().mean().backward()

        return run

    return time_pair(step("product then add"), step("in the GEMM"), rounds)


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--mesh", default="1x2", help="LATxLON (default 1x2)")
    parser.add_argument("--grid", default="128x256", help="field grid LATxLON (default 128x256)")
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    lat, lon = (int(v) for v in args.mesh.split("x"))
    grid = [int(v) for v in args.grid.split("x")]
    torch.set_num_threads(1)
    for rank, got in enumerate(spawn(MeshShape(1, lat, lon), worker, grid, args.rounds)):
        ratio = got["ratio"]
        print(
            f"rank {rank}: in the GEMM {got['twin_ms']:.0f} ms, product then add {got['jigsaw_ms']:.0f} ms; "
            f"before / after median {ratio['median']:.3f} ({ratio['min']:.2f}-{ratio['max']:.2f})"
        )


if __name__ == "__main__":
    main()
