"""One training step under ``torch.profiler`` (``logging.profile_step``): where a step's time goes.

Writes ``profile-step-N-rankR.txt`` (the kernels with the most device time, then the time of the
matrix products against everything else) and ``profile-step-N-rankR.json`` (a Chrome trace, for
``chrome://tracing`` or Perfetto) into the run directory.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

__all__ = ["GEMM_KERNELS", "profiled", "split_device_time"]

log = logging.getLogger(__name__)

# name fragments of matrix-product kernels (cuBLAS/cuBLASLt, CUTLASS, oneDNN/MKL on CPU)
GEMM_KERNELS = ("gemm", "cutlass", "sm90_xmma", "sm80_xmma", "nvjet", "aten::mm", "aten::addmm", "aten::bmm")


def split_device_time(prof: profile, device: torch.device) -> dict[str, float]:
    """Seconds of device time (CPU time of operators on the CPU) in matrix products and in everything
    else, from kernel and operator names."""
    gemm = other = 0.0
    field = "self_cpu_time_total" if device.type == "cpu" else "self_device_time_total"
    for event in prof.key_averages():
        if device.type == "cpu" and not event.key.startswith("aten::"):
            continue
        self_us = getattr(event, field, 0.0) or 0.0
        if self_us <= 0:
            continue
        name = event.key.lower()
        if any(fragment in name for fragment in GEMM_KERNELS):
            gemm += self_us
        else:
            other += self_us
    return {"gemm_s": gemm / 1e6, "other_s": other / 1e6}


@contextlib.contextmanager
def profiled(run_dir: Path, step: int, rank: int, device: torch.device) -> Iterator[None]:
    """Profile the work inside; write the table and the trace on exit."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=True) as prof:
        yield
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=70)
    split = split_device_time(prof, device)
    total = split["gemm_s"] + split["other_s"]
    share = f"{split['gemm_s'] / total:.1%}" if total else "n/a"
    summary = (
        f"step {step}, rank {rank}, {device}: device time {total * 1e3:.1f} ms, matrix products "
        f"{split['gemm_s'] * 1e3:.1f} ms ({share}), everything else {split['other_s'] * 1e3:.1f} ms"
    )
    base = run_dir / f"profile-step-{step}-rank{rank}"
    base.with_suffix(".txt").write_text(summary + "\n\n" + table + "\n")
    prof.export_chrome_trace(str(base.with_suffix(".json")))
    log.info("%s (%s)", summary, base.with_suffix(".txt"))
