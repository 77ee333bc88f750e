"""``jigsaw-earth bench``: jigsaw layers and models against plain-PyTorch twins, and the matmul.

* ``bench layers`` / ``bench models``: equality check, then one-rank forward + backward time
  (interleaved with the twin), peak memory, and per-rank memory and bytes on ``--meshes``;
  prints a table and writes JSON (``--json``).
* ``bench report JSON... --out docs/benchmarks.md``: the markdown tables from those JSON files.
* ``bench matmul``: time and bytes of each distributed-matmul strategy on a mesh.
* ``bench strategies CONFIG --world-size N``: jigsaw against DDP, FSDP2 and tensor parallelism
  (``commands/bench_strategies.py``).
* ``bench scaling CONFIG --world-size N``: strong scaling of the trainer on 1 and N ranks, with the
  step breakdown and plan's prediction (``commands/bench_scaling.py``).
* ``bench io STORE --mesh LATxLON``: one training sample per rank through the tile reader against
  raw reads of the same bytes, tensorstore and zarr (``commands/bench_io.py``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from pathlib import Path

import torch

from ..distributed.comm import ledger
from ..distributed.matmul import (
    channel_bytes,
    channel_strategy,
    matmul_channels,
    matmul_tokens,
    token_bytes,
    token_strategy,
)
from ..distributed.mesh import DomainMesh, parse_mesh
from ..distributed.spawn import spawn
from ..layers.base import Domain

log = logging.getLogger(__name__)


def _names(values: list[str] | None) -> list[str]:
    return [n for v in values or [] for n in v.split(",") if n]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="jigsaw vs plain-PyTorch twins; distributed-matmul micro-benchmark")
    p.add_argument(
        "what",
        choices=["layers", "models", "all", "report", "matmul", "strategies", "scaling", "io"],
        help="what to benchmark",
    )
    p.add_argument(
        "inputs",
        nargs="*",
        type=Path,
        metavar="JSON",
        help="report: the bench JSON files; strategies, scaling: CONFIG; io: STORE",
    )
    p.add_argument(
        "--only", action="append", metavar="NAME[,NAME]", help="layers/models: cases (or prefixes)"
    )
    p.add_argument(
        "--quick", action="store_true", help="layers/models: small sizes (CI smoke); = --size quick"
    )
    p.add_argument(
        "--size",
        choices=["quick", "default", "large"],
        default="default",
        help="layers/models: case sizes (default: issue 9's; large: for a GPU)",
    )
    p.add_argument(
        "--meshes", default="2x2,1x4", help="layers/models: meshes for per-rank memory; 'none' skips"
    )
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="bf16: autocast")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--tolerance", type=float, default=1e-4, help="largest fp32 twin error accepted")
    p.add_argument("--out", type=Path, help="report: markdown file to write")
    p.add_argument("--mesh", default="2x2", metavar="LATxLON", help="matmul, io: the mesh")
    p.add_argument("--ranks", default="0", help="io: 'all' (one process each, reading at once) or ranks "
                   "measured alone, e.g. 0,3 (default 0)")
    p.add_argument("--lead-steps", type=int, default=1, help="io: target steps per sample (default 1)")
    p.add_argument("--halo", type=int, default=0,
                   help="io: halo width read around each tile, across the pole (default 0: as training)")
    p.add_argument("--read-threads", type=int, default=2, help="io: the reader's threads (default 2)")
    p.add_argument("--cache", choices=["warm", "cold", "both"], default="both",
                   help="io: page cache warm, dropped before each read, or both (default)")
    p.add_argument(
        "--grid", metavar="NLATxNLON", help="matmul: global token grid (64x128); strategies: the data grid"
    )
    p.add_argument("--world-size", type=int, default=4, help="strategies, scaling: ranks (default 4)")
    p.add_argument("--steps", type=int, default=5, help="scaling: measured steps per run (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="scaling: warm-up steps per run (default 2)")
    p.add_argument(
        "--strategies", default="jigsaw,ddp,fsdp2,tp,jigsaw_ddp", help="strategies: which to run (comma list)"
    )
    p.add_argument(
        "--variant", action="append", metavar="NAME:KEY=VALUE,...", help="strategies: also this model variant"
    )
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="strategies, scaling: config override")
    p.add_argument("--memory-budget", metavar="SIZE", help="strategies: largest grid within SIZE per rank")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--cin", type=int, default=256)
    p.add_argument("--cout", type=int, default=256)
    p.add_argument("--repeats", type=int, default=None, help="timed repeats (layers 7, models 5, matmul 5)")
    p.add_argument("--json", type=Path, metavar="PATH")
    p.set_defaults(run=run)


def _time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _bench(mesh: DomainMesh, grid: tuple[int, int], batch: int, cin: int, cout: int, repeats: int) -> dict:
    domain = Domain.create(mesh, *grid)
    counts, outs = domain.counts(batch), domain.split_sizes(cout)
    start, stop = domain.split(cout)
    x = torch.randn(counts[domain.index], cin, requires_grad=True)
    w = torch.randn(cin, stop - start, requires_grad=True)
    b = torch.randn(stop - start, requires_grad=True)
    tokens_a = torch.randn(counts[domain.index], sum(counts), requires_grad=True)
    result: dict = {
        "mesh": f"{mesh.shape.lat}x{mesh.shape.lon}",
        "grid": grid,
        "batch": batch,
        "cin": cin,
        "cout": cout,
        "channels": {},
        "tokens": {},
    }
    for strategy in ("weights", "activations"):

        def step(s=strategy) -> None:
            matmul_channels(x, w, b, domain.axis, outs, counts, s).sum().backward()

        ledger.reset()
        step()
        sent = ledger.bytes_sent
        result["channels"][strategy] = {
            "seconds": _time(step, repeats),
            "bytes_sent_rank": sent,
            "model_bytes_total": sum(channel_bytes(strategy, counts, cin, outs, True)),
        }

        def tstep(s=strategy) -> None:
            matmul_tokens(x, tokens_a, None, domain.axis, counts, counts, s).sum().backward()

        ledger.reset()
        tstep()
        sent = ledger.bytes_sent
        result["tokens"][strategy] = {
            "seconds": _time(tstep, repeats),
            "bytes_sent_rank": sent,
            "model_bytes_total": sum(token_bytes(strategy, counts, counts, cin)),
        }
    result["channels"]["auto_choice"] = channel_strategy("auto", counts, cin, outs, True)
    result["tokens"]["auto_choice"] = token_strategy("auto", counts, counts, cin)
    return result


def run(args: argparse.Namespace) -> int:
    if args.what in ("layers", "models", "all"):
        return _run_cases(args)
    if args.what == "report":
        return _run_report(args)
    if args.what == "strategies":
        from .bench_strategies import run_strategies

        return run_strategies(args)
    if args.what == "scaling":
        from .bench_scaling import run_bench_scaling

        return run_bench_scaling(args)
    if args.what == "io":
        from .bench_io import run_io

        return run_io(args)
    if args.inputs:
        raise ValueError(f"bench {args.what} takes no positional files, got {[str(p) for p in args.inputs]}")
    args.repeats = args.repeats or 5
    shape = parse_mesh(args.mesh)
    grid = tuple(int(v) for v in (args.grid or "64x128").lower().split("x"))
    if len(grid) != 2:
        raise ValueError(f"--grid {args.grid!r}: write NLATxNLON, e.g. 64x128")
    out = spawn(shape, _bench, grid, args.batch, args.cin, args.cout, args.repeats)[0]
    for form in ("channels", "tokens"):
        for strategy in ("weights", "activations"):
            r = out[form][strategy]
            print(
                f"{form:<9} {strategy:<12} fwd+bwd {r['seconds'] * 1e3:9.2f} ms   "
                f"rank-0 sent {r['bytes_sent_rank']:>12,d} B   "
                f"all ranks (model) {r['model_bytes_total']:>12,d} B"
            )
        print(f"{form:<9} auto picks {out[form]['auto_choice']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


def _run_cases(args: argparse.Namespace) -> int:
    from ..bench.measure import metadata
    from ..bench.report import format_table
    from ..bench.run import run_cases

    if args.inputs:
        raise ValueError(f"bench {args.what} takes no positional files; write JSON with --json PATH")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available here; use --device cpu")
    if args.threads < 1:
        raise ValueError(f"--threads {args.threads}: use 1 or more")
    meshes = [] if args.meshes == "none" else [m for m in args.meshes.split(",") if m]
    for m in meshes:
        parse_mesh(m)  # fails early on a bad shape
    if args.what == "all" and args.only:
        raise ValueError("--only picks cases of one kind: use it with bench layers or bench models")
    if args.repeats is not None and args.repeats < 1:
        raise ValueError(f"--repeats {args.repeats}: use 1 or more")
    size = "quick" if args.quick else args.size
    torch.set_num_threads(args.threads)
    meta = metadata(args.argv, args.device, args.dtype, args.threads)
    results = []
    for kind in ("layers", "models") if args.what == "all" else (args.what,):
        repeats = args.repeats or (7 if kind == "layers" else 5)
        for r in run_cases(
            kind, size, _names(args.only), repeats, args.device, args.dtype, meshes, args.tolerance
        ):
            results.append({"kind": kind, **r})
    meta["load_average_end"] = list(os.getloadavg())
    print(format_table(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        data = {"kind": args.what, "quick": size == "quick", "size": size, "meta": meta, "results": results}
        tmp = args.json.with_suffix(args.json.suffix + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(args.json)
        log.info("wrote %s", args.json)
    return 0


def _run_report(args: argparse.Namespace) -> int:
    from ..bench.report import load_results, markdown

    if not args.inputs:
        raise ValueError("bench report needs the JSON files written by bench layers/models --json")
    runs = [(str(p), load_results(p)) for p in args.inputs]
    command = "jigsaw-earth bench report " + " ".join(str(p) for p in args.inputs)
    if args.out:
        command += f" --out {args.out}"
    text = markdown(runs, command)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        log.info("wrote %s", args.out)
    else:
        print(text)
    return 0
