"""Measure the strategies of ``bench strategies`` on every rank of one spawned process group.

Per strategy, in order: (1) a first training step at the global batch from the shared initial
weights — its loss and global gradient norm are the equality check; (2) a second step at the
global batch with the communication counters on (bytes sent, beside the analytic minimum);
(3) a profiled step on one sample per model replica: peak memory split into parameters,
gradients, optimizer state (the tensors themselves, local shards) and activations (the peak of
the step less those three: saved activations, temporaries, gathered FSDP parameters, the input);
then (4) ``repeats`` timed steps at the global batch, interleaved over the strategies
(``A B … B A``). The peak is the bytes held at the start plus the highest point that the
allocator events of ``torch.profiler`` reach during the step (``measure.peak_bytes``' rule).
"""

from __future__ import annotations

import gc
import itertools
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from ..distributed.mesh import DomainMesh
from .measure import _allocation_sizes
from .strategies import Problem, Runner, analytic_bytes, build_runner

__all__ = ["memory_worker", "strategies_worker"]

WARMUP_STEPS = 2


def _problem(d: dict) -> Problem:
    return Problem(**{**d, "grid": tuple(d["grid"])})


def measure_peak(runner: Runner, batch: tuple[torch.Tensor, ...], count: int) -> dict[str, int]:
    """Peak bytes of one training step on this rank, split (see the module docstring)."""
    if not runner.keeps_grads:  # freed before the profile: frees of older blocks go unrecorded
        runner.optimizer.zero_grad(set_to_none=True)
    gc.collect()
    held = sum(runner.state_bytes().values())
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        runner.step(batch, count)
    above = max(itertools.accumulate(size for _, size in _allocation_sizes(prof)), default=0)
    split = runner.state_bytes()
    peak = held + max(0, above)
    return {"peak": peak, **split, "activations": peak - sum(split.values())}


def strategies_worker(
    mesh: DomainMesh, problem: dict, names: list[str], global_batch: int, repeats: int
) -> dict[str, Any]:
    """On every rank: checks, bytes, memory and step times of each strategy (see the docstring)."""
    prob = _problem(problem)
    rank, world = dist.get_rank(), dist.get_world_size()
    runners = [build_runner(n, prob, rank, world) for n in names]
    count = prob.count(global_batch)
    out: dict[str, Any] = {}
    batches = {}
    for r in runners:
        batch = batches[r.name] = r.inputs(prob, r.my_samples(global_batch))
        local = r.step(batch, count)
        fig: dict[str, Any] = {"loss": r.global_loss(local), "grad_norm": r.grad_norm()}
        r.reset_comm()
        r.step(batch, count)
        fig["bytes_sent"] = r.bytes_sent()
        fig["analytic_bytes"] = analytic_bytes(r, prob, global_batch)
        one = r.inputs(prob, r.my_samples(r.replicas))
        fig["memory"] = measure_peak(r, one, prob.count(r.replicas))
        fig["samples_per_rank"] = len(r.my_samples(global_batch))
        out[r.name] = fig
    wall: dict[str, list[float]] = {r.name: [] for r in runners}
    cpu: dict[str, list[float]] = {r.name: [] for r in runners}
    for k in range(repeats):
        for r in runners if k % 2 == 0 else runners[::-1]:
            dist.barrier()
            w0, c0 = time.perf_counter(), time.process_time()
            r.step(batches[r.name], count)
            dist.barrier()
            wall[r.name].append(time.perf_counter() - w0)
            cpu[r.name].append(time.process_time() - c0)
    for r in runners:
        out[r.name]["step_s"] = statistics.median(wall[r.name]) if repeats else float("nan")
        out[r.name]["cpu_s"] = statistics.median(cpu[r.name]) if repeats else float("nan")
    return out


def memory_worker(mesh: DomainMesh, jobs: list[tuple[str, dict]]) -> list[dict[str, int]]:
    """On every rank: the split peak of one training step on one sample per replica, per job
    ``(strategy, problem)``: the third step, as in ``strategies_worker`` (the first creates the
    optimizer state, DDP rebuilds its buckets in the second)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    found = []
    for name, problem in jobs:
        prob = _problem(problem)
        runner = build_runner(name, prob, rank, world)
        one = runner.inputs(prob, runner.my_samples(runner.replicas))
        for _ in range(WARMUP_STEPS):
            runner.step(one, prob.count(runner.replicas))
        found.append(measure_peak(runner, one, prob.count(runner.replicas)))
        del runner, one
        gc.collect()
    return found
