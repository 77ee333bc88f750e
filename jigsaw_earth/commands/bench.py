"""``jigsaw-earth bench matmul``: time and bytes of each distributed-matmul strategy on a mesh."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from ..distributed.comm import ledger
from ..distributed.matmul import channel_bytes, choose, matmul_channels, matmul_tokens, token_bytes
from ..distributed.mesh import DomainMesh, parse_mesh
from ..distributed.spawn import spawn
from ..layers.base import Domain


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="micro-benchmarks of the distributed core")
    p.add_argument("what", choices=["matmul"], help="what to benchmark")
    p.add_argument("--mesh", default="2x2", metavar="LATxLON")
    p.add_argument("--grid", default="64x128", metavar="NLATxNLON", help="global token grid")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--cin", type=int, default=256)
    p.add_argument("--cout", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
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
    costs = {s: channel_bytes(s, counts, cin, outs, True) for s in ("weights", "activations")}
    result["channels"]["auto_choice"] = choose(costs, training=True)
    costs = {s: token_bytes(s, counts, counts, cin) for s in ("weights", "activations")}
    result["tokens"]["auto_choice"] = choose(costs, training=True)
    return result


def run(args: argparse.Namespace) -> int:
    shape = parse_mesh(args.mesh)
    grid = tuple(int(v) for v in args.grid.lower().split("x"))
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
