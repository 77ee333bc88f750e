"""``jigsaw-earth bench``: jigsaw layers and models against plain-PyTorch twins, and the matmul.

* ``bench layers`` / ``bench models``: equality check, then one-rank forward + backward time
  (interleaved with the twin), peak memory, and per-rank memory and bytes on ``--meshes``;
  prints a table and writes JSON (``--json``). ``--parts`` (models): the time of each layer of
  the model and of its twin, and of rank 0 on each mesh (``bench/parts.py``).
* ``bench report JSON... --out docs/benchmarks.md``: the markdown tables from those JSON files.
* ``bench matmul``: time and bytes of each distributed-matmul strategy on a mesh.
* ``bench strategies CONFIG --world-size N``: jigsaw against DDP, FSDP2 and tensor parallelism
  (``commands/bench_strategies.py``).
* ``bench scaling CONFIG --world-size N``: strong scaling of the trainer on 1 and N ranks, with the
  step breakdown and plan's prediction (``commands/bench_scaling.py``).
* ``bench forecast CONFIG --world-size N``: one forecast (one init, one member) on 1 and N ranks,
  as predict runs it, with where its time went (``commands/bench_forecast.py``).
* ``bench compile CONFIG --meshes 1x1,1x2,2x2``: the trainer compiled against eager, step by step:
  compiled ÷ eager step time, loss agreement, graph breaks and recompiles (``commands/bench_compile.py``).
* ``bench io STORE --mesh LATxLON``: one training sample per rank through the tile reader against
  raw reads of the same bytes, tensorstore and zarr (``commands/bench_io.py``).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import statistics
import time
from pathlib import Path

import torch

from ..argtypes import parse_grid, parse_list
from ..bench.cases import SIZES
from ..device import check_device_option
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
from ..ownership import check_file_output, text_with
from .bench_compile import add_compile_parser
from .checked_write import check_json, write_json, write_text

log = logging.getLogger(__name__)


def _json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", type=Path, metavar="PATH", help="write the results as JSON")


def _cases_parser(kinds: argparse._SubParsersAction, name: str, help: str) -> None:
    p = kinds.add_parser(name, help=help)
    p.add_argument("--only", action="append", metavar="NAME[,NAME]", help="cases (or name prefixes) to run")
    p.add_argument("--quick", action="store_true", help="small sizes (CI smoke); = --size quick")
    p.add_argument(
        "--size",
        choices=SIZES,
        default="default",
        help="case sizes: quick (CI smoke), default (layers on a 64x128 grid with 64 channels, models "
        "on 64x128 to 128x256 grids at small widths: a CPU run), large (256x512 grids, wider: a GPU)",
    )
    p.add_argument(
        "--meshes", default="2x2,1x4", help="meshes for per-rank memory (default 2x2,1x4); 'none' skips"
    )
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="default cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="bf16: autocast (default fp32)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--tolerance", type=float, default=1e-4, help="largest fp32 twin error accepted (1e-4)")
    p.add_argument("--repeats", type=int, help="timed repeats (default: layers 7, models 5)")
    p.add_argument(
        "--parts",
        action="store_true",
        help="models: forward and backward ms of each layer (jigsaw, twin, rank 0 of each mesh)",
    )
    _json(p)
    p.set_defaults(inputs=[])


def _config_flags(p: argparse.ArgumentParser) -> None:
    """Flags of the runs that train a config's model: strategies, scaling."""
    p.add_argument("inputs", nargs="*", type=Path, metavar="CONFIG", help="the training config")
    p.add_argument("--world-size", type=int, default=4, help="ranks (default 4)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override")
    p.add_argument("--grid", metavar="NLATxNLON", help="the data grid (default: the config's store's)")
    _json(p)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="jigsaw vs plain-PyTorch twins; distributed-matmul micro-benchmark")
    kinds = p.add_subparsers(dest="what", required=True, metavar="WHAT")
    _cases_parser(kinds, "layers", "each jigsaw layer against its plain-PyTorch twin")
    _cases_parser(kinds, "models", "each model against its plain-PyTorch twin")
    _cases_parser(kinds, "all", "layers, then models")

    r = kinds.add_parser("report", help="markdown tables from bench JSON files")
    r.add_argument("inputs", nargs="*", type=Path, metavar="JSON", help="the bench JSON files")
    r.add_argument("--out", type=Path, help="markdown file to write (default: print)")

    m = kinds.add_parser("matmul", help="time and bytes of each distributed-matmul strategy on a mesh")
    m.add_argument("--mesh", default="2x2", metavar="LATxLON", help="the mesh (default 2x2)")
    m.add_argument("--grid", default="64x128", metavar="NLATxNLON", help="global token grid (default 64x128)")
    m.add_argument("--batch", type=int, default=1, help="samples (default 1)")
    m.add_argument("--cin", type=int, default=256, help="input channels (default 256)")
    m.add_argument("--cout", type=int, default=256, help="output channels (default 256)")
    m.add_argument("--repeats", type=int, default=5, help="timed repeats (default 5)")
    _json(m)
    m.set_defaults(inputs=[])

    st = kinds.add_parser("strategies", help="jigsaw against DDP, FSDP2 and tensor parallelism")
    _config_flags(st)
    st.add_argument("--strategies", default="jigsaw,ddp,fsdp2,tp,jigsaw_ddp", help="comma list (default all)")
    st.add_argument(
        "--variant", action="append", metavar="NAME:KEY=VALUE,...", help="also this model variant"
    )
    st.add_argument("--memory-budget", metavar="SIZE", help="largest grid within SIZE per rank, e.g. 64MiB")
    st.add_argument("--repeats", type=int, help="timed steps per strategy (default 5; 0: none)")

    sc = kinds.add_parser("scaling", help="strong scaling of the trainer on 1 and N ranks")
    _config_flags(sc)
    sc.add_argument("--steps", type=int, default=5, help="measured steps per run (default 5)")
    sc.add_argument("--warmup", type=int, default=2, help="warm-up steps per run (default 2)")
    sc.add_argument("--repeats", type=int, help="interleaved repeats (default 3)")

    fc = kinds.add_parser("forecast", help="one forecast's latency on 1 and N ranks, as predict runs it")
    _config_flags(fc)
    fc.add_argument("--steps", type=int, default=40, help="model steps of the forecast (default 40)")
    fc.add_argument("--meshes", metavar="LATxLON[,...]", help="the meshes of N ranks (default: every one)")
    fc.add_argument("--no-write", action="store_true", help="write nothing (default: every lead)")
    fc.add_argument("--repeats", type=int, help="interleaved repeats (default 3)")
    add_compile_parser(kinds)

    io = kinds.add_parser("io", help="a training sample per rank through the tile reader, against raw reads")
    io.add_argument("inputs", nargs="*", metavar="STORE", help="the Zarr store (a path or a bucket URL)")
    io.add_argument("--mesh", default="2x2", metavar="LATxLON", help="the mesh (default 2x2)")
    io.add_argument(
        "--ranks",
        default="0",
        help="'all' (one process each, reading at once) or ranks measured alone, e.g. 0,3 (default 0)",
    )
    io.add_argument("--lead-steps", type=int, default=1, help="target steps per sample (default 1)")
    io.add_argument(
        "--halo",
        type=int,
        default=0,
        help="halo width read around each tile, across the pole (default 0: as training)",
    )
    io.add_argument(
        "--read-threads",
        type=int,
        help="the reader's threads (default 2; from a bucket: data.read_threads' auto, the requests in "
        "flight)",
    )
    io.add_argument(
        "--no-hedge",
        action="store_true",
        help="from a bucket: never send a slow request again (default: hedge)",
    )
    io.add_argument(
        "--cache",
        choices=["warm", "cold", "both"],
        default="both",
        help="page cache warm, dropped before each read, or both (default)",
    )
    io.add_argument("--repeats", type=int, help="timed repeats (default 5)")
    _json(io)
    p.set_defaults(run=run)


def _time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _measure(step, repeats: int, model_bytes: int) -> dict:
    """This rank's bytes of one ``step`` (the ledger), then its median time over ``repeats``."""
    ledger.reset()
    step()
    sent = ledger.bytes_sent
    return {"seconds": _time(step, repeats), "bytes_sent_rank": sent, "model_bytes_total": model_bytes}


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

        model_bytes = sum(channel_bytes(strategy, counts, cin, outs, True))
        result["channels"][strategy] = _measure(step, repeats, model_bytes)

        def tstep(s=strategy) -> None:
            matmul_tokens(x, tokens_a, None, domain.axis, counts, counts, s).sum().backward()

        result["tokens"][strategy] = _measure(tstep, repeats, sum(token_bytes(strategy, counts, counts, cin)))
    result["channels"]["auto_choice"] = channel_strategy("auto", counts, cin, outs, True)
    result["tokens"]["auto_choice"] = token_strategy("auto", counts, counts, cin)
    return result


#: what each bench's ``--json`` holds (how an earlier one is recognised before it is replaced)
JSON_KEYS = {
    "layers": ("kind", "meta", "results"),
    "models": ("kind", "meta", "results"),
    "all": ("kind", "meta", "results"),
    "strategies": ("kind", "meta", "results"),
    "scaling": ("kind", "meta", "result"),
    "forecast": ("kind", "meta", "result"),
    "compile": ("kind", "meta", "result"),
    "io": ("ranks", "cache"),
    "matmul": ("channels", "tokens"),
}
REPORT_MARK = "jigsaw-earth bench report"
#: the benches run by a module of their own (imported when asked for): its name and function
RUNNERS = {
    "strategies": ("bench_strategies", "run_strategies"),
    "scaling": ("bench_scaling", "run_bench_scaling"),
    "forecast": ("bench_forecast", "run_bench_forecast"),
    "compile": ("bench_compile", "run_bench_compile"),
    "io": ("bench_io", "run_io"),
}


def run(args: argparse.Namespace) -> int:
    check_json(getattr(args, "json", None), "--json", *JSON_KEYS.get(args.what, ()))
    if args.what == "report" and args.out:
        check_file_output(args.out, "--out", "bench report", text_with(REPORT_MARK))
    if args.what in ("layers", "models", "all"):
        return _run_cases(args)
    if args.what == "report":
        return _run_report(args)
    if args.what in RUNNERS:
        module, function = RUNNERS[args.what]
        return getattr(importlib.import_module(f".{module}", __package__), function)(args)
    if args.inputs:
        raise ValueError(f"bench {args.what} takes no positional files, got {[str(p) for p in args.inputs]}")
    if args.repeats < 1:
        raise ValueError(f"--repeats {args.repeats}: use 1 or more")
    shape = parse_mesh(args.mesh)
    grid = parse_grid(args.grid, example="64x128")
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
        write_json(args.json, out, "--json", *JSON_KEYS["matmul"])
    return 0


def _run_cases(args: argparse.Namespace) -> int:
    from ..bench.measure import metadata
    from ..bench.report import format_parts, format_table
    from ..bench.run import run_cases

    if args.inputs:
        raise ValueError(f"bench {args.what} takes no positional files; write JSON with --json PATH")
    check_device_option(args.device)
    if args.threads < 1:
        raise ValueError(f"--threads {args.threads}: use 1 or more")
    meshes = [] if args.meshes == "none" else parse_list(args.meshes)
    for m in meshes:
        parse_mesh(m)  # fails early on a bad shape
    if args.what == "all" and args.only:
        raise ValueError("--only picks cases of one kind: use it with bench layers or bench models")
    if args.parts and args.what == "layers":
        raise ValueError("--parts times the layers of a model: use it with bench models or bench all")
    if args.repeats is not None and args.repeats < 1:
        raise ValueError(f"--repeats {args.repeats}: use 1 or more")
    size = "quick" if args.quick else args.size
    torch.set_num_threads(args.threads)
    meta = metadata(args.argv, args.device, args.dtype, args.threads)
    results = []
    for kind in ("layers", "models") if args.what == "all" else (args.what,):
        repeats = args.repeats or (7 if kind == "layers" else 5)
        parts = args.parts and kind == "models"
        for r in run_cases(
            kind, size, parse_list(args.only), repeats, args.device, args.dtype, meshes, args.tolerance, parts
        ):
            results.append({"kind": kind, **r})
    meta["load_average_end"] = list(os.getloadavg())
    print(format_table(results))
    for r in results:
        if "parts" in r:
            print(f"\n{r['name']}: ms per step by layer (median of {repeats})\n{format_parts(r['parts'])}")
    if args.json:
        data = {"kind": args.what, "quick": size == "quick", "size": size, "meta": meta, "results": results}
        write_json(args.json, data, "--json", *JSON_KEYS[args.what])
    return 0


def _run_report(args: argparse.Namespace) -> int:
    from ..bench.report import load_results, markdown

    if not args.inputs:
        raise ValueError("bench report needs the JSON files written by bench layers/models --json")
    runs = [(str(p), load_results(p)) for p in args.inputs]
    command = f"{REPORT_MARK} " + " ".join(str(p) for p in args.inputs)
    if args.out:
        command += f" --out {args.out}"
    text = markdown(runs, command)
    if args.out:
        write_text(args.out, text, "--out", "bench report", text_with(REPORT_MARK))
    else:
        print(text)
    return 0
