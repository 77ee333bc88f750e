"""The Jigsaw paper's setup and measurements, to set ``plan``'s projections beside them.

From its public code and logs (DeifiliaTo/Jigsaw_SC): the 1.1 B WeatherMixer (preset
``paper-1.1b``) on 720 × 1440 with 72 input channels (69 state + 3 constant masks, no time
features), batch 1, TF32, on HoreKa's accelerated nodes: 4 × A100-40GB per node, NVLink 3
between them (12 links × 25 GB/s per GPU and direction = 2,400 Gbit/s), two HDR200
InfiniBand ports per node (100 Gbit/s per GPU). Measured seconds per sample include data loading.

``ONE_GPU_RATES`` is the paper's one-GPU roofline (``cases/C2/roofline_mixedp/results.csv``,
column ``one``): end-to-end TFLOP/s of WeatherMixers sized to 0.25 … 16 TFLOP forward per sample,
each trained on one A100. The rate falls with the work per sample (smaller matmuls, fixed
per-sample costs such as loading), which is what a strong-scaled GPU sees: its share shrinks.
"""

from __future__ import annotations

from typing import Any

from jigsaw_earth.models.plan import Hardware, MeshPlan, plan_meshes

__all__ = [
    "A100_HOREKA",
    "CHANNELS",
    "GRID",
    "MEASURED_S_PER_SAMPLE",
    "ONE_GPU_RATES",
    "PAPER_EFFICIENCY_256",
    "PAPER_SPEEDUP_8",
    "project",
]

GRID, CHANNELS = (720, 1440), (69, 3, 0)
MEASURED_S_PER_SAMPLE = {1: 0.724, 2: 0.440, 4: 0.315}  # 1.1 B model, TF32, with data loading
PAPER_SPEEDUP_8, PAPER_EFFICIENCY_256 = 6.4, 0.72
ONE_GPU_TFLOPS = 66.5  # the paper's measured rate of the 1.1 B model on one A100
ONE_GPU_RATES = (
    (0.25, 3.06),
    (0.5, 6.16),
    (1.0, 12.11),
    (2.0, 24.74),
    (4.0, 37.81),
    (8.0, 48.64),
    (16.0, 66.55),
)

A100_HOREKA = Hardware(
    memory=40 * 10**9,
    tflops=156.0,  # A100 TF32 dense peak
    efficiency=ONE_GPU_TFLOPS / 156.0,
    intra_gbps=2400.0,
    inter_gbps=100.0,
    gpus_per_node=4,
)


def project(world: int, rate_curve: bool = False, **overrides: Any) -> list[MeshPlan]:
    """``plan``'s meshes for ``paper-1.1b`` on ``world`` A100s of HoreKa, one sample per data
    replica, ranked; at the flat measured rate, or with ``rate_curve`` at the one-GPU roofline's
    rate for each mesh's work per GPU."""
    hw = A100_HOREKA
    if rate_curve:
        hw = Hardware(**{**hw.__dict__, "rate_curve": ONE_GPU_RATES})
    return plan_meshes("weathermixer", "paper-1.1b", GRID, world, CHANNELS, hw, batch=1, **overrides)
