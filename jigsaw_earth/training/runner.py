"""Process-level entry: the mesh of the config (``distributed.launch``), then train."""

from __future__ import annotations

import logging
from typing import Any

import torch.distributed as dist

from ..config.schema import TrainConfig
from ..mesh_setup import setup_mesh

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
