"""Export a sharded checkpoint as one file of full (canonical global) tensors, for 1-rank use."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from .manager import _quiet, read_meta
from .planner import Block, BlockLoadPlanner, SafeFileSystemReader

__all__ = ["export_full_state_dict", "load_full_tensors"]

log = logging.getLogger(__name__)


def load_full_tensors(path: str | os.PathLike, prefix: str = "model/") -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint whose name starts with ``prefix``, assembled to its global shape.

    Runs in one process without a process group (call it on one rank only).
    """
    path = Path(path)
    meta = read_meta(path)
    md = SafeFileSystemReader(path).read_metadata()
    out: dict[str, torch.Tensor] = {}
    for name, info in meta["tensors"].items():
        if name.startswith(prefix):
            props = md.state_dict_metadata[name].properties  # type: ignore[union-attr]
            out[name] = torch.zeros(info["global_shape"], dtype=props.dtype)
    blocks = {k: Block(t, tuple(t.shape), (0,) * t.dim()) for k, t in out.items()}
    _quiet(
        dcp.load,
        {},
        storage_reader=SafeFileSystemReader(path),
        planner=BlockLoadPlanner(blocks),
        no_dist=True,
    )
    return {k.removeprefix(prefix): t for k, t in out.items()}


def export_full_state_dict(path: str | os.PathLike, out_file: str | os.PathLike) -> Path:
    """Write the model's full parameters as a ``torch.save`` dict of tensors (``weights_only``-loadable).

    Keys are parameter paths; values are the canonical global tensors (the 1-rank model's
    parameters), so ``model.load_state_dict(torch.load(out_file, weights_only=True), strict=False)``
    restores a model built on a one-rank domain.
    """
    tensors = load_full_tensors(path)
    out = Path(out_file)
    torch.save(tensors, out)
    log.info("exported %d tensors from %s to %s", len(tensors), path, out)
    return out
