"""``jigsaw-earth bench strategies CONFIG --world-size N``: the config's model under jigsaw, DDP,
FSDP2, DTensor tensor parallelism and jigsaw × DDP, measured in one process group (gloo, CPU).

``--variant NAME:key=value,...`` adds the same model with other ``model.overrides`` (e.g. a
10× larger one) to the same run; ``--memory-budget 64MiB`` adds the largest grid each strategy
trains within that per-rank budget. Writes a table and ``--json PATH`` (``bench report`` renders it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

import torch

from ..argtypes import one_input, parse_bytes, parse_grid, parse_list
from ..bench.strategies import STRATEGIES
from .checked_write import write_json

__all__ = ["parse_variant", "run_strategies"]

log = logging.getLogger(__name__)


def _value(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_variant(text: str) -> tuple[str, dict]:
    """``wide:embed_dim=384,channel_hidden=1536`` → ``("wide", {...})``."""
    name, sep, body = text.partition(":")
    pairs = [p for p in body.split(",") if p]
    if not sep or not name or not pairs or any("=" not in p for p in pairs):
        raise ValueError(f"--variant {text!r}: write NAME:key=value[,key=value], e.g. wide:embed_dim=384")
    return name, {k.strip(): _value(v.strip()) for k, v in (p.split("=", 1) for p in pairs)}


def _grid(args: argparse.Namespace, cfg) -> tuple[int, int]:
    if args.grid:
        return parse_grid(args.grid)
    store = Path(cfg.data.store)
    if store.exists():
        from ..data.store import StoreView

        return tuple(StoreView.open(str(store)).grid_shape)
    log.info("bench strategies: store %s not found; using the synthetic store's grid 32x64", store)
    return 32, 64


def _check(args: argparse.Namespace) -> list[str]:
    one_input(args.inputs, "bench strategies", "CONFIG file", "e.g. configs/demo.yaml")
    if args.world_size < 2 or args.world_size % 2:
        raise ValueError(
            f"--world-size {args.world_size}: use an even number >= 2 (jigsaw x DDP needs 2 replicas)"
        )
    names = parse_list(args.strategies)
    bad = [n for n in names if n not in STRATEGIES]
    if bad or not names:
        raise ValueError(f"--strategies {args.strategies!r}: use names from {', '.join(STRATEGIES)}")
    if args.repeats is not None and args.repeats < 0:
        raise ValueError(f"--repeats {args.repeats}: use 0 or more")
    return names


SPLIT = ("parameters", "gradients", "optimizer", "activations")


def format_rows(run: dict) -> str:
    head = ("strategy", "peak/rank MiB", "params", "grads", "optim", "activ", "vs DDP", "read/sample KiB",
            "vs DDP", "sent/rank KiB", "analytic KiB", "ratio", "step s", "samples/s", "loss")  # fmt: skip
    lines = [head]
    mib, kib = 2**20, 2**10
    for r in run["rows"]:
        m = r["memory"]
        cells = [r["strategy"], *(f"{m[k] / mib:.2f}" for k in ("peak", *SPLIT))]
        cells += [
            f"{r.get('peak_vs_ddp', 0):.2f}",
            f"{r['bytes_read'] / kib:.1f}",
            f"{r.get('read_vs_ddp', 0):.2f}",
        ]
        cells += [f"{r['bytes_sent_mean'] / kib:.1f}", f"{r['analytic_bytes_mean'] / kib:.1f}"]
        cells += [f"{r['comm_ratio']:.3f}" if r["comm_ratio"] else "-", f"{r['step_s']:.3f}"]
        cells += [f"{r['samples_per_s']:.1f}", f"{r['loss']:.6f}"]
        lines.append(tuple(cells))
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in lines)


def run_strategies(args: argparse.Namespace) -> int:
    from ..bench.measure import metadata
    from ..bench.strategy_bench import default_unit, largest_grids, problem_from_config, run_problem
    from ..config import load_config

    names = _check(args)
    budget = None
    if args.memory_budget:
        budget = parse_bytes(args.memory_budget, "--memory-budget", "64MiB, 2GiB or 500000")
    variants = [parse_variant(v) for v in args.variant or []]
    cfg = load_config(args.inputs[0], list(args.set or []))
    grid = _grid(args, cfg)
    repeats = 5 if args.repeats is None else args.repeats
    torch.set_num_threads(1)
    meta = metadata(args.argv, "cpu", "fp32", 1)
    runs = []
    for label, extra in [(Path(args.inputs[0]).stem, {}), *variants]:
        problem, spec = problem_from_config(cfg, grid, extra)
        log.info("bench strategies: %s (%s, %s) on %dx%d, world size %d", label, problem.model,
                 problem.overrides, *grid, args.world_size)  # fmt: skip
        run = {"label": label, **run_problem(problem, spec, args.world_size, names, repeats)}
        print(f"\n{label}: {run['parameters']:,} parameters, grid {grid[0]}x{grid[1]}, "
              f"global batch {run['global_batch']}\n{format_rows(run)}")  # fmt: skip
        runs.append(run)
    if budget is not None:
        problem, _ = problem_from_config(cfg, grid)
        unit = default_unit(problem, args.world_size)
        found = largest_grids(problem, args.world_size, names, budget, unit)
        runs[0]["budget"] = {
            "bytes": budget,
            "text": args.memory_budget,
            "unit_rows": unit,
            "strategies": found,
        }
        for name, f in found.items():
            print(
                f"largest grid within {args.memory_budget}: {name:<10} {f['grid'][0]}x{f['grid'][1]} "
                f"(confirmed peak {f['confirmed_peak'] / 2**20:.2f} MiB, fits: {f['fits']})"
            )
    meta["load_average_end"] = list(os.getloadavg())
    if args.json:
        doc = {"kind": "strategies", "meta": meta, "results": runs}
        write_json(args.json, doc, "--json", "kind", "meta", "results")
    return 0
