"""The ``bench scaling`` table: in the terminal and as its section of ``docs/benchmarks.md``."""

from __future__ import annotations

from pathlib import Path

from ..training.accounting import PARTS

__all__ = ["format_scaling", "scaling_markdown"]

HEAD = ("run", "processes x threads", "samples/s", "speedup (range)", "efficiency", "step ms", "compute",
        "comm", "data", "other", "CPU s/step", "comm threads", "plan step ms")  # fmt: skip


def _cells(r: dict) -> tuple[str, ...]:
    lo, hi = r["speedup_range"]
    step = r["step_s"]
    parts = [f"{r[f'{k}_s'] * 1e3:.0f} ({r[f'{k}_s'] / step:.0%})" for k in PARTS]
    plan = r["plan"]
    planned = "-" if not plan else (plan["error"][:30] if plan["error"] else f"{plan['step_s'] * 1e3:.0f}")
    return (r["name"], f"{r['processes']} x {r['threads']}", f"{r['samples_per_s']:.2f}",
            f"{r['speedup']:.2f} ({lo:.2f}-{hi:.2f})", f"{r['efficiency']:.0%}", f"{step * 1e3:.0f}", *parts,
            f"{r['cpu_s']:.2f}", f"{r.get('comm_thread_cpu_s', 0.0):.2f}", planned)  # fmt: skip


def format_scaling(result: dict) -> str:
    """The plain-text table of one ``run_scaling`` result."""
    lines = [HEAD, *(_cells(r) for r in result["rows"])]
    widths = [max(len(row[i]) for row in lines) for i in range(len(HEAD))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in lines)


def _load(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values) or "-"


def scaling_markdown(path: Path | str, data: dict) -> list[str]:
    """The docs/benchmarks.md section of one ``bench scaling`` JSON file."""
    meta, res = data["meta"], data["result"]
    g = res["grid"]
    out = [
        "",
        f"## Strong scaling — {Path(path).name}",
        "",
        f"- command: `{meta['command']}`",
        f"- {meta['device_name']} ({meta.get('cpu_count')} CPUs), torch {meta['torch']}; {meta['date']}; "
        f"load average (1, 5, 15 min) at start {_load(meta['load_average'])}, "
        f"at end {_load(meta.get('load_average_end', []))}",
        f"- grid {g[0]}x{g[1]}, global batch {res['global_batch']}, {res['warmup']} warm-up + {res['steps']} "
        f"measured steps per run, runs interleaved over {len(res['rows'][0]['repeats'])} repeats; "
        f"distributed.overlap {res.get('overlap', 'on')}",
        f"- plan's rates, measured here: GEMM {res['gemm_tflops'] * 1e3:.1f} GFLOP/s (1 rank, 1 thread)"
        + (
            f" and {res['tile_gemm_tflops'] * 1e3:.1f} GFLOP/s on a 1/N tile ({res['tile_grid'][0]}x"
            f"{res['tile_grid'][1]}: plan reads each mesh's rate between the two), "
            if "tile_gemm_tflops" in res
            else ", "
        )
        + (
            f"{res['crowded_gemm_tflops'] * 1e3:.1f} GFLOP/s per copy with {res['world_size']} tile runs at "
            f"once (crowded rate {res['crowded_rate']:.2f}, applied to every multi-rank run), "
            if "crowded_rate" in res
            else ""
        )
        + f"link {res['link_bytes_per_s'] / 2**30:.2f} GiB/s (8 MiB, both directions, through training's "
        f"transport)",
        "",
        "| " + " | ".join(HEAD) + " |",
        "|" + "---|" * len(HEAD),
        *("| " + " | ".join(_cells(r)) + " |" for r in res["rows"]),
        "",
        "Step ms: median over steps and repeats of the slowest rank's step; the parts are the ranks' mean "
        "(ms and share of the step); CPU s/step: process CPU time summed over the ranks, of it "
        "*comm threads* the communication library's own threads (gloo's transport loop); speedup: "
        "samples/s over the 1-rank-1-thread run of the same repeat, median and range.",
    ]
    return out
