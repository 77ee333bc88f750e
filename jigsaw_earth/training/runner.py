"""Process-level entry: the mesh of the config (``distributed.launch``), then train."""

from __future__ import annotations

import logging
from typing import Any

import torch.distributed as dist

from ..checkpoint import latest_checkpoint
from ..config.schema import TrainConfig
from ..distributed.heartbeat import EXIT_PEER_LOST, Verdict, watched
from ..mesh_setup import setup_mesh
from ..signals import rerun_hint

__all__ = ["run_training"]

log = logging.getLogger(__name__)


def run_training(cfg: TrainConfig, new_run: bool = False) -> dict[str, Any]:
    """Train ``cfg`` on this process's rank; returns the trainer's summary.

    ``new_run``: move an earlier run in ``run.dir`` aside and start a new one (``rundir.py``).
    """
    from .loop import Trainer

    mesh = setup_mesh(cfg)
    trainer = None
    try:
        with watched(mesh.rank, mesh.shape.world_size, mesh.hosts, cfg.distributed.timeout_s,
                     lambda verdict: _resume_hint(cfg, verdict)):  # fmt: skip
            trainer = Trainer(cfg, mesh, new_run=new_run)
            return trainer.fit()
    finally:
        if trainer is not None:
            trainer.close()
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception as err:  # pragma: no cover - teardown after a failure
                log.debug("destroy_process_group: %s", err)


def _resume_hint(cfg: TrainConfig, verdict: Verdict) -> str:
    """The newest complete checkpoint and how to resume from it (a lost peer's one line)."""
    ckpt = latest_checkpoint(cfg.run.dir)
    if verdict.exit_code != EXIT_PEER_LOST:
        return f"newest complete checkpoint: {ckpt or 'none'}"
    auto = "" if cfg.checkpoint.resume == "auto" else " with checkpoint.resume=auto"
    return f"newest complete checkpoint: {ckpt or 'none (the run starts over)'}; resume: {rerun_hint()}{auto}"
