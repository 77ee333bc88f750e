"""The ``bench strategies`` section of ``docs/benchmarks.md`` (from its JSON file)."""

from __future__ import annotations

from pathlib import Path

from ..argtypes import parse_grid

__all__ = ["strategies_markdown"]

HOLDS = {  # {n}: world size
    "jigsaw": "its tile of each sample; 1/{n} of the weights",
    "ddp": "whole samples, 1 per rank; all weights",
    "fsdp2": "whole samples, 1 per rank; 1/{n} of the weights",
    "tp": "the whole batch (replicated); MLP/token-mixing weights split",
    "jigsaw_ddp": "its 2/{n} tile of each sample; 2/{n} of the weights",
}

METHOD = [
    "One model and one data set under five strategies, each the real implementation: jigsaw on a",
    "`2x2` lat × lon mesh; the plain twin under `torch.nn.parallel.DistributedDataParallel`; under",
    "FSDP2 (`fully_shard` on every block, then the root); under Megatron-style tensor parallelism",
    "with DTensor (`parallelize_module`, `ColwiseParallel` on the first and `RowwiseParallel` on the",
    "second linear of every MLP and token mixing, replicated input); and jigsaw `1x2` × 2",
    "data-parallel replicas. All start from the same weights and reach the same loss and gradient",
    "norm (the *loss* column; `tests/test_bench_strategies.py` checks it). *Peak/rank*: the largest",
    "rank's peak of one training step (forward, backward, AdamW) on **one sample** per model replica:",
    "parameters, gradients and optimizer state are the tensors themselves (local shards);",
    "*activations* is the rest of the peak (saved activations, temporaries, FSDP's gathered",
    "parameters, the input); gradients are freed between steps as the trainer does, except DDP's,",
    "which are views of its persistent buckets. *Read/sample*: bytes the real tile reader reads",
    "from a synthetic store chunked along the jigsaw tiles for one sample (inputs + one target),",
    "most-reading rank.",
    "*Sent/rank/step*: measured at the collectives at the global batch (jigsaw: its comm ledger;",
    "DDP: a comm hook counting each bucket; FSDP2: its `torch.distributed` all-gathers and",
    "reduce-scatters; TP: DTensor's functional collectives), as ring volumes — all-reduce",
    "2(P−1)/P · n, all-gather and reduce-scatter (P−1)/P · n — beside the analytic minimum of the",
    "strategy: DDP one all-reduce of the gradients; FSDP2 every block's parameters gathered twice",
    "(forward, backward), the root's once, gradients reduce-scattered; TP one all-reduce per",
    "rowwise output and per colwise input gradient; jigsaw `models.summary` (+ the data-axis",
    "gradient all-reduce). *Step s*: median of interleaved steps at the global batch (= world",
    "size: DDP/FSDP2 1 sample per rank, TP and jigsaw 4 per group, jigsaw × DDP 2 per group);",
    "on the shared 2-core CPU these measure waiting as much as work (4 processes on 2 cores).",
    "*Plan/measured*: `jigsaw-earth plan`'s figures for the same mesh, model and batch (computed",
    "from the layers' declared costs, nothing run) over the measured peak and bytes sent.",
]


def _row(r: dict, world: int) -> str:
    m, mib, kib = r["memory"], 2**20, 2**10
    ratio = f"{r['comm_ratio']:.3f}" if r.get("comm_ratio") else "-"
    cells = [
        f"`{r['strategy']}`",
        HOLDS.get(r["strategy"], "").format(n=world),
        f"**{m['peak'] / mib:.2f}**",
        *(f"{m[k] / mib:.2f}" for k in ("parameters", "gradients", "optimizer", "activations")),
        f"**{r.get('peak_vs_ddp', float('nan')):.2f}**",
        f"{r['bytes_read'] / kib:.1f}",
        f"**{r.get('read_vs_ddp', float('nan')):.2f}**",
        f"{r['bytes_sent_mean'] / kib:,.0f}",
        f"{r['analytic_bytes_mean'] / kib:,.0f}",
        ratio,
        *_plan_cells(r),
        f"{r['step_s']:.3f}",
        f"{r['samples_per_s']:.1f}",
        f"{r['loss']:.6f}",
    ]
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "strategy", "each rank holds", "peak/rank MiB", "params", "grads", "optimizer", "activations",
    "peak vs DDP", "read/sample KiB", "read vs DDP", "sent/rank/step KiB", "analytic KiB",
    "measured/analytic", "plan/measured peak", "plan/measured sent", "step s", "samples/s", "loss",
)  # fmt: skip


def _plan_cells(r: dict) -> list[str]:
    """`jigsaw-earth plan`'s prediction over the measurement (jigsaw rows; '-' elsewhere)."""
    plan = r.get("plan")
    if not plan:
        return ["-", "-"]
    return [f"{plan['peak'] / r['memory']['peak']:.3f}", f"{plan['bytes_sent'] / r['bytes_sent_mean']:.3f}"]


def _budget(b: dict) -> list[str]:
    out = [
        "",
        f"#### Largest grid trained within {b['text']} per rank (one sample per replica)",
        "",
        f"Measured at two small grids, extended linearly in grid points, confirmed by a run at the "
        f"grid found (rows in steps of {b['unit_rows']}, the data grid's aspect).",
        "",
        "| strategy | measured (grid: MiB) | KiB per point | largest grid | confirmed MiB | next size up |",
        "|---|---|---|---|---|---|",
    ]
    for name, f in b["strategies"].items():
        measured = ", ".join(f"{g[0]}x{g[1]}: {p / 2**20:.2f}" for g, p in f["measured"])
        grid = f"{f['grid'][0]}x{f['grid'][1]}"
        out.append(
            f"| `{name}` | {measured} | {f['bytes_per_point'] / 2**10:.2f} | **{grid}** "
            f"| {f['confirmed_peak'] / 2**20:.2f}{'' if f['fits'] else ' (over)'} | {_next_up(f)} |"
        )
    return out


def _verdict(rows: list[dict]) -> list[str]:
    """Issue 10's criteria, read off the table (only where jigsaw, DDP, FSDP2 and TP all ran)."""
    by = {r["strategy"]: r for r in rows}
    if not all(k in by for k in ("jigsaw", "ddp", "fsdp2", "tp")):
        return []
    j, peak = by["jigsaw"], {k: by[k]["memory"]["peak"] for k in by}
    comm = [r["comm_ratio"] for r in rows if r.get("comm_ratio")]
    read = max(j["bytes_read"] / by[k]["bytes_read"] for k in ("ddp", "tp"))
    return [
        "",
        f"jigsaw's peak per rank is {peak['jigsaw'] / peak['ddp']:.3f}× DDP's, "
        f"{peak['jigsaw'] / peak['fsdp2']:.2f}× FSDP2's and {peak['jigsaw'] / peak['tp']:.2f}× TP's; "
        f"it reads {read:.3f}× the bytes per sample of DDP and TP; every strategy's measured bytes "
        f"per step are {min(comm):.3f}–{max(comm):.3f}× its analytic figure.",
    ]


def _next_up(f: dict) -> str:
    """The smallest grid run above the largest that fits, with its peak (it exceeded the budget)."""
    rows = int(f["grid"][0])
    tried = [(parse_grid(g, "tried grid")[0], g, p) for g, p in f.get("tried", {}).items()]
    above = sorted(t for t in tried if t[0] > rows)
    return f"{above[0][1]}: {above[0][2] / 2**20:.2f} MiB" if above else "-"


def strategies_markdown(path: str, data: dict) -> list[str]:
    """Lines of one ``bench strategies`` JSON file's section."""
    meta = data["meta"]
    load = ", ".join(f"{v:.2f}" for v in meta.get("load_average", []))
    out = [
        "",
        f"## Strategies: jigsaw, DDP, FSDP2, tensor parallelism — {Path(path).name}",
        "",
        f"- command: `{meta['command']}`",
        f"- device: {meta['device_name']} ({meta.get('cpu_count')} CPUs), torch {meta['torch']}, "
        f"{meta['threads']} thread(s) per rank, fp32, gloo",
        f"- date: {meta['date']}; load average at start: {load}",
        "",
        *METHOD,
    ]
    for run in data["results"]:
        ov = ", ".join(f"{k}={v}" for k, v in run["overrides"].items())
        ch = run["channels"]
        out += [
            "",
            f"### {run['label']}: {run['model']} {run['preset']} ({ov}), {run['parameters']:,} parameters",
            "",
            f"Grid {run['grid'][0]}x{run['grid'][1]}, {ch['state']} state + {ch['static']} static + "
            f"{ch['time']} time channels; world size {run['world_size']}, global batch "
            f"{run['global_batch']}; a whole sample reads {run['sample_bytes_read'] / 2**10:.1f} KiB; "
            f"{run['repeats']} timed steps per strategy.",
            "",
            "| " + " | ".join(HEADER) + " |",
            "|" + "---|" * len(HEADER),
            *(_row(r, run["world_size"]) for r in run["rows"]),
            *_verdict(run["rows"]),
        ]
        if "budget" in run:
            out += _budget(run["budget"])
    return out
