"""Measuring one forward + backward: interleaved A/B timing, peak memory, run metadata.

* Time: ``A B B A A B …`` — each repeat times both, in alternating order, so drift and load
  on a shared machine hit both alike; the figure is the median of the per-repeat ratios A/B with
  its spread, for wall time (``perf_counter``) and CPU time (``process_time``).
* Peak memory of a step: parameters + inputs + the highest point that the bytes allocated during
  the step reach above the start (gradients, activations kept for backward, temporaries). CPU:
  the allocator events of ``torch.profiler(profile_memory=True)``, summed in time order (this
  isolates each case: nothing allocated before the step counts twice); CUDA:
  ``max_memory_allocated`` after ``reset_peak_memory_stats``, less what was allocated at the start.
"""

from __future__ import annotations

import datetime
import itertools
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch._C._profiler as _prof
from torch import nn
from torch.profiler import ProfilerActivity, profile

from ..training.accounting import device_peak_tflops

__all__ = ["Step", "metadata", "peak_bytes", "ratio_stats", "time_pair"]


@dataclass
class Step:
    """One forward + backward of ``module`` on ``inputs`` with a fixed cotangent."""

    module: nn.Module
    inputs: Sequence[torch.Tensor]
    autocast: torch.dtype | None = None
    cotangent: torch.Tensor | None = None

    def __call__(self) -> None:
        self.module.zero_grad(set_to_none=True)
        xs = [x.detach().requires_grad_(x.is_floating_point()) for x in self.inputs]
        device = xs[0].device.type
        with torch.autocast(device, self.autocast or torch.float32, enabled=self.autocast is not None):
            y = self.module(*xs)
        if self.cotangent is None:
            self.cotangent = torch.randn(y.shape, generator=torch.Generator().manual_seed(7)).to(y)
        y.backward(self.cotangent.to(y.dtype))

    def static_bytes(self) -> int:
        tensors = [*self.module.parameters(), *self.inputs]
        return sum(t.numel() * t.element_size() for t in tensors)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def ratio_stats(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    ratios = [x / y for x, y in zip(a, b) if y > 0]
    return {
        "median": statistics.median(ratios) if ratios else float("nan"),
        "min": min(ratios, default=float("nan")),
        "max": max(ratios, default=float("nan")),
    }


def time_pair(
    a: Callable[[], None],
    b: Callable[[], None],
    repeats: int,
    device: str = "cpu",
    min_sample_s: float = 0.05,
) -> dict:
    """Interleaved timing of ``a`` (jigsaw) and ``b`` (twin) after one warm-up each.

    Short steps are repeated inside each sample (to at least ``min_sample_s``) so that timer
    resolution and scheduler noise do not dominate; all figures are per step."""
    samples: dict[str, dict[str, list[float]]] = {k: {"wall": [], "cpu": []} for k in "ab"}
    fns = {"a": a, "b": b}
    a()
    _sync(device)
    t0 = time.perf_counter()
    b()
    _sync(device)
    inner = max(1, min(100, math.ceil(min_sample_s / max(time.perf_counter() - t0, 1e-6))))
    for r in range(repeats):
        for key in "ab" if r % 2 == 0 else "ba":
            _sync(device)
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(inner):
                fns[key]()
            _sync(device)
            samples[key]["wall"].append((time.perf_counter() - w0) / inner)
            samples[key]["cpu"].append((time.process_time() - c0) / inner)
    return {
        "jigsaw_ms": statistics.median(samples["a"]["wall"]) * 1e3,
        "twin_ms": statistics.median(samples["b"]["wall"]) * 1e3,
        "jigsaw_cpu_ms": statistics.median(samples["a"]["cpu"]) * 1e3,
        "twin_cpu_ms": statistics.median(samples["b"]["cpu"]) * 1e3,
        "ratio": ratio_stats(samples["a"]["wall"], samples["b"]["wall"]),
        "cpu_ratio": ratio_stats(samples["a"]["cpu"], samples["b"]["cpu"]),
        "repeats": repeats,
        "steps_per_sample": inner,
    }


def _allocation_sizes(prof: profile) -> list[tuple[int, int]]:
    found: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        ev = stack.pop()
        fields = ev.extra_fields
        if isinstance(fields, _prof._ExtraFields_Allocation) and fields.device.type == "cpu":
            found.append((ev.start_time_ns, fields.alloc_size))
        stack.extend(ev.children)
    return sorted(found)


def peak_bytes(step: Step, device: str = "cpu") -> int:
    """Peak bytes of one step (see the module docstring); run a warm-up step before."""
    step.module.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        above = torch.cuda.max_memory_allocated() - start
    else:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step()
        above = max(itertools.accumulate(size for _, size in _allocation_sizes(prof)), default=0)
    step.module.zero_grad(set_to_none=True)
    return step.static_bytes() + max(0, above)


def metadata(argv: Sequence[str], device: str, dtype: str, threads: int) -> dict:
    """What a reader needs to trust the figures: command, device, versions, the device's dense peak
    (known GPUs), threads, load, date."""
    if device == "cuda":
        name = torch.cuda.get_device_name()
    else:
        name = platform.processor() or platform.machine()
        try:
            model = [
                ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")
            ]
            name = model[0].split(":", 1)[1].strip() if model else name
        except OSError:
            pass
    return {
        "command": "jigsaw-earth " + " ".join(argv),
        "device": device,
        "device_name": name,
        "cpu_count": os.cpu_count(),
        "dtype": dtype,
        "threads": threads,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "peak_tflops": device_peak_tflops(torch.device(device), "bf16" if dtype == "bf16" else "fp32"),
        "python": platform.python_version(),
        "load_average": list(os.getloadavg()),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
