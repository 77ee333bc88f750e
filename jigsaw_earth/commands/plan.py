"""``jigsaw-earth plan``: which ``data × lat × lon`` mesh to train a model on, and why.

Every factorisation of the world size is priced from the layers' own cost declarations
(``models.plan``): per-GPU memory, bytes per step by op, a roofline step time; the meshes that
fit are ranked by samples per second and the best is recommended with its reasons::

    jigsaw-earth plan --model weathermixer --preset 3b --grid 721x1440 --world-size 16 --gpu-memory 80GB
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from ..models import MODELS, make_config
from ..models.plan import Hardware, MeshPlan, plan_meshes, recommend

__all__ = ["add_parser", "parse_bytes", "run"]

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="rank the data × lat × lon meshes of a world size for a model")
    p.add_argument("--model", required=True, choices=MODELS, help="model name")
    p.add_argument("--preset", default="tiny", help="preset (tiny, small, 1b, 3b; default tiny)")
    p.add_argument("--grid", default="721x1440", metavar="NLATxNLON", help="global grid (default 721x1440)")
    p.add_argument("--world-size", type=int, required=True, metavar="N", help="number of GPUs")
    p.add_argument("--gpu-memory", default="80GB", metavar="SIZE", help="memory per GPU (default 80GB)")
    p.add_argument(
        "--gpu-tflops", type=float, metavar="X", help="peak TFLOP/s per GPU (H100: 495 fp32/TF32, 989 bf16)"
    )
    p.add_argument("--efficiency", type=float, default=0.5, help="fraction of the peak matmuls reach (0.5)")
    p.add_argument("--link-gbps", type=float, default=3600.0, metavar="Y", help="intra-node Gbit/s per GPU")
    p.add_argument("--inter-gbps", type=float, default=400.0, help="inter-node Gbit/s per GPU (400)")
    p.add_argument("--nodes", type=int, metavar="K", help="nodes (default: world size / 8, at least 1)")
    p.add_argument("--batch", type=int, default=1, help="samples per data replica per step (default 1)")
    p.add_argument(
        "--global-batch", type=int, metavar="G", help="samples per step, all replicas (replaces --batch)"
    )
    p.add_argument("--channels", default="69,2,4", metavar="STATE,STATIC,TIME", help="input channels")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="activations and messages")
    p.add_argument("--json", type=Path, metavar="PATH", help="write every mesh's figures as JSON")
    p.set_defaults(run=run)


def parse_bytes(text: str) -> int:
    """``80GB``, ``80 GiB``, ``8e10`` → bytes."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([KMGT]?I?B?)\s*", text, re.IGNORECASE)
    if not m or m.group(2).upper() not in _UNITS or float(m.group(1)) <= 0:
        raise ValueError(f"--gpu-memory {text!r}: write a size such as 80GB or 80GiB")
    size = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if size < 2**28:  # 256 MiB: smaller than any accelerator's memory, so a missing unit or a typo
        raise ValueError(f"--gpu-memory {text!r} is {size} bytes, less than any GPU holds; write the memory "
                         f"of one GPU with its unit, such as 80GB or 80GiB")
    return size


def _ints(text: str, sep: str, what: str, n: int, minimum: int) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.lower().split(sep))
    except ValueError:
        values = ()
    if len(values) != n or min(values) < minimum:
        raise ValueError(f"--{what} {text!r}: write {n} integers ≥ {minimum} separated by {sep!r}")
    return values


def _hardware(args: argparse.Namespace) -> Hardware:
    for name in ("world_size", "batch", "global_batch"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)}: use a positive integer")
    if args.gpu_tflops is None:
        args.gpu_tflops = 495.0 if args.precision == "fp32" else 989.0
    for name in ("gpu_tflops", "link_gbps", "inter_gbps"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)}: use a positive number")
    if not 0 < args.efficiency <= 1:
        raise ValueError(f"--efficiency {args.efficiency}: use a fraction in (0, 1]")
    nodes = args.nodes if args.nodes is not None else max(1, args.world_size // 8)
    if args.nodes is None and args.world_size % nodes:
        raise ValueError(f"--world-size {args.world_size} does not split over the default --nodes {nodes} "
                         f"(8 GPUs per node); pass --nodes K, K dividing {args.world_size} (e.g. --nodes 1)")
    if nodes < 1 or args.world_size % nodes:
        raise ValueError(f"--nodes {nodes}: use a positive divisor of --world-size {args.world_size}")
    return Hardware(
        memory=parse_bytes(args.gpu_memory),
        tflops=args.gpu_tflops,
        efficiency=args.efficiency,
        intra_gbps=args.link_gbps,
        inter_gbps=args.inter_gbps,
        gpus_per_node=args.world_size // nodes,
    )


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f}"


def _row(rank: str, p: MeshPlan) -> str:
    m = p.memory
    fit = f"{_gb(p.headroom)} free" if p.fits else f"short {_gb(-p.headroom)}"
    return (
        f"{rank:>4} {p.mesh:<9} {_gb(m['total']):>7} {_gb(m['parameters'] + m['optimizer']):>8} "
        f"{_gb(m['gradients']):>6} {_gb(m['activations'] + m['transient']):>6} {fit:>12} "
        f"{_gb(sum(p.comm.values())):>8} {p.compute_s * 1e3:>8.1f} {p.exposed_s * 1e3:>8.1f} "
        f"{p.step_s * 1e3:>8.1f} {p.samples_per_s:>9.2f}"
    )


def _print(args: argparse.Namespace, hw: Hardware, plans: list[MeshPlan]) -> None:
    nodes = args.world_size // hw.gpus_per_node
    batch = f"batch {args.batch} per data replica"
    if args.global_batch is not None:
        batch = f"global batch {args.global_batch} (split over the data replicas)"
    print(
        f"{args.model} {args.preset} on {args.grid}, {args.world_size} GPUs ({nodes} node(s) of "
        f"{hw.gpus_per_node}), {_gb(hw.memory)} GB each; {batch}, "
        f"{args.precision} activations and messages, fp32 parameters, gradients and AdamW moments"
    )
    print(
        f"assumed: matmuls at {hw.efficiency:.0%} of {hw.tflops:g} TFLOP/s; links at "
        f"{hw.link_efficiency:.0%} of {hw.intra_gbps:g} Gbit/s within a node and {hw.inter_gbps:g} "
        "Gbit/s between nodes; elementwise work not timed; per-layer time max(compute, ring "
        "comm) + halo/gather comm; gradient all-reduce after the backward; rank 0 (the largest share)"
    )
    print(
        f"{'rank':>4} {'mesh':<9} {'GB/GPU':>7} {'par+opt':>8} {'grads':>6} {'acts':>6} {'fit GB':>12} "
        f"{'comm GB':>8} {'comp ms':>8} {'expo ms':>8} {'step ms':>8} {'samples/s':>9}"
    )
    ranked = [p for p in plans if not p.error]
    for i, p in enumerate(ranked, start=1):
        print(_row(str(i) if p.fits else "-", p))
    for p in plans:
        if p.error:
            print(f"   - {p.mesh:<9} impossible: {p.error}")
    best, why = recommend(plans)
    if best is None:
        print("no recommendation: " + "; ".join(why))
        return
    print(f"recommended: {best.mesh} (data {best.data} × lat {best.lat} × lon {best.lon})")
    for reason in why:
        print(f"  - {reason}")
    print(f"  by layer kind on {best.mesh} (domain links {best.domain_link}, data links {best.data_link}):")
    for kind, t in sorted(best.kinds.items(), key=lambda kv: -kv[1]["step_s"]):
        print(
            f"    {kind:<16} compute {t.get('compute_s', 0) * 1e3:8.1f} ms  comm {t['comm_s'] * 1e3:8.1f} ms"
            f"  step {t['step_s'] * 1e3:8.1f} ms"
        )
    comm = ", ".join(f"{op} {_gb(n)}" for op, n in sorted(best.comm.items(), key=lambda kv: -kv[1]))
    print(f"  GB sent per GPU per step by op: {comm}")


def run(args: argparse.Namespace) -> int:
    grid = _ints(args.grid, "x", "grid", 2, 1)
    channels = _ints(args.channels, ",", "channels", 3, 0)
    if channels[0] < 1:
        raise ValueError(f"--channels {args.channels!r}: the state needs at least 1 channel")
    make_config(args.model, args.preset)  # an unknown preset is one error, not one per mesh
    hw = _hardware(args)
    elsize = 4 if args.precision == "fp32" else 2
    plans = plan_meshes(
        args.model, args.preset, (grid[0], grid[1]), args.world_size, channels, hw, args.batch, elsize,
        args.global_batch,
    )  # fmt: skip
    _print(args, hw, plans)
    if args.json:
        best, why = recommend(plans)
        doc = {
            "model": args.model,
            "preset": args.preset,
            "grid": list(grid),
            "world_size": args.world_size,
            "hardware": hw.__dict__,
            "batch": args.batch,
            "global_batch": args.global_batch,
            "precision": args.precision,
            "recommended": best.mesh if best else None,
            "reasons": why,
            "meshes": [p.as_dict() for p in plans],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1))
    return 0
