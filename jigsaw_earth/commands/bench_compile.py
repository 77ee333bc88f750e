"""``jigsaw-earth bench compile CONFIG``: the trainer compiled against the trainer eager, per mesh.

On each ``--meshes`` mesh (its ranks spawned, one thread each) an eager and a compiled trainer of
the config take ``--steps`` steps, interleaved (``bench/compile.py``). Prints, per mesh, the eager
and compiled step time (median over the steps after ``--warmup``), compiled ÷ eager, the largest
loss difference, what Dynamo compiled (graphs, graph breaks, recompiles, the last step that
compiled anything) and every graph-break place with its reason; ``--json PATH`` keeps it all.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..argtypes import one_input, parse_grid, parse_list
from ..bench.compile import format_compile_bench, run_compile_bench
from ..device import check_device_option
from ..distributed.mesh import parse_mesh
from .checked_write import write_json

__all__ = ["add_compile_parser", "run_bench_compile"]

BACKENDS = ("inductor", "aot_eager", "eager")


def add_compile_parser(kinds: argparse._SubParsersAction) -> None:
    c = kinds.add_parser("compile", help="the trainer compiled (torch.compile) against eager, per mesh")
    c.add_argument("inputs", nargs="*", metavar="CONFIG", help="the training config")
    c.add_argument("--meshes", default="1x1,1x2,2x2", help="LATxLON meshes, a run each (default 1x1,1x2,2x2)")
    c.add_argument("--steps", type=int, default=20, help="steps of each trainer (default 20)")
    c.add_argument("--warmup", type=int, default=3, help="steps left out of the timing (default 3)")
    c.add_argument(
        "--backend",
        choices=BACKENDS,
        default="inductor",
        help="torch.compile backend: inductor (training.compile's), aot_eager or eager (Dynamo's graphs, "
        "breaks and recompiles without generating code: quick)",
    )
    c.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="the ranks' device (default cpu)")
    c.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override")
    c.add_argument("--grid", metavar="NLATxNLON", help="random in-memory data on this grid, not the store's")
    c.add_argument("--json", type=Path, metavar="PATH", help="write the results as JSON")


def run_bench_compile(args: argparse.Namespace) -> int:
    from ..bench.measure import metadata
    from ..config import load_config
    from ..config.parse import to_dict

    one_input(args.inputs, "bench compile", "CONFIG file", "e.g. configs/demo.yaml")
    check_device_option(args.device)  # before any rank is spawned
    if args.steps < 2:
        raise ValueError(f"--steps {args.steps}: use 2 or more (the first compiles)")
    if not 0 <= args.warmup < args.steps:
        raise ValueError(f"--warmup {args.warmup}: use 0 to --steps - 1 = {args.steps - 1}")
    meshes = [parse_mesh(m) for m in parse_list(args.meshes, "--meshes", example="1x1,1x2,2x2")]
    for m in meshes:
        if m.data != 1 or m.ensemble != 1:
            raise ValueError(f"--meshes {args.meshes!r}: write LATxLON meshes (e.g. 2x2), got {m.describe()}")
    cfg = load_config(args.inputs[0], list(args.set or []))
    grid = list(parse_grid(args.grid)) if args.grid else None
    meta = metadata(args.argv, args.device, cfg.training.precision, 1)
    shapes = [(m.lat, m.lon) for m in meshes]
    result = run_compile_bench(to_dict(cfg), shapes, args.steps, args.warmup, args.backend, grid, args.device)
    meta["load_average_end"] = list(os.getloadavg())
    print(f"\n{cfg.model.name} {cfg.model.preset}, backend {args.backend}\n{format_compile_bench(result)}")
    if args.json:
        doc = {"kind": "compile", "meta": meta, "result": result}
        write_json(args.json, doc, "--json", "kind", "meta", "result")
    return 0
