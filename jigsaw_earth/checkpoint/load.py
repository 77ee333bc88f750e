"""Load a checkpoint written on any mesh into this rank's blocks (DCP's resharding underneath)."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from ..distributed.mesh import DomainMesh
from .manager import _quiet, _rank, read_meta
from .planner import Block, BlockLoadPlanner, SafeFileSystemReader
from .state import model_blocks, optimizer_blocks, prepare_optimizer, restore_optimizer_json

__all__ = ["load_checkpoint"]

log = logging.getLogger(__name__)


def _check_shapes(path: Path, meta: dict[str, Any], blocks: dict[str, Block]) -> None:
    saved = meta["tensors"]
    missing = sorted(k for k in blocks if k not in saved)
    if missing:
        raise ValueError(
            f"checkpoint {path} has no {', '.join(missing[:5])}{' …' if len(missing) > 5 else ''} "
            f"({len(missing)} missing); it was written by a different model — build the same model "
            "(same name, preset and overrides) as the run that saved it"
        )
    for k, b in blocks.items():
        if tuple(saved[k]["global_shape"]) != tuple(b.global_shape):
            raise ValueError(
                f"checkpoint {path}: {k} has global shape {tuple(saved[k]['global_shape'])}, the model's is "
                f"{tuple(b.global_shape)}; build the model with the configuration it was saved with"
            )


def load_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    mesh: DomainMesh,
    *,
    strict: bool = True,
) -> dict[str, Any]:
    """Load a checkpoint written on any mesh into this rank's blocks; collective over the job.

    Returns ``{"step", "state", "rank_state", "mesh"}``; ``rank_state`` is this rank's saved
    per-rank state when the job has the same world size as the saving one, else ``None``.
    ``strict=False`` skips model tensors the checkpoint lacks (e.g. fine-tuning a new head).
    """
    t0 = time.perf_counter()
    path = Path(path)
    meta = read_meta(path)
    blocks = {k: b for k, (b, _) in model_blocks(model).items()}
    if not strict:
        blocks = {k: b for k, b in blocks.items() if k in meta["tensors"]}
    if optimizer is not None:
        if meta["optimizer"] is None:
            raise ValueError(f"checkpoint {path} has no optimizer state; load it with optimizer=None")
        restore_optimizer_json(optimizer, meta["optimizer"])
        prepare_optimizer(model, optimizer, meta["optimizer"])
        blocks.update({k: b for k, (b, _) in optimizer_blocks(model, optimizer).items()})
    _check_shapes(path, meta, blocks)
    targets = {k: Block(b.tensor.detach(), b.global_shape, b.offsets) for k, b in blocks.items()}
    try:
        with torch.no_grad():
            _quiet(dcp.load, {}, storage_reader=SafeFileSystemReader(path), planner=BlockLoadPlanner(targets))
    except (Exception, CheckpointException) as e:  # DCP's CheckpointException is a BaseException
        first = str(e).strip().splitlines()
        detail = next(
            (ln for ln in reversed(first) if "Error" in ln), first[-1] if first else type(e).__name__
        )
        raise ValueError(
            f"cannot read checkpoint {path}: {detail.strip()}; its files are missing, truncated or "
            f"corrupted — delete {path} and resume from an older checkpoint (list_checkpoints(RUN_DIR))"
        ) from e
    rank_state = None
    rank_file = path / "rank_state" / f"rank_{_rank():05d}.json"
    if meta["world_size"] == mesh.shape.world_size and rank_file.is_file():
        rank_state = json.loads(rank_file.read_text())
    if _rank() == 0:  # one line per job, not per rank
        log.info(
            "loaded checkpoint %s (saved on mesh %s) in %.2f s", path, meta["mesh"], time.perf_counter() - t0
        )
    return {"step": meta["step"], "state": meta["state"], "rank_state": rank_state, "mesh": meta["mesh"]}
