"""The paper's table beside plan (docs/plan.md): ``paper-1.1b`` on the paper's A100s, projected at
its flat measured 66.5 TFLOP/s and at its one-GPU roofline rate for each GPU's share of the work
(``models/paper.py``), beside the measured 0.724 / 0.440 / 0.315 s per sample, 6.4× on 8 GPUs and
72 % efficiency on 256. Prints markdown; paste it over the section's table.

    python scripts/paper_table.py
"""

from __future__ import annotations

from jigsaw_earth.models.paper import MEASURED_S_PER_SAMPLE, PAPER_EFFICIENCY_256, PAPER_SPEEDUP_8, project
from jigsaw_earth.models.plan import MeshPlan

# the paper's layouts: one sample over 1, 2, 4 GPUs of a node; 4-way Jigsaw per node, data parallel across
MESHES = {1: "1x1x1", 2: "1x1x2", 4: "1x1x4", 8: "2x1x4", 256: "64x1x4"}


def _paper(world: int) -> str:
    if world in MEASURED_S_PER_SAMPLE:
        s = MEASURED_S_PER_SAMPLE[world]
        return f"{s:.3f} s ({MEASURED_S_PER_SAMPLE[1] / s:.2f}×)"
    if world == 8:
        return f"{PAPER_SPEEDUP_8}× ({PAPER_SPEEDUP_8 / 8:.0%})"
    return f"{PAPER_EFFICIENCY_256:.0%} efficiency"


def _cell(p: MeshPlan, base: MeshPlan, world: int) -> str:
    """Seconds per sample (step / samples per step), speedup and efficiency against one GPU."""
    speedup = p.samples_per_s / base.samples_per_s
    return f"{1 / p.samples_per_s:.3f} s, {speedup:.2f}× ({speedup / world:.0%})"


def main() -> None:
    rows = []
    plans = {curve: {n: {p.mesh: p for p in project(n, curve)} for n in MESHES} for curve in (False, True)}
    base = {curve: plans[curve][1]["1x1x1"] for curve in (False, True)}
    for n, mesh in MESHES.items():
        flat, curve = plans[False][n][mesh], plans[True][n][mesh]
        dp = flat.kinds.get("data parallel", {}).get("step_s", 0.0)
        err = ""
        if n in MEASURED_S_PER_SAMPLE:
            m = MEASURED_S_PER_SAMPLE[n]
            err = f"{flat.step_s / m - 1:+.0%} / {curve.step_s / m - 1:+.0%}"
        rows.append(
            f"| {n} | {mesh} | {_paper(n)} | {_cell(flat, base[False], n)} | {_cell(curve, base[True], n)} "
            f"({curve.rate_tflops:.1f} TFLOP/s) | {flat.exposed_s * 1e3:.0f} ms ({dp * 1e3:.0f} ms) | {err} |"
        )
    print("| GPUs | mesh | paper (measured) | plan, flat 66.5 TFLOP/s | plan, one-GPU roofline rate "
          "| exposed comm per step (of it, gradient all-reduce) | error flat / roofline |")  # fmt: skip
    print("|---" * 7 + "|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
