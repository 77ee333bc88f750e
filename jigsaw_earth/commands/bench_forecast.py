"""``jigsaw-earth bench forecast CONFIG --world-size N``: one forecast's latency on 1 and N ranks.

The config's model forecasting one init, one member, ``--steps`` steps on ``--grid``, as predict
runs it (every lead written to a scratch store, or none with ``--no-write``): 1 rank (1 thread) and
each ``lat × lon`` mesh of N ranks (or ``--meshes``), each run its own processes, interleaved over
``--repeats`` (``bench/forecast.py``). Prints the forecast loop's time, the speedup over 1 rank with
its range over the repeats, and where each run's time went; writes ``--json PATH``.
"""

from __future__ import annotations

import argparse
import os

from ..argtypes import one_input, parse_grid
from ..bench.forecast import format_forecast, run_forecast_bench
from .checked_write import write_json

__all__ = ["run_bench_forecast"]


def run_bench_forecast(args: argparse.Namespace) -> int:
    from ..bench.measure import metadata
    from ..config import load_config
    from ..config.parse import to_dict

    one_input(args.inputs, "bench forecast", "CONFIG file", "e.g. configs/benchmarks/scaling-small.yaml")
    if args.world_size < 2:
        raise ValueError(f"--world-size {args.world_size}: use 2 or more ranks")
    if args.steps < 1:
        raise ValueError(f"--steps {args.steps}: use 1 or more")
    repeats = 3 if args.repeats is None else args.repeats
    if repeats < 1:
        raise ValueError(f"--repeats {repeats}: use 1 or more")
    meshes = None
    if args.meshes:
        meshes = [parse_grid(m, "--meshes", example="2x1") for m in args.meshes.split(",")]
        bad = [f"{a}x{b}" for a, b in meshes if a * b != args.world_size]
        if bad:
            raise ValueError(f"--meshes {args.meshes}: {', '.join(bad)} is not {args.world_size} ranks")
    cfg = load_config(args.inputs[0], list(args.set or []))
    grid = parse_grid(args.grid or "128x256", "--grid", example="128x256")
    meta = metadata(args.argv, "cpu", cfg.training.precision, 1)
    result = run_forecast_bench(to_dict(cfg), args.world_size, grid, args.steps, repeats, not args.no_write,
                                meshes)  # fmt: skip
    meta["load_average_end"] = list(os.getloadavg())
    loads = ", ".join(f"{x[0]:.1f}" for x in result["load_average"])
    print(
        f"\n{cfg.model.name} {cfg.model.preset} on {grid[0]}x{grid[1]}: one init, {args.steps} steps, "
        f"{'every lead written' if not args.no_write else 'nothing written'}; {repeats} repeats, "
        f"load average {loads}\n{format_forecast(result)}"
    )
    if args.json:
        write_json(args.json, {"kind": "forecast", "meta": meta, "result": result}, "--json", "kind", "meta",
                   "result")  # fmt: skip
    return 0
