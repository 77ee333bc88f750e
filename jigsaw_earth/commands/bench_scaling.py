"""``jigsaw-earth bench scaling CONFIG --world-size N``: strong scaling of the trainer.

The config's model and global batch trained as 1 rank (1 thread), 1 rank (N threads), jigsaw on
every ``lat × lon`` mesh of N, DDP × N and jigsaw × DDP, each run its own processes, interleaved
over ``--repeats`` (``bench/scaling.py``). Prints a table (samples/s, speedup over 1 rank with
1 thread and its range over the repeats, efficiency, the step breakdown, CPU seconds per step
summed over ranks, plan's predicted step) and writes ``--json PATH`` (``bench report`` renders it
with ``bench/scaling_report.py``).
"""

from __future__ import annotations

import argparse
import logging
import os

from ..argtypes import one_input
from ..bench.scaling import run_scaling
from ..bench.scaling_report import format_scaling
from .checked_write import write_json

__all__ = ["run_bench_scaling"]

log = logging.getLogger(__name__)


def run_bench_scaling(args: argparse.Namespace) -> int:
    from ..bench.measure import metadata
    from ..config import load_config
    from ..config.parse import to_dict
    from .bench_strategies import _grid

    one_input(args.inputs, "bench scaling", "CONFIG file", "e.g. configs/demo.yaml")
    if args.world_size < 2:
        raise ValueError(f"--world-size {args.world_size}: use 2 or more ranks")
    for name in ("steps", "warmup"):
        if getattr(args, name) < (1 if name == "steps" else 0):
            raise ValueError(f"--{name} {getattr(args, name)}: use {'1' if name == 'steps' else '0'} or more")
    repeats = 3 if args.repeats is None else args.repeats
    if repeats < 1:
        raise ValueError(f"--repeats {repeats}: use 1 or more")
    cfg = load_config(args.inputs[0], list(args.set or []))
    grid = _grid(args, cfg)
    meta = metadata(args.argv, "cpu", cfg.training.precision, 1)
    result = run_scaling(to_dict(cfg), args.world_size, grid, repeats, args.warmup, args.steps)
    meta["load_average_end"] = list(os.getloadavg())
    print(
        f"\n{cfg.model.name} {cfg.model.preset} on {grid[0]}x{grid[1]}, "
        f"global batch {result['global_batch']}, {args.world_size} ranks\n{format_scaling(result)}"
    )
    if args.json:
        doc = {"kind": "scaling", "meta": meta, "result": result}
        write_json(args.json, doc, "--json", "kind", "meta", "result")
    return 0
