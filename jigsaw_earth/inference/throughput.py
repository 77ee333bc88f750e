"""Forecast throughput: the batch that fits, reads and writes beside the forward, and the rates.

* ``auto_batch``: inits per forward from ``plan``'s inference memory of the real model (its own
  shard) and the memory free on this rank's device (a GPU's free memory; on CPU the host's
  available memory shared by the local ranks), at most ``MEMORY_FRACTION`` of it; every rank takes
  the smallest (the domain ranks must forecast the same inits together).
* ``Pipeline``: the next batch's inputs are read on one thread, each lead's scores run in order on
  another and each batch's record (once its writes and scores are in) on a third, while the main
  thread runs the model; at most ``QUEUED`` jobs wait in each lane, and the time the main thread
  waited for a lane is counted (``stalled``). The writes go to the writers of ``write_pool.py``.
* ``replicas_fit``: whether the weights a forecast gathers once (``layers/replicas.py``: fewer
  messages per step) fit in ``REPLICA_FRACTION`` of the free memory on every rank.
* ``training_forward_rate``: the training forward (autograd on, the training batch) timed on the
  same mesh, so the summary sets the forecast's model steps per second beside it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist

from ..data.times import N_TIME_FEATURES
from ..device import free_bytes
from ..distributed.comm import all_reduce_
from ..distributed.mesh import DomainMesh, local_ranks
from ..layers.replicas import replica_bytes
from ..models.plan_eval import inference_memory

__all__ = [
    "MEMORY_FRACTION",
    "QUEUED",
    "REPLICA_FRACTION",
    "Pipeline",
    "auto_batch",
    "free_memory",
    "replicas_fit",
    "training_forward_rate",
]

MEMORY_FRACTION = 0.5  # of the free memory a forecast's batch may take
REPLICA_FRACTION = 0.25  # of the free memory (after the batch) the gathered weights may take
QUEUED = 4  # leads waiting to be scored (batches to be recorded) before the forward waits for them


def free_memory(device: torch.device) -> int:
    """Bytes free for this rank: the GPU's free memory, or the host's available memory over the
    local ranks (``device.free_bytes``)."""
    return free_bytes(device, local_ranks())


def auto_batch(model: torch.nn.Module, data: Any, n_local: int, elsize: int, mesh: DomainMesh) -> int:
    """Inits per forward: as many as fit in ``MEMORY_FRACTION`` of the free memory (at most
    ``n_local``, this replica's inits), the same on every rank (collective over ``mesh.world``)."""
    h, w = data.tile.shape
    channels = (len(data.channels), data.n_static, N_TIME_FEATURES)
    one = inference_memory(model, 1, elsize, h * w, channels)
    per = max(1, one["total"] - one["parameters"])
    budget = int(free_memory(mesh.device) * MEMORY_FRACTION)
    batch = torch.tensor([max(1, min(n_local, budget // per))], dtype=torch.int64, device=mesh.device)
    if dist.is_initialized():
        all_reduce_(batch, mesh.world, op="predict.batch", reduce=dist.ReduceOp.MIN)
    return int(batch.item())


def replicas_fit(model: torch.nn.Module, mesh: DomainMesh) -> int:
    """Bytes of the weights this rank would gather for a forecast (``replica_bytes``) when they fit
    in ``REPLICA_FRACTION`` of the free memory on every rank, else 0 (collective over the world)."""
    need = replica_bytes(model)
    fits = torch.tensor([int(need <= REPLICA_FRACTION * free_memory(mesh.device))], device=mesh.device)
    if dist.is_initialized():
        all_reduce_(fits, mesh.world, op="predict.replicas", reduce=dist.ReduceOp.MIN)
    return need if int(fits.item()) else 0


class Pipeline:
    """Reads ahead on one thread; scores and records each on a thread of its own (a lane: its jobs
    run in order); ``drain`` re-raises their errors. ``stalled``: seconds the caller waited per lane."""

    LANES = ("score", "record")

    def __init__(self) -> None:
        self._read = ThreadPoolExecutor(1, thread_name_prefix="jigsaw-predict-read")
        self._lanes = {
            lane: ThreadPoolExecutor(1, thread_name_prefix=f"jigsaw-predict-{lane}") for lane in self.LANES
        }
        self._pending: dict[str, deque[Future]] = {lane: deque() for lane in self.LANES}
        self.stalled = dict.fromkeys(self.LANES, 0.0)

    def read(self, fn: Callable[[], Any]) -> Future:
        return self._read.submit(fn)

    def sink(self, fn: Callable[[], Any], lane: str) -> Future:
        """Run ``fn`` after every earlier job of its ``lane``; wait while ``QUEUED`` are pending."""
        pending = self._pending[lane]
        job = self._lanes[lane].submit(fn)
        pending.append(job)
        t0 = time.perf_counter()
        while len(pending) > QUEUED or (pending and pending[0].done()):
            pending.popleft().result()
        self.stalled[lane] += time.perf_counter() - t0
        return job

    def drain(self) -> None:
        for pending in self._pending.values():
            while pending:
                pending.popleft().result()

    def close(self) -> None:
        for pool in (self._read, *self._lanes.values()):
            pool.shutdown(wait=True, cancel_futures=True)


def training_forward_rate(model: torch.nn.Module, forward: Callable[[], torch.Tensor], samples: int,
                          repeats: int = 3) -> float:  # fmt: skip
    """Samples per second of ``forward()`` (``samples`` per call) in training mode with autograd,
    the median of ``repeats`` after one warm-up; the model is put back in eval mode."""
    times = []
    model.train()
    try:
        with torch.enable_grad():
            for k in range(repeats + 1):
                if dist.is_initialized():
                    dist.barrier()
                t0 = time.perf_counter()
                out = forward()
                if out.is_cuda:
                    torch.cuda.synchronize()
                if k:
                    times.append(time.perf_counter() - t0)
                del out
    finally:
        model.eval()
    times.sort()
    return samples / times[len(times) // 2]
