"""Forward and backward wall time of each part of WeatherMixer small, one rank against a mesh's rank.

Module hooks time every top-level part (embedding, each block's norms, token and channel mixing,
recovery), summed over the blocks, in one process per mesh (one torch thread per rank), after two
warm-up steps; rank 0's median step. A part's time on a mesh includes the waits at its exchanges,
so a part that waits for a lagging peer shows it (docs/scaling.md, stop 30).

    python scripts/layer_times.py --meshes 1x1,1x2,2x1 --grid 128x256 [--steps 8]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch
from jigsaw_earth.models.registry import build_model
from torch import nn

from jigsaw_earth.distributed.mesh import MeshShape
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.layers.base import Domain, init_model


def _part(name: str) -> str:
    """``blocks.3.token_mixing`` -> ``blocks.*.token_mixing``; ``embed`` stays."""
    pieces = name.split(".")
    return ".".join(["blocks", "*", *pieces[2:]]) if pieces[0] == "blocks" else pieces[0]


def _hook(model: nn.Module, spent: dict[str, float], backward: bool) -> None:
    started: dict[str, float] = {}
    for name, module in model.named_modules():
        if not name or name.count(".") > 2 or name.count(".") == 1:
            continue

        def begin(*_, n=name):
            started[n] = time.perf_counter()

        def end(*_, n=name):
            spent[_part(n)] += time.perf_counter() - started[n]

        if backward:
            module.register_full_backward_pre_hook(begin)
            module.register_full_backward_hook(end)
        else:
            module.register_forward_pre_hook(begin)
            module.register_forward_hook(end)


def worker(mesh, grid: list[int], steps: int) -> dict[str, dict[str, float]]:
    field = Domain.create(mesh, *grid)
    model = init_model(build_model("weathermixer", field, 9, 3, 4, "small"), 0)
    fwd: dict[str, float] = defaultdict(float)
    bwd: dict[str, float] = defaultdict(float)
    _hook(model, fwd, backward=False)
    _hook(model, bwd, backward=True)
    gen = torch.Generator().manual_seed(0)
    state = torch.randn(8, 9, *field.tile.shape, generator=gen)
    static, times = torch.randn(3, *field.tile.shape, generator=gen), torch.randn(8, 4, generator=gen)
    sync = torch.distributed.barrier if torch.distributed.is_initialized() else (lambda: None)
    per_step: dict[str, dict[str, list[float]]] = {p: defaultdict(list) for p in ("forward", "backward")}
    for step in range(steps + 2):
        fwd.clear(), bwd.clear()
        sync()
        t0 = time.perf_counter()
        loss = model(state, static, times).square().mean()
        t1 = time.perf_counter()
        loss.backward()
        fwd["total"], bwd["total"] = t1 - t0, time.perf_counter() - t1
        if step >= 2:  # after the warm-up
            for phase, spent in (("forward", fwd), ("backward", bwd)):
                for part, seconds in spent.items():
                    per_step[phase][part].append(seconds * 1e3)
    # the median step of each part: one rank's stall in one step moves a mean, not this
    return {phase: {k: statistics.median(v) for k, v in parts.items()} for phase, parts in per_step.items()}


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--meshes", default="1x1,1x2,2x1", help="LATxLON,... (default 1x1,1x2,2x1)")
    parser.add_argument("--grid", default="128x256", help="field grid LATxLON (default 128x256)")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    grid = [int(v) for v in args.grid.split("x")]
    meshes = args.meshes.split(",")
    torch.set_num_threads(1)
    results = {}
    for mesh in meshes:
        lat, lon = (int(v) for v in mesh.split("x"))
        results[mesh] = spawn(MeshShape(1, lat, lon), worker, grid, args.steps)[0]
    print(f"ms per step, rank 0; {args.grid}, batch 8")
    for phase in ("forward", "backward"):
        print(f"{phase:34s}" + "".join(f"{m:>10s}" for m in meshes))
        for part in results[meshes[0]][phase]:
            print(f"  {part:32s}" + "".join(f"{results[m][phase].get(part, 0.0):10.1f}" for m in meshes))


if __name__ == "__main__":
    main()
