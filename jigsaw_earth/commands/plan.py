"""``jigsaw-earth plan``: which ``data × lat × lon`` mesh to train a model on, and why.

Every factorisation of the world size is priced from the layers' own cost declarations
(``models.plan``): per-GPU memory, bytes per step by op, a roofline step time; the meshes that
fit are ranked by samples per second and the best is recommended with its reasons::

    jigsaw-earth plan --model weathermixer --preset 3b --grid 721x1440 --world-size 16 --gpu-memory 80GB
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from ..argtypes import parse_bytes, parse_grid, parse_ints
from ..distributed.mesh import MeshShape
from ..models import make_config, model_entry
from ..models.plan import Hardware, MeshPlan, plan_meshes, recommend
from ..models.plan_eval import EvalPlan, plan_evaluation, writes
from .checked_write import check_json, write_json

__all__ = ["add_parser", "run"]

JSON_KEYS = ("model", "world_size", "meshes")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="rank the data × lat × lon meshes of a world size for a model")
    p.add_argument("--model", required=True, help="a registered model or package.module:Class")
    p.add_argument(
        "--preset", help="preset (tiny, small, 1b, 3b, paper-c1, paper-1.1b; default: the model's first)"
    )
    p.add_argument("--grid", default="721x1440", metavar="NLATxNLON", help="global grid (default 721x1440)")
    p.add_argument("--world-size", type=int, required=True, metavar="N", help="number of GPUs")
    p.add_argument("--gpu-memory", default="80GB", metavar="SIZE", help="memory per GPU (default 80GB)")
    p.add_argument(
        "--gpu-tflops", type=float, metavar="X", help="peak TFLOP/s per GPU (H100: 495 fp32/TF32, 989 bf16)"
    )
    p.add_argument("--efficiency", type=float, default=0.5, help="fraction of the peak matmuls reach (0.5)")
    p.add_argument(
        "--achieved-tflops", type=float, metavar="R",
        help="matmul TFLOP/s measured on one GPU (replaces --efficiency: efficiency = R / peak)",
    )  # fmt: skip
    p.add_argument(
        "--rate-curve", metavar="W:R,...",
        help="measured TFLOP/s R at forward work W (TFLOP per GPU per sample), e.g. the paper's one-GPU "
        "roofline 4:37.8,8:48.6,16:66.5; the rate at each mesh's work per GPU replaces the flat rate",
    )  # fmt: skip
    p.add_argument(
        "--crowded-rate", type=float, default=1.0, metavar="F",
        help="the fraction of its matmul rate a rank keeps while every rank of its node computes (1: "
        "GPUs; CPU hosts share memory: bench scaling measures it)",
    )  # fmt: skip
    p.add_argument("--link-gbps", type=float, default=3600.0, metavar="Y", help="intra-node Gbit/s per GPU")
    p.add_argument("--inter-gbps", type=float, default=400.0, help="inter-node Gbit/s per GPU (400)")
    p.add_argument("--nodes", type=int, metavar="K", help="nodes (default: world size / 8, at least 1)")
    p.add_argument("--batch", type=int, default=1, help="samples per data replica per step (default 1)")
    p.add_argument(
        "--global-batch", type=int, metavar="G", help="samples per step, all replicas (replaces --batch)"
    )
    p.add_argument(
        "--members",
        type=int,
        default=1,
        metavar="M",
        help="ensemble members per sample (training.members): also prices every ensemble axis dividing M "
        "and the world size, members batched per rank vs spread over groups (docs/ensembles.md)",
    )
    p.add_argument("--channels", default="69,2,4", metavar="STATE,STATIC,TIME", help="input channels")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="activations and messages")
    p.add_argument(
        "--read-gbps",
        type=float,
        metavar="X",
        help="float32 GB/s one rank's tile reader delivers: prices reading each batch (prefetched "
        "beside the step) and flags I/O-bound meshes",
    )
    p.add_argument(
        "--io-json",
        type=Path,
        metavar="PATH",
        help="take --read-gbps from a `jigsaw-earth bench io --json` file (the reader's median "
        "float32 GB/s delivered over ranks, warm cache, all ranks at once where measured)",
    )
    p.add_argument(
        "--evaluate",
        metavar="INITSxSTEPS",
        help="also size an evaluation: INITS initialisations × STEPS model steps, e.g. 732x40 "
        "(WB2 2020, 6 h steps to 10 days): time and bytes written",
    )
    p.add_argument("--eval-mesh", metavar="DxLATxLON", help="the evaluation's mesh (default: recommended)")
    p.add_argument("--eval-batch", type=int, metavar="B", help="inits per forward (default: what fits)")
    p.add_argument(
        "--write-gbps",
        type=float,
        default=1.0,
        metavar="X",
        help="GB/s one rank writes to the forecast store (default 1)",
    )
    p.add_argument("--json", type=Path, metavar="PATH", help="write every mesh's figures as JSON")
    p.set_defaults(run=run)


def _gpu_memory(text: str) -> int:
    """``--gpu-memory``: ``80GB``, ``80 GiB``, ``8e10`` → bytes, at least 256 MiB."""
    size = parse_bytes(text, "--gpu-memory", "80GB or 80GiB")
    if size < 2**28:  # 256 MiB: smaller than any accelerator's memory, so a missing unit or a typo
        raise ValueError(
            f"--gpu-memory {text!r} is {size} bytes, less than any GPU holds; write the memory "
            f"of one GPU with its unit, such as 80GB or 80GiB"
        )
    return size


def _hardware(args: argparse.Namespace) -> Hardware:
    for name in ("world_size", "batch", "global_batch", "members"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)}: use a positive integer")
    if args.gpu_tflops is None:
        args.gpu_tflops = 495.0 if args.precision == "fp32" else 989.0
    for name in ("gpu_tflops", "link_gbps", "inter_gbps"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)}: use a positive number")
    if args.achieved_tflops is not None:
        if not 0 < args.achieved_tflops <= args.gpu_tflops:
            raise ValueError(
                f"--achieved-tflops {args.achieved_tflops}: use a rate in (0, --gpu-tflops "
                f"{args.gpu_tflops:g}]"
            )
        args.efficiency = args.achieved_tflops / args.gpu_tflops
    if not 0 < args.efficiency <= 1:
        raise ValueError(f"--efficiency {args.efficiency}: use a fraction in (0, 1]")
    nodes = args.nodes if args.nodes is not None else max(1, args.world_size // 8)
    if args.nodes is None and args.world_size % nodes:
        raise ValueError(
            f"--world-size {args.world_size} does not split over the default --nodes {nodes} "
            f"(8 GPUs per node); pass --nodes K, K dividing {args.world_size} (e.g. --nodes 1)"
        )
    if not 0 < args.crowded_rate <= 1:
        raise ValueError(f"--crowded-rate {args.crowded_rate}: use a fraction in (0, 1]")
    if nodes < 1 or args.world_size % nodes:
        raise ValueError(f"--nodes {nodes}: use a positive divisor of --world-size {args.world_size}")
    return Hardware(
        memory=_gpu_memory(args.gpu_memory),
        tflops=args.gpu_tflops,
        efficiency=args.efficiency,
        intra_gbps=args.link_gbps,
        inter_gbps=args.inter_gbps,
        gpus_per_node=args.world_size // nodes,
        rate_curve=_rate_curve(args.rate_curve),
        crowded_rate=args.crowded_rate,
        read_gbps=_read_gbps(args),
    )


def _read_gbps(args: argparse.Namespace) -> float:
    """--read-gbps, or the reader's rate in a ``bench io --json`` file (0: reading not priced)."""
    if args.read_gbps is not None and args.io_json is not None:
        raise ValueError("--read-gbps and --io-json both give the read rate: pass one of them")
    if args.read_gbps is not None:
        if args.read_gbps <= 0:
            raise ValueError(f"--read-gbps {args.read_gbps}: use a positive number of GB/s")
        return args.read_gbps
    if args.io_json is None:
        return 0.0
    try:
        runs = json.loads(args.io_json.read_text())
        warm = [r for r in runs if r["cache"] == "warm"] or runs
        pick = next((r for r in warm if r["ranks"] == "all"), warm[0])
        return statistics.median(res["methods"]["reader"]["delivered_gbps"] for res in pick["results"])
    except (OSError, ValueError, KeyError, IndexError, TypeError) as err:
        raise ValueError(
            f"--io-json {str(args.io_json)!r}: not a `jigsaw-earth bench io --json` file "
            f"({type(err).__name__}: {err}); write one with jigsaw-earth bench io STORE "
            f"--mesh LATxLON --json PATH"
        ) from None


def _rate_curve(text: str | None) -> tuple[tuple[float, float], ...]:
    """``"4:37.8,8:48.6"`` → ``((4.0, 37.8), (8.0, 48.6))``; positive numbers, distinct works."""
    if not text:
        return ()
    try:
        pts = tuple((float(w), float(r)) for w, r in (item.split(":") for item in text.split(",")))
    except ValueError:
        pts = ()
    if not pts or min(min(pt) for pt in pts) <= 0 or len({w for w, _ in pts}) != len(pts):
        raise ValueError(
            f"--rate-curve {text!r}: write WORK:TFLOPS pairs of positive numbers with distinct works, "
            "separated by commas (e.g. 4:37.8,8:48.6,16:66.5)"
        )
    return pts


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
        + (f" {p.io_s * 1e3:>7.1f}{' I/O-bound' if p.io_bound else ''}" if p.io_s else "")
    )


def _print(args: argparse.Namespace, hw: Hardware, plans: list[MeshPlan]) -> None:
    nodes = args.world_size // hw.gpus_per_node
    batch = f"batch {args.batch} per data replica"
    if args.global_batch is not None:
        batch = f"global batch {args.global_batch} (split over the data replicas)"
    if args.members > 1:
        batch += f", {args.members} ensemble members per sample"
    print(
        f"{args.model} {args.preset} on {args.grid}, {args.world_size} GPUs ({nodes} node(s) of "
        f"{hw.gpus_per_node}), {_gb(hw.memory)} GB each; {batch}, "
        f"{args.precision} activations and messages, fp32 parameters, gradients and AdamW moments"
    )
    rate = f"{hw.efficiency:.0%} of {hw.tflops:g} TFLOP/s"
    if hw.rate_curve:
        rate = "the measured rate at each mesh's forward work per GPU (--rate-curve)"
    if hw.crowded_rate != 1.0:
        rate += f", times {hw.crowded_rate:g} where ranks share a node (--crowded-rate)"
    print(
        f"assumed: matmuls at {rate}; links at "
        f"{hw.link_efficiency:.0%} of {hw.intra_gbps:g} Gbit/s within a node and {hw.inter_gbps:g} "
        "Gbit/s between nodes; elementwise work not timed; per-layer time max(compute, ring "
        "comm) + halo/gather comm; gradient all-reduce after the backward; rank 0 (the largest share)"
        + (f"; reading at {hw.read_gbps:g} GB/s per rank, prefetched beside the step" if hw.read_gbps else "")
    )
    print(
        f"{'rank':>4} {'mesh':<9} {'GB/GPU':>7} {'par+opt':>8} {'grads':>6} {'acts':>6} {'fit GB':>12} "
        f"{'comm GB':>8} {'comp ms':>8} {'expo ms':>8} {'step ms':>8} {'samples/s':>9}"
        + (f" {'read ms':>7}" if hw.read_gbps else "")
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
    ens = f" × ensemble {best.ensemble}" if best.ensemble > 1 else ""
    batched = f"; {best.members // best.ensemble} member(s) batched per rank" if best.members > 1 else ""
    print(f"recommended: {best.mesh} (data {best.data}{ens} × lat {best.lat} × lon {best.lon}{batched})")
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


def _size(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _evaluation(args: argparse.Namespace, hw: Hardware, plans: list[MeshPlan], grid: tuple[int, ...],
                channels: tuple[int, ...], elsize: int) -> EvalPlan | None:  # fmt: skip
    """``--evaluate``: the evaluation's plan on ``--eval-mesh`` or the recommended mesh, printed."""
    if not args.evaluate:
        return None
    inits, steps = parse_ints(args.evaluate, "--evaluate", 2, example="732x40")
    if args.eval_batch is not None and args.eval_batch < 1:
        raise ValueError(f"--eval-batch {args.eval_batch}: use a positive integer")
    if args.write_gbps <= 0:
        raise ValueError(f"--write-gbps {args.write_gbps}: use a positive number of GB/s")
    if args.eval_mesh:
        d, lat, lon = parse_ints(args.eval_mesh, "--eval-mesh", 3, example="1x2x2")
        if d * lat * lon != args.world_size:
            raise ValueError(
                f"--eval-mesh {args.eval_mesh}: {d}×{lat}×{lon} = {d * lat * lon} ranks, not "
                f"--world-size {args.world_size}"
            )
        shape = MeshShape(d, lat, lon)
    else:
        best, _ = recommend(plans)
        if best is None:
            raise ValueError("no mesh fits for training, so none is recommended: pass --eval-mesh DxLATxLON")
        shape = MeshShape(best.data, best.lat, best.lon, ensemble=best.ensemble)
    e = plan_evaluation(
        args.model,
        args.preset,
        (grid[0], grid[1]),
        shape,
        channels,
        hw,
        inits=inits,
        steps=steps,
        writes=writes(channels[0], steps),
        batch=args.eval_batch,
        elsize=elsize,
        write_gbps=args.write_gbps,
        members=args.members,
    )
    if e.error:
        raise ValueError(f"--eval-mesh {e.mesh}: {e.error}")
    fit = "fits" if e.fits else "DOES NOT FIT"
    ens = ""
    if args.members > 1:
        per_rank = args.members // shape.ensemble
        ens = f" × {args.members} members ({per_rank} batched per rank, {e.rows} rows per forward)"
    print(f"evaluation: {inits} inits{ens} × {steps} steps on {e.mesh}, batch {e.batch} inits per data "
          f"replica ({_gb(e.memory['total'])} GB per GPU for the forward: {fit})")  # fmt: skip
    print(
        f"  forward of {e.rows} rows {e.forward_s * 1e3:.1f} ms; {inits * args.members * steps} model "
        f"steps in {e.time_s / 3600:.2f} h of forwards ({e.steps_per_s:.1f} steps/s)"
    )
    print(f"  written at {args.write_gbps:g} GB/s per rank beside the forward (the longer of the two):")
    for label, nbytes in e.written.items():
        print(f"    {label:<40} {_size(nbytes):>10}  {e.total_s[label] / 3600:8.2f} h")
    return e


def run(args: argparse.Namespace) -> int:
    check_json(args.json, "--json", *JSON_KEYS)
    grid = parse_grid(args.grid, example="721x1440")
    channels = parse_ints(args.channels, "--channels", 3, sep=",", minimum=0, example="69,2,4")
    if channels[0] < 1:
        raise ValueError(f"--channels {args.channels!r}: the state needs at least 1 channel")
    args.preset = args.preset or model_entry(args.model).default_preset
    make_config(args.model, args.preset)  # an unknown preset is one error, not one per mesh
    hw = _hardware(args)
    elsize = 4 if args.precision == "fp32" else 2
    plans = plan_meshes(
        args.model, args.preset, (grid[0], grid[1]), args.world_size, channels, hw, args.batch, elsize,
        args.global_batch, args.members,
    )  # fmt: skip
    _print(args, hw, plans)
    evaluation = _evaluation(args, hw, plans, grid, channels, elsize)
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
            "members": args.members,
            "precision": args.precision,
            "recommended": best.mesh if best else None,
            "reasons": why,
            "meshes": [p.as_dict() for p in plans],
            "evaluation": evaluation.as_dict() if evaluation else None,
        }
        write_json(args.json, doc, "--json", *JSON_KEYS)
    return 0
