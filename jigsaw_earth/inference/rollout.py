"""predict's forecast loop: batches of inits rolled out on the device, written and scored beside it.

For each batch the inputs (read ahead on the read thread while the previous batch ran; the first
batch's while the checkpoint loaded, ``predict.py``) go to the device once; the state then stays
there for every step. Each written lead leaves through
``outputs.ForecastOutput`` (host slots filled off the compute stream, a pool of writers) and is scored
on the scoring thread (``scoring.TileScorer``, its truth read ahead); the batch is recorded on the
recording thread once it is written and scored (``progress.Progress.record``). The forward never
waits for the disk unless every output slot is still being written. ``run_batches`` returns where
the loop's time went (``timing.LoopTimes``). With ``training.compile`` the model is compiled by one
warm-up step on the first batch before the loop (``compile_s``), then reused for every step.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..data.batch import Batch
from ..data.samples import TrainData
from ..device import DeviceTimer, pin, synchronize
from ..distributed.comm import ledger
from ..models.run import model_step
from .campaign import StepLog
from .members import Members
from .progress import Progress
from .scoring import TileScorer
from .throughput import Pipeline
from .timing import LoopTimes
from .write_pool import ForecastOutput, WriterPool

if TYPE_CHECKING:
    from ..data.analysis import Analysis
    from .perturb_fields import Perturber

__all__ = ["Rollout", "run_batches"]


@dataclass
class Rollout:
    """What every batch of a forecast shares: the model and its step, the data, which leads and
    channels leave the device, and the ensemble (None: deterministic)."""

    model: torch.nn.Module
    data: TrainData
    inits: np.ndarray  # store time indices of the forecast's inits
    steps: int
    lead_of: dict[int, int]  # model step (1 = first) → index among the written leads
    channels: torch.Tensor  # the written channels' indices, on the device
    bf16: bool
    tendency: torch.Tensor | None
    ens: Members | None
    init_times: np.ndarray
    analysis: Analysis | None = None  # the initial states of ``predict --init`` (None: the data store's)
    perturb: Perturber | None = None  # ``predict --perturb``: the members' initial perturbations

    @property
    def per_init(self) -> int:
        """Forward rows per init (this rank's members)."""
        return 1 if self.ens is None else len(self.ens.mine)

    def read(self, positions: np.ndarray) -> tuple[Batch, torch.Tensor]:
        """Inputs of the inits at ``positions`` and their time features at every lead, in page-locked
        memory on a GPU (copied while the model runs)."""
        dev = self.data.mesh.device
        if self.analysis is None:
            batch = self.data._batch(self.inits[positions], 0)
        else:
            batch = self.analysis.batch(self.data, positions)
        times = torch.stack([self.data.step_time_features(batch, lead) for lead in range(self.steps)])
        return batch.pin_memory() if dev.type == "cuda" else batch, pin(times, dev)

    def initial(self, batch: Batch, positions: np.ndarray) -> torch.Tensor:
        """The batch's initial state for every member of this rank ``(m·B, C, h, w)``, perturbed."""
        state = batch.inputs if self.ens is None else self.ens.expand(batch.inputs)
        if self.perturb is not None:
            state = self.perturb.apply(state, self.inits[positions], self.init_times[positions])
        return state

    def step(self, state: torch.Tensor, batch: Batch, tf: torch.Tensor, positions: np.ndarray,
             lead: int) -> torch.Tensor:  # fmt: skip
        """Model step ``lead`` (0-based) of the batch's ``state`` (every member of a rank's rows)."""
        noise = None
        if self.ens is not None:
            tf = self.ens.expand(tf)
            noise = self.ens.noise(self.data, self.init_times[positions], lead, state.device)
        return model_step(self.model, state, batch.static, tf, bf16=self.bf16, tendency=self.tendency,
                          noise=noise)  # fmt: skip

    def score_lead(self, scorer: TileScorer, lead_index: int, physical: torch.Tensor,
                   every: torch.Tensor | None) -> None:  # fmt: skip
        """Score one lead on the device; an ensemble's ``(M, B, V, h, w)`` as ``(B, M, V, h, w)``."""
        if self.ens is None:
            scorer.update(lead_index, physical)
        else:
            scorer.update(lead_index, self.data.denormalise(every)[:, :, self.channels].transpose(0, 1))


def _batch_shares(scorer: TileScorer) -> dict[str, torch.Tensor]:
    """End the scorer's batch; its shares (what a resume restores), taken before the next begins."""
    scorer.end()
    return scorer.last_batch()


def _compile(r: Rollout, first: tuple[Batch, torch.Tensor], positions: np.ndarray) -> float:
    """One step on the first batch (its result dropped) so ``torch.compile`` compiles before the loop."""
    dev = r.data.mesh.device
    t0 = time.perf_counter()
    batch = first[0].to(dev)
    state = batch.inputs if r.ens is None else r.ens.expand(batch.inputs)
    r.step(state, batch, first[1][0].to(dev), positions, 0)
    synchronize(dev)
    return time.perf_counter() - t0


def run_batches(r: Rollout, chunks: list[np.ndarray], progress: Progress, pipe: Pipeline,
                output: ForecastOutput | None, pool: WriterPool | None, scorer: TileScorer | None,
                compile_first: bool, first: tuple[np.ndarray, Future] | None = None,
                ) -> tuple[LoopTimes, Batch | None]:  # fmt: skip
    """Forecast every batch of ``chunks`` (positions in the forecast's init list); the loop's times
    and the last batch (on the device; the training forward's rate is timed on it). ``first``: a
    read already started (positions, its future), used if it is the first batch's."""
    dev = r.data.mesh.device
    times, forward = LoopTimes(), DeviceTimer(dev)
    ahead = None
    if chunks:
        started = first is not None and np.array_equal(first[0], chunks[0])
        ahead = first[1] if started else pipe.read(partial(r.read, chunks[0]))
    if compile_first and chunks:
        times.compile_s = _compile(r, ahead.result(), chunks[0])
    steps_log = StepLog(sum(len(c) for c in chunks) * r.per_init * r.steps, r.data.mesh.rank)
    batch = None
    t0, c0, comm0 = time.perf_counter(), time.process_time(), ledger.wait_s
    for i, chunk in enumerate(chunks):
        progress.boundary(i, pipe)  # collective: a stop signal ends the run here, all recorded
        w0 = time.perf_counter()
        host_batch, host_times = ahead.result()
        times.read_stall_s += time.perf_counter() - w0
        batch = host_batch.to(dev, non_blocking=True)
        lead_times = host_times.to(dev, non_blocking=True)
        if i + 1 < len(chunks):  # the next inputs are read while this batch runs
            ahead = pipe.read(partial(r.read, chunks[i + 1]))
        if scorer is not None:
            pipe.sink(partial(scorer.begin, chunk), "score")
        if output is not None:
            output.begin(chunk)
        state = r.initial(batch, chunk)
        writes = output.end_batch if output is not None else list
        for lead in range(r.steps):
            if lead:  # collective: a stop signal ends the run here, the batch dropped, the earlier recorded
                progress.within(i, lead, r.steps, pipe, writes)
            with forward:
                state = r.step(state, batch, lead_times[lead], chunk, lead)
            steps_log.advance(len(chunk) * r.per_init)
            if lead + 1 in r.lead_of:  # out through the slots, scored on its thread, each in order
                physical = r.data.denormalise(state)[:, r.channels]
                if output is not None:
                    output.put(r.lead_of[lead + 1], physical)
                if scorer is not None:
                    every = r.ens.everyone(r.ens.split(state)) if r.ens is not None else None
                    pipe.sink(partial(r.score_lead, scorer, r.lead_of[lead + 1], physical, every), "score")
        written = output.end_batch() if output is not None else []
        scored = None if scorer is None else pipe.sink(partial(_batch_shares, scorer), "score")
        pipe.sink(partial(progress.record, i, scored, written), "record")
    d0 = time.perf_counter()
    pipe.drain()
    times.drain_s = time.perf_counter() - d0
    times.loop_s, times.cpu_s = time.perf_counter() - t0, time.process_time() - c0
    times.comm_wait_s = ledger.wait_s - comm0  # the exchanges of the forward (and a score's gather)
    times.forward_s = forward.total()
    if output is not None:
        times.copy_s = output.copier.timer.total()
        times.write_stall_s = output.stall_s + pipe.stalled["record"]
    if pool is not None:
        times.writers_busy_s, times.written_bytes = pool.busy_s, float(pool.bytes)
    if scorer is not None:
        scorer.close()
        times.score_stall_s, times.truth_wait_s = pipe.stalled["score"], scorer.truth_wait_s
    return times, batch
