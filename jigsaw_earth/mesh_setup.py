"""Starting a rank: the mesh of a config, from a single process, torchrun or Slurm srun.

A peer that never arrives makes ``init_mesh`` fail after ``distributed.timeout_s`` with an error
naming the rank, the world size and the fix, instead of hanging.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as dist

from .config.schema import TrainConfig
from .device import resolve_device
from .distributed.mesh import DomainMesh, collective_timeout_s, init_mesh, rank_transport, slurm_environment

__all__ = ["setup_mesh", "world_size_from_env"]


def world_size_from_env() -> int:
    env = {**os.environ, **slurm_environment()}
    return int(env.get("WORLD_SIZE", "1"))


def _init_elastic_group(backend: str | None, timeout_s: float, device: str, transport: str | None) -> None:
    """Under torchrun, start the default group on a store prefixed by the restart attempt.

    After ``torchrun --max-restarts`` restarts the workers, the rendezvous store still holds the
    first attempt's keys (the dead ranks' addresses); a restarted rank could read one before its
    peer overwrites it and wait for a process that no longer exists. A per-attempt prefix makes
    every key of the default group and of every sub-group fresh.
    """
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if restart is None or world == 1 or dist.is_initialized():
        return
    rank = int(os.environ["RANK"])
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        is_master=rank == 0 and not agent_store,
        timeout=timedelta(seconds=timeout_s),
    )
    dev = resolve_device("cpu" if device == "auto" and backend == "gloo" else device)
    plan = rank_transport(transport, dev, backend)
    dist.init_process_group(
        plan.backend,
        store=dist.PrefixStore(f"jigsaw-earth/attempt-{restart}", store),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=collective_timeout_s(timeout_s)),
        device_id=plan.bound_device(dev),
    )


def setup_mesh(cfg: TrainConfig) -> DomainMesh:
    """``init_mesh`` with the config's mesh, backend and timeout; a clear error on a missing peer."""
    backend = None if cfg.distributed.backend == "auto" else cfg.distributed.backend
    try:
        _init_elastic_group(
            backend, cfg.distributed.timeout_s, cfg.distributed.device, cfg.distributed.transport
        )
        return init_mesh(
            cfg.mesh.shape,
            backend=backend,
            timeout_s=cfg.distributed.timeout_s,
            transport=cfg.distributed.transport,
            device=cfg.distributed.device,
        )
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
