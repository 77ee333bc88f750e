"""The trainer: one config, any mesh, the same numbers on every mesh, nothing lost when a job dies.

Per step ``s`` (1-based; global batch ``s − 1``):

1. this rank reads its tile of its replica's rows of global batch ``s − 1`` (``TrainData``);
2. forward ``rollout_steps`` autoregressive steps (bf16 autocast and activation checkpointing
   optional); the loss is the latitude-weighted MSE over the global grid and global batch
   (``loss.py``): the local term is backpropagated, the all-reduced value is logged;
3. gradients are summed over the data axis, the global norm over all shards is measured and
   clipped (``optim.py``); a non-finite loss or norm stops with the step named, or skips it;
4. AdamW steps with the learning rate of the warmup + cosine schedule at ``s − 1``.

Checkpoints (``jigsaw_earth.checkpoint``: sharded, atomic, any mesh) hold the model, the
optimizer, the step and the RNG; data order and learning rate are functions of the step, so a
resumed run continues with exactly the losses the uninterrupted run would have had.

Before the first step the run directory is claimed (``rundir.py``: a start that would discard
or shadow another run's checkpoints refuses) and checked (``preflight.py``: writable, room for
``keep + 1`` checkpoints); only then are ``config.yaml`` and the ``history.jsonl`` entry written.
``SIGTERM``/``SIGUSR1`` checkpoint at the next step boundary and stop (``signals.py``). A finished
run (``rundir.finished_step``) raises ``RunFinished`` before anything is read or written.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint as recompute

from ..checkpoint import (
    SaveRequest,
    capture_rng,
    latest_checkpoint,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)
from ..checkpoint.background import BackgroundSaver
from ..config.advice import check_learnable
from ..config.schema import TrainConfig
from ..data.batch import Batch
from ..data.samples import TrainData
from ..device import set_precision
from ..distributed.grads import replication
from ..distributed.heartbeat import communication_error
from ..distributed.mesh import DomainMesh
from ..distributed.rank0 import on_rank0
from ..layers.base import init_model
from ..models.noise import forecast_sample_index, member_noise, train_sample_index
from ..models.run import build_run_model, model_step
from ..signals import Preempted, StopSignals
from .accounting import StepClock, device_peak_tflops, step_flops, summarize_steps
from .compile_report import CompileLog
from .evaluate import format_table, validate
from .feed import Feeder
from .finetune import apply_freeze, load_parent, plan_init_from, run_record
from .loss import TrainingLoss, global_value
from .memory import needs_checkpointing
from .monitor import Monitor, memory_mb
from .optim import build_optimizer, clip_grad_norm, lr_at, sync_gradients
from .preflight import model_checkpoint_bytes, preflight_run_dir
from .profile import profiled
from .rundir import (
    RunFinished,
    claim_run_dir,
    config_hash,
    finished_message,
    finished_step,
    lock_run_dir,
    record_start,
    recorded_loss,
    resumes,
)

__all__ = ["NonFiniteLossError", "Preempted", "RunFinished", "Trainer", "config_hash"]

log = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """The loss or gradient norm became NaN/inf (``training.nan_policy: stop``)."""


class Trainer:
    """Owns the model, optimizer, data and run directory of one training run on one rank."""

    def __init__(
        self,
        cfg: TrainConfig,
        mesh: DomainMesh,
        data: TrainData | None = None,
        model: nn.Module | None = None,
        new_run: bool = False,
    ):
        for warning in check_learnable(cfg):  # a loss and ensemble that cannot learn: refused first
            if mesh.rank == 0:
                log.warning("%s", warning)
        self.cfg, self.mesh = cfg, mesh
        self.run_dir = Path(cfg.run.dir)
        set_precision(cfg.training.precision)
        self._lock = None  # rank 0: run.dir's lock, held from the preflight to the end of ``fit``
        self.saver = BackgroundSaver()  # periodic checkpoints, written while training goes on
        mesh.wire.overlap = cfg.distributed.overlap == "on"
        if cfg.distributed.transport == "backend":
            mesh.wire.rings = None  # a mesh built elsewhere may have connected shared memory
        # nothing is written to run.dir before these checks pass (collective: rank 0 decides)
        moved = on_rank0(mesh, lambda: claim_run_dir(cfg, new_run))
        box = [on_rank0(mesh, lambda: finished_step(cfg, new_run))]  # a finished run: nothing to do
        if mesh.is_distributed and torch.distributed.is_initialized():
            # no rank reads checkpoints while rank 0 moves a run aside; every rank learns rank 0's verdict
            dist.broadcast_object_list(box, src=0)  # on the group's own device (NCCL's: the current GPU)
        if box[0] is not None:
            raise RunFinished(finished_message(cfg, box[0]), self.run_dir, box[0])
        if cfg.training.precision == "tf32" and mesh.device.type != "cuda" and mesh.rank == 0:
            log.warning(
                "training.precision=tf32 on %s: TF32 is a mode of CUDA's tensor cores, so this run computes "
                "in plain fp32; set training.precision=fp32 (or bf16 for autocast)",
                mesh.device.type,
            )
        if data is None:
            from ..data.sources import build_data

            data = build_data(cfg, mesh)
        self.data = data
        if model is None:
            self.model = build_run_model(cfg, mesh, data)
        else:
            self.model = init_model(model.to(mesh.device), cfg.run.seed)
        self.frozen = apply_freeze(self.model, cfg.training.freeze)  # before the optimizer: no state
        self.lineage: dict[str, Any] | None = None  # the parent of a fine-tune (training.init_from)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.holders = replication(self.model, mesh)  # domain ranks holding each parameter's block
        self.rep_weights = [1.0 / n for n in self.holders]
        self.optimizer = build_optimizer(self.model, cfg.optim)
        self.loss = TrainingLoss(cfg, data, mesh)
        self.step, self.skipped = 0, 0
        self.history: list[dict[str, float]] = []
        self.validation: dict[str, float] = {}
        self.checkpoint_bytes = model_checkpoint_bytes(self.model, mesh.shape.domain_size)
        # a fine-tune's first start: refuse another model, grid or channel layout before writing anything
        self.parent = None
        fresh = cfg.training.init_from and (
            cfg.checkpoint.resume == "never" or not latest_checkpoint(self.run_dir)
        )
        if fresh:
            self.parent = plan_init_from(cfg, self.model, data)
        on_rank0(
            mesh,
            lambda: preflight_run_dir(self.run_dir, self.checkpoint_bytes, cfg.checkpoint.keep, create=True),
        )
        self._lock = on_rank0(mesh, lambda: lock_run_dir(cfg))
        try:
            resumed = self._resume()
            on_rank0(mesh, lambda: record_start(cfg, self.step, resumed, moved, self.lineage))
        except BaseException:
            self.close()
            raise
        # step accounting (``accounting.py``): phases of every step, declared FLOPs, the peak
        self.clock = StepClock(mesh.device)
        self.feeder = Feeder(data.train_batch, mesh.device)
        replica_batch = cfg.training.batch_size // mesh.shape.data * len(self.members)
        self.flops = step_flops(self.model, replica_batch, cfg.training.rollout_steps)
        self.recompute = cfg.training.activation_checkpointing is True
        if cfg.training.activation_checkpointing == "auto":
            elsize = 2 if cfg.training.precision == "bf16" else 4
            self.recompute = needs_checkpointing(
                self.model, replica_batch, elsize, cfg.training.rollout_steps, mesh
            )
        self.peak_tflops = device_peak_tflops(mesh.device, cfg.training.precision, cfg.logging.peak_tflops)
        # what torch.compile compiles, step by step (logging.compile_report; compile_report.py)
        self.compile_log = CompileLog(self.run_dir, mesh.rank) if cfg.logging.compile_report else None

    def close(self) -> None:
        """Finish the checkpoint being written, then release run.dir's lock (rank 0; ``fit`` does it
        when it ends). Idempotent."""
        failing = sys.exc_info()[1]  # the error fit is ending on, if any
        try:
            self.saver.wait()
        except Exception as err:  # fit is ending on another error: this one is logged, that one raised
            told = failing is not None and communication_error(err)  # a lost peer: its verdict says it
            (log.debug if told else log.error)("the checkpoint written in the background failed: %s", err)
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # ------------------------------------------------------------------ checkpoints
    def _resume(self) -> Path | None:
        mode = self.cfg.checkpoint.resume
        path = None
        if mode != "never":
            path = latest_checkpoint(self.run_dir) if mode == "auto" else Path(mode)
        if path is None:
            if self.parent is not None:  # a fine-tune's first start: the parent's weights
                self.lineage = load_parent(self.parent, self.mesh, self.model)
            return None
        info = load_checkpoint(path, self.model, self.optimizer, self.mesh)
        saved = info["state"]
        if not resumes(saved.get("config_hash"), self.cfg):
            raise ValueError(
                f"checkpoint {path} was written with another model/data/loss/batch configuration; use a new "
                f"run.dir, or pass --new-run to move the old run aside and start over in this one"
            )
        self.step, self.skipped = int(info["step"]), int(saved.get("skipped", 0))
        self.lineage = saved.get("init_from")
        if info["rank_state"] is not None:
            restore_rng(info["rank_state"])
        log.info("resumed from %s at step %d (saved on mesh %s)", path, self.step, info["mesh"])
        return path

    def save(self, background: bool = False) -> Path:
        """Checkpoint this step (collective). ``background`` (and ``checkpoint.background``): return
        once the blocks are copied to host memory, the files written meanwhile (``BackgroundSaver``);
        otherwise return once the checkpoint is complete (a background save of this step included)."""
        if self.saver.pending_step == self.step:  # this step's background save: its end
            path = self.saver.wait()
            if path is not None:
                return path
        state = {"config_hash": config_hash(self.cfg), "skipped": self.skipped, "run": self.cfg.run.name}
        state.update(run_record=run_record(self.cfg, self.data), init_from=self.lineage)
        save = self.saver.save if background and self.cfg.checkpoint.background else save_checkpoint
        self.saver.wait()  # one save at a time: the one in flight first
        request = SaveRequest(
            self.run_dir, self.step, self.model, self.optimizer, self.mesh, state, rank_state=capture_rng(),
            keep_last=self.cfg.checkpoint.keep, expected_bytes=self.checkpoint_bytes,
        )  # fmt: skip
        return save(request)

    # ------------------------------------------------------------------ compute
    def forward(
        self,
        state: torch.Tensor,
        static: torch.Tensor,
        time_features: torch.Tensor,
        noise: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One model step as configured (``step.model_step``: autocast, tendency scaling, noise); float32."""
        bf16 = self.cfg.training.precision == "bf16"
        return model_step(
            self.model, state, static, time_features, bf16=bf16, tendency=self.loss.tendency, noise=noise
        )

    def noise(self, batch: Batch, samples: torch.Tensor, members: range, k: int) -> torch.Tensor | None:
        """Noise channels ``(len(members) · B, K, h, w)`` of rollout step ``k`` (member-major rows);
        ``None`` for a deterministic model (``noise.py`` has the stream's definition)."""
        n = self.cfg.model.noise_channels
        if not n:
            return None
        g = self.data.grid
        shape = (batch.inputs.shape[0], n, *batch.tile.shape)
        parts = [
            member_noise(
                shape,
                seed=self.cfg.run.seed,
                member=m,
                sample_index=samples,
                step=k,
                tile=batch.tile,
                grid=(g.n_lat, g.n_lon),
                device=batch.inputs.device,
            )
            for m in members
        ]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    @property
    def members(self) -> range:
        """Global numbers of the ensemble members this rank runs (batched, member-major rows)."""
        m = self.cfg.training.members // self.mesh.shape.ensemble
        e = self.mesh.ensemble_index
        return range(e * m, (e + 1) * m)

    def _loss_local(self, batch: Batch, step: int) -> torch.Tensor:
        dev = self.mesh.device
        members = self.members
        m, b = len(members), batch.inputs.shape[0]
        state, static = batch.inputs, batch.static
        if m > 1:  # members batched: rows [i·B, (i+1)·B) are member members[i]
            state = state.repeat(m, 1, 1, 1)
        rows = self.data.replica * self.data.local_batch + np.arange(b)
        samples = train_sample_index(step, self.cfg.training.batch_size, rows)
        total = torch.zeros((), device=dev)
        for k in range(batch.lead_steps):
            tf = self.data.step_time_features(batch, k).to(dev, non_blocking=True)
            tf = tf.repeat(m, 1) if m > 1 else tf
            noise = self.noise(batch, samples, members, k)
            if self.recompute:
                state = recompute(self.forward, state, static, tf, noise, use_reentrant=False)
            else:
                state = self.forward(state, static, tf, noise)
            total = total + self.loss.step_term(state, batch.targets[:, k], m)
        return total / self.loss.count

    def train_step(self, step: int) -> dict[str, float]:
        """Run optimizer step ``step`` (1-based) and return its metrics (loss, norm and lr the same
        on every rank; the step accounting this rank's)."""
        clock = self.clock
        clock.start()
        with clock.phase("other"):
            self.optimizer.zero_grad(set_to_none=True)
        with clock.phase("data"):  # the data wait: blocked until this step's batch is here
            batch = self.feeder.get(step - 1)
        with clock.phase("compute"):
            local = self._loss_local(batch, step)
            local.backward()
            sync_gradients(self.params, self.mesh, self.holders)
        if step < self.cfg.training.steps:
            with clock.phase("data"):  # the next batch's copy overlaps clipping and the optimizer
                self.feeder.ahead(step)
        with clock.phase("other"):
            loss_t = global_value(local, self.mesh)
            norm_t = clip_grad_norm(self.params, self.rep_weights, self.cfg.optim.grad_clip, self.mesh)
            # the step's one host read: the NaN policy needs both before the optimizer steps
            loss, norm = torch.stack([loss_t, norm_t.to(loss_t)]).tolist()
            lr = lr_at(step - 1, self.cfg.optim, self.cfg.training.steps)
        finite = math.isfinite(loss) and math.isfinite(norm)
        if not finite:
            self._stop_on_nan_data(batch, step)
            what = f"loss {loss} / grad norm {norm} at step {step}"
            if self.cfg.training.nan_policy == "stop":
                raise NonFiniteLossError(
                    f"non-finite {what}; lower optim.lr, check the data of this step, or set "
                    f"training.nan_policy=skip to skip such steps"
                )
            self.skipped += 1
            log.warning("skipping step %d: non-finite %s (%d skipped)", step, what, self.skipped)
            if self.skipped > self.cfg.training.max_skipped_steps:
                raise NonFiniteLossError(
                    f"{self.skipped} steps skipped for non-finite loss (last: step {step}), more than "
                    f"training.max_skipped_steps={self.cfg.training.max_skipped_steps}; the run diverged"
                )
            self.optimizer.zero_grad(set_to_none=True)
        else:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            with clock.phase("compute"):
                self.optimizer.step()
        parts = clock.stop()
        dt = parts["step_time_s"]
        rates = {"tflops": self.flops / dt / 1e12}
        if self.peak_tflops:
            rates["utilization"] = rates["tflops"] / self.peak_tflops
        return {
            "loss": loss,
            "grad_norm": norm,
            "lr": lr,
            **parts,
            "samples_per_s": self.cfg.training.batch_size / dt,
            **rates,
            "memory_mb": memory_mb(self.mesh.device),
            "skipped": float(not finite),
        }

    def _note_compile(self, label: str, step: int | None) -> None:
        if self.compile_log is not None:
            self.compile_log.note(label, step)

    def _stop_on_nan_data(self, batch: Batch, step: int) -> None:
        """Raise naming the NaNs of step ``step``'s data wherever a rank's tile holds any (training
        reads skip the NaN pass; every rank gets here together, as loss and norm are global)."""
        mine = self.data.nan_report(batch)
        reports = [mine]
        if self.mesh.is_distributed and dist.is_initialized():
            reports = [None] * dist.get_world_size()
            dist.all_gather_object(reports, mine)
        found = [f"rank {r}: {text}" for r, text in enumerate(reports) if text]
        if found:
            raise ValueError(f"the data of step {step} holds NaN values. " + " | ".join(found))

    def run_validation(self) -> dict[str, float]:
        result = validate(self.model, self.data, self.cfg, self.forward, self._val_noise)
        self.validation = result
        return result

    def _val_noise(self, batch: Batch, k: int) -> torch.Tensor | None:
        """Validation scores member 0, with predict's noise stream (``noise.forecast_sample_index``)."""
        return self.noise(batch, forecast_sample_index(batch.times), range(1), k)

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, Any]:
        """Train from ``self.step`` to ``training.steps``; returns a summary (rank 0's figures)."""
        cfg = self.cfg
        monitor = Monitor(cfg, self.run_dir, self.mesh.rank, self.step)
        start_step, t_start = self.step, time.perf_counter()
        try:
            with StopSignals(self.mesh) as stop:
                while self.step < cfg.training.steps:
                    if self.step + 1 == cfg.logging.profile_step:
                        with profiled(self.run_dir, self.step + 1, self.mesh.rank, self.mesh.device):
                            metrics = self.train_step(self.step + 1)
                    else:
                        metrics = self.train_step(self.step + 1)
                    self.step += 1
                    self.history.append({"step": self.step, **metrics})
                    self._note_compile(f"step {self.step}", self.step)
                    monitor.step(self.step, metrics)
                    last = self.step == cfg.training.steps
                    if cfg.validation.every and self.step % cfg.validation.every == 0 and not last:
                        monitor.record("val", self.step, self.run_validation())
                        self._note_compile(f"validation at step {self.step}", None)
                    saved = (cfg.checkpoint.every and self.step % cfg.checkpoint.every == 0) or last
                    ckpt = self.save(background=not last) if saved else None
                    if not last and stop.should_stop():
                        ckpt = self.save()  # complete before the exit (this step's background save)
                        raise Preempted(
                            f"stopped on {stop.received} after step {self.step} of {cfg.training.steps}; "
                            f"saved {ckpt}; run the same command again (sbatch --requeue does) to resume"
                        )
            wall = time.perf_counter() - t_start
            done = self.step - start_step
            steps = [h for h in self.history if h["step"] > start_step + (1 if done > 1 else 0)]  # warm
            breakdown = summarize_steps(steps, self.flops, self.peak_tflops)
            monitor.summary(self.step, breakdown)
            result = self.run_validation()
            monitor.record("val", self.step, result)
            self._note_compile(f"validation at step {self.step}", None)
            if self.compile_log is not None:
                self.compile_log.write()
            table = format_table(result, cfg.validation.variables, cfg.validation.lead_hours)
            summary = {
                "steps": self.step,
                "steps_this_run": done,
                "train_wall_s": wall,
                "samples_per_s": done * cfg.training.batch_size / wall if done else None,
                # no step this start (stopped between its last checkpoint and its summary): the recorded loss
                "final_loss": self.history[-1]["loss"]
                if self.history
                else recorded_loss(self.run_dir, self.step),
                "skipped_steps": self.skipped,
                "step_breakdown": breakdown,
                "validation": result,
                "mesh": str(self.mesh.shape),
                "init_from": self.lineage,
            }
            if self.mesh.rank == 0:
                (self.run_dir / "validation.txt").write_text(table + "\n")
                (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
                # the train command prints the table once; a Trainer used from Python logs it at debug
                log.debug("validation at step %d (%d inits):\n%s", self.step, int(result["n_inits"]), table)
            summary["table"] = table
            return summary
        finally:
            monitor.close()
            self.close()
