"""Process-level entry: set up the mesh from the config (single process, torchrun, Slurm) and train.

A peer that never arrives makes ``init_mesh`` fail after ``distributed.timeout_s`` with an
error naming the rank, the world size and the fix, instead of hanging.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch.distributed as dist

from ..config.schema import TrainConfig
from ..distributed.mesh import DomainMesh, init_mesh, slurm_environment

__all__ = ["run_training", "setup_mesh", "world_size_from_env"]

log = logging.getLogger(__name__)


def world_size_from_env() -> int:
    env = {**os.environ, **slurm_environment()}
    return int(env.get("WORLD_SIZE", "1"))


def setup_mesh(cfg: TrainConfig) -> DomainMesh:
    """``init_mesh`` with the config's mesh, backend and timeout; a clear error on a missing peer."""
    backend = None if cfg.distributed.backend == "auto" else cfg.distributed.backend
    try:
        return init_mesh(cfg.mesh.shape, backend=backend, timeout_s=cfg.distributed.timeout_s)
    except (RuntimeError, dist.DistError) as err:
        if isinstance(err, ValueError):
            raise
        rank, world = os.environ.get("RANK", "?"), os.environ.get("WORLD_SIZE", "?")
        raise TimeoutError(
            f"rank {rank} of {world}: the process group did not form within distributed.timeout_s="
            f"{cfg.distributed.timeout_s:g} s ({str(err).splitlines()[0]}); check that all {world} processes "
            f"were launched and can reach MASTER_ADDR={os.environ.get('MASTER_ADDR')}:"
            f"{os.environ.get('MASTER_PORT')}"
        ) from err


def run_training(cfg: TrainConfig) -> dict[str, Any]:
    """Train ``cfg`` on this process's rank; returns the trainer's summary."""
    from .loop import Trainer

    mesh = setup_mesh(cfg)
    try:
        trainer = Trainer(cfg, mesh)
        return trainer.fit()
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception as err:  # pragma: no cover - teardown after a failure
                log.debug("destroy_process_group: %s", err)
