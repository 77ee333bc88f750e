"""Run a function on N local processes joined in a process group (tests, validator, selftest).

One spawn runs many cases: pass a function that loops over them, not one spawn per case.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..device import load_device_plugin
from .mesh import DomainMesh, MeshShape, init_mesh

__all__ = ["free_port", "spawn"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(
    rank: int, shape: MeshShape, port: int, fn: Callable, args: tuple, out_dir: str, device: str
) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(shape.world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(shape.world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    load_device_plugin()
    mesh = init_mesh(shape, backend="gloo" if device == "cpu" else None, timeout_s=300, device=device)
    try:
        result = fn(mesh, *args)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(
    shape: MeshShape,
    fn: Callable[..., Any],
    *args: Any,
    timeout_s: float = 1200.0,
    device: str = "cpu",
) -> list[Any]:
    """Call ``fn(mesh, *args)`` on every rank of ``shape``; return the ranks' JSON results.

    ``device``: the ranks' device (``distributed.device``; a GPU each, joined by NCCL, for ``cuda``).

    ``fn`` must be importable (module level). With world size 1 it runs in this process.
    A rank that raises fails the whole call with that rank's traceback; a run longer than
    ``timeout_s`` is killed.
    """
    if shape.world_size == 1:
        return [json.loads(json.dumps(fn(DomainMesh(shape), *args)))]
    with tempfile.TemporaryDirectory(prefix="jigsaw-spawn-") as out_dir:
        ctx = mp.start_processes(
            _worker,
            args=(shape, free_port(), fn, args, out_dir, device),
            nprocs=shape.world_size,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout_s
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise TimeoutError(f"spawned mesh {shape} did not finish within {timeout_s:.0f} s")
        return [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(shape.world_size)]
