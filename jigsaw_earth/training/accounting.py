"""Where a training step's time goes, and the FLOP rate it reached.

Each step is timed in phases (``StepClock.phase``): ``data`` (blocked fetching the batch: the
data wait), ``compute`` (forward, backward, optimizer) and ``other`` (bookkeeping: zeroing,
norm, schedule). Time a phase spends blocked in communication (``comm.ledger.wait_s``: waits on
transfers and collectives) is moved from it to ``comm``, the exposed communication. The parts are
measured, not derived: ``unaccounted_s`` (step time less the parts) is what no phase covered.

Achieved TFLOP/s per rank: the FLOPs this rank's layers declare for one step (``layers.cost``:
forward + backward, the model FLOPs: a recomputed forward is not counted, as MFU counts it) over
the step time; utilisation is that over the device's peak (``logging.peak_tflops``, else the
known-devices table, else none on CPU).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch
from torch import nn

from ..device import synchronize
from ..distributed.comm import ledger
from ..layers.cost import model_cost

__all__ = [
    "PARTS",
    "StepClock",
    "device_peak_tflops",
    "format_breakdown",
    "format_step",
    "step_flops",
    "summarize_steps",
]

PARTS = ("compute", "comm", "data", "other")

# dense peak TFLOP/s by device-name fragment and math mode (vendor data sheets, SXM parts)
KNOWN_DEVICES: dict[str, dict[str, float]] = {
    "H200": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4},
    "H100": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4},
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0},
    "V100": {"fp32": 15.7, "tf32": 15.7, "bf16": 125.0},
}


def device_peak_tflops(device: torch.device, precision: str, configured: float | None = None) -> float | None:
    """Peak dense TFLOP/s of one rank: ``configured`` if given, else the known-devices entry of a
    CUDA device for the math mode it runs (``training.precision``), else None."""
    if configured is not None:
        return configured
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    mode = precision if precision in ("bf16", "tf32") else "fp32"
    for fragment, peaks in KNOWN_DEVICES.items():
        if fragment in name:
            return peaks[mode]
    return None


def step_flops(model: nn.Module, samples: int, rollout_steps: int) -> float:
    """This rank's declared forward + backward FLOPs of one step of ``samples`` per replica."""
    costs = model_cost(model, samples, input_grad=False).values()
    return float(rollout_steps * sum(sum(c.flops) for c in costs))


class StepClock:
    """Phase timer of one step; ``stop`` returns ``{step_time_s, <part>_s..., unaccounted_s}``.

    On CUDA each phase ends with a device synchronisation, so its kernels count in it (a handful
    per step); there a wait on an NCCL transfer only orders streams, so ``comm`` is what the host
    blocked for and transfers behind kernels count as compute."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.parts = dict.fromkeys(PARTS, 0.0)
        self._t0 = time.perf_counter()
        self._device = device

    def start(self) -> None:
        self.parts = dict.fromkeys(PARTS, 0.0)
        self._t0 = time.perf_counter()

    @contextlib.contextmanager
    def phase(self, part: str) -> Iterator[None]:
        if part not in PARTS or part == "comm":
            raise ValueError(f"phase {part!r}: use compute, data or other (comm is measured within them)")
        waited, t0 = ledger.wait_s, time.perf_counter()
        try:
            yield
        finally:
            if self._device is not None:
                synchronize(self._device)
            comm = ledger.wait_s - waited
            self.parts[part] += time.perf_counter() - t0 - comm
            self.parts["comm"] += comm

    def stop(self) -> dict[str, float]:
        step = time.perf_counter() - self._t0
        out = {"step_time_s": step, **{f"{k}_s": v for k, v in self.parts.items()}}
        out["unaccounted_s"] = step - sum(self.parts.values())
        return out


def summarize_steps(history: list[dict[str, float]], flops: float, peak: float | None) -> dict[str, float]:
    """Totals over ``history`` (the step metrics of this run): each part's share of the step
    time, the mean step, and the achieved TFLOP/s (and utilisation) over all steps."""
    total = sum(h["step_time_s"] for h in history)
    if not history or total <= 0:
        return {}
    out = {"steps": float(len(history)), "mean_step_s": total / len(history)}
    for k in (*PARTS, "unaccounted"):
        out[f"{k}_fraction"] = sum(h.get(f"{k}_s", 0.0) for h in history) / total
    out["tflops"] = flops * len(history) / total / 1e12
    if peak:
        out["utilization"] = out["tflops"] / peak
    return out


def _rate(tflops: float, utilization: float | None) -> str:
    util = f" ({utilization:.1%} of peak)" if utilization is not None else ""
    return f"{tflops:.3g} TFLOP/s{util}"


def format_step(values: dict[str, float]) -> str:
    """``compute 71% comm 20% data 6% other 3% | 0.0412 TFLOP/s`` for one step's metrics."""
    step = values["step_time_s"]
    shares = " ".join(f"{k} {values[f'{k}_s'] / step:.0%}" for k in PARTS)
    return f"{shares} | {_rate(values['tflops'], values.get('utilization'))}"


def format_breakdown(summary: dict[str, float]) -> str:
    """The end-of-run line of ``summarize_steps``' figures."""
    shares = " ".join(f"{k} {summary[f'{k}_fraction']:.1%}" for k in PARTS)
    return (
        f"mean {summary['mean_step_s'] * 1e3:.1f} ms over {int(summary['steps'])} steps: {shares} "
        f"(unaccounted {summary['unaccounted_fraction']:.1%}) | "
        f"{_rate(summary['tflops'], summary.get('utilization'))}"
    )
