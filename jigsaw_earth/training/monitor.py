"""Rank-0 reporting: one fixed-format line per step, a tqdm bar, JSON lines and wandb.

The step line ends with the step accounting (``accounting.py``): each part's share of the step
(compute, exposed communication, data wait, other) and the achieved TFLOP/s of this rank.

* ``metrics.jsonl`` in the run directory gets one JSON object per logged step and per
  validation (appended, so a resumed run continues the same file; rows past the step a run
  resumes from are dropped first, so no step appears twice).
* wandb runs in ``offline`` mode unless the config says ``online``: it writes under
  ``run.dir/wandb`` and never touches the network (``wandb sync`` uploads later). Any wandb
  failure is logged and training goes on without it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from ..config.parse import to_dict
from ..config.schema import TrainConfig
from ..data.objects import is_object_url
from ..data.reader import read_threads
from ..device import peak_memory_bytes
from ..distributed.mesh import cores_per_rank
from .accounting import format_breakdown, format_step
from .rundir import truncate_metrics

__all__ = ["DATA_WAIT_WARNING", "Monitor", "memory_mb"]

#: a logged step that waited for data longer than this share of it gets one warning naming the fixes
DATA_WAIT_WARNING = 0.10

log = logging.getLogger(__name__)


def memory_mb(device: torch.device) -> float:
    """Peak memory of this rank in MiB: allocated on its GPU, else the process's resident set."""
    return peak_memory_bytes(device) / 2**20


class Monitor:
    """Reporting for rank 0; every method is a no-op on other ranks."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, rank: int, start_step: int):
        self.cfg, self.run_dir, self.enabled = cfg, run_dir, rank == 0
        self._waited, self._data_warned = [0.0, 0.0, 0], False  # data wait, step time, steps since a log
        self.bar: tqdm | None = None
        self.wandb: Any = None
        self._last = time.perf_counter()
        if not self.enabled:
            return
        truncate_metrics(run_dir / "metrics.jsonl", start_step, final=start_step >= cfg.training.steps)
        self.jsonl = (run_dir / "metrics.jsonl").open("a")
        if cfg.logging.progress and sys.stderr.isatty():
            self.bar = tqdm(total=cfg.training.steps, initial=start_step, desc="train", dynamic_ncols=True)
        self._start_wandb()

    def _start_wandb(self) -> None:
        w = self.cfg.logging.wandb
        if w.mode == "disabled":
            return
        os.environ.setdefault("WANDB_SILENT", "true")
        try:
            import wandb

            self.wandb = wandb.init(
                project=w.project,
                entity=w.entity,
                name=self.cfg.run.name,
                dir=str(self.run_dir),
                mode=w.mode,
                config=to_dict(self.cfg),
                resume="allow",
                id=_run_id(self.run_dir),
                settings=wandb.Settings(console="off", x_disable_stats=True)
                if hasattr(wandb, "Settings")
                else None,
            )
        except Exception as err:  # wandb must never stop training
            log.warning("wandb (%s) could not start, continuing without it: %s", w.mode, err)
            self.wandb = None

    def record(self, kind: str, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = {"kind": kind, "step": step, "time": time.time(), **values}
        self.jsonl.write(json.dumps(row) + "\n")
        self.jsonl.flush()
        if self.wandb is not None:
            try:
                self.wandb.log({f"{kind}/{k}": v for k, v in values.items() if _scalar(v)}, step=step)
            except Exception as err:
                log.warning("wandb.log failed, continuing: %s", err)

    def step(self, step: int, values: dict[str, float]) -> None:
        """One training step: progress bar always, line + JSON every ``logging.every`` steps."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{values['loss']:.4g}", refresh=False)
        if step > 1:  # the first step waits for the first batch by design
            self._waited[0] += values.get("data_s", 0.0)
            self._waited[1] += values.get("step_time_s", 0.0)
            self._waited[2] += 1
        if step % self.cfg.logging.every == 0 or step == self.cfg.training.steps:
            line = (
                f"step {step:>6}/{self.cfg.training.steps} loss {values['loss']:.6f} "
                f"grad_norm {values['grad_norm']:.4f} lr {values['lr']:.3e} "
                f"samples/s {values['samples_per_s']:.2f} mem {values['memory_mb']:.0f} MiB | "
                f"{format_step(values)}"
            )
            if self.bar is not None:
                self.bar.write(line)
            else:
                log.info(line)
            self.record("train", step, values)
            self._check_data_wait(step, values)

    def _check_data_wait(self, step: int, values: dict[str, float]) -> None:
        """Warn once when the steps since the last log point waited for data over 10 % of their time."""
        waited, total, steps = self._waited
        self._waited = [0.0, 0.0, 0]
        share = waited / total if total else 0.0
        if share <= DATA_WAIT_WARNING or self._data_warned:
            return
        self._data_warned = True
        mesh = f"{self.cfg.mesh.lat}x{self.cfg.mesh.lon}"
        d = self.cfg.data
        remote = is_object_url(d.store)
        threads, cores = read_threads(d.read_threads, remote), cores_per_rank()
        setting = f"data.read_threads={d.read_threads}"
        if remote:
            reading = (
                f"{setting} keeps {threads} requests in flight per rank to the bucket: raise it for a "
                "link with more latency per request"
            )
        elif threads < cores:
            reading = f"Raise data.read_threads ({setting}: {threads} of this rank's {cores} cores read)"
        else:  # auto, or as many: one thread per core
            reading = (
                f"{setting} reads with {threads} thread(s), one per core of this rank (give each rank "
                "more cores: fewer ranks per host, or Slurm's --cpus-per-task)"
            )
        log.warning(
            "steps up to %d waited %.0f ms per step for their batches (%.0f%% of the time): reading is "
            "slower than the step. %s; raise data.prefetch (it is %d), write the store for this mesh "
            "(jigsaw-earth data prepare SRC --out DST --for-mesh %s --compression none), and compare "
            "jigsaw-earth bench io %s --mesh %s with the step time",
            step,
            1e3 * waited / max(steps, 1),
            100 * share,
            reading,
            d.prefetch,
            mesh,
            d.store,
            mesh,
        )

    def summary(self, step: int, breakdown: dict[str, float]) -> None:
        """The run's step accounting: one line, a ``step_summary`` row and wandb's summary."""
        if not self.enabled or not breakdown:
            return
        line = f"step time (rank 0): {format_breakdown(breakdown)}"
        if self.bar is not None:
            self.bar.write(line)
        else:
            log.info(line)
        self.record("step_summary", step, breakdown)

    def close(self) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        self.jsonl.close()
        if self.wandb is not None:
            try:
                self.wandb.finish()
            except Exception as err:
                log.warning("wandb.finish failed: %s", err)


def _scalar(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _run_id(run_dir: Path) -> str:
    """A stable wandb id per run directory, so a resumed run continues the same wandb run."""
    path = run_dir / "wandb_id"
    if path.exists():
        return path.read_text().strip()
    import uuid

    rid = uuid.uuid4().hex[:12]
    path.write_text(rid)
    return rid
