"""Load another run's checkpoint into a model whose channels differ: the weights of a fine-tune.

The model declares its channel-indexed weights (``channel_dims``: ``jigsaw_earth.layers.channels``).
``channel_maps`` matches the parent's channel names with the new model's: along each such
dimension every entry of a kept channel points at its entry in the parent, every entry of an
added channel at nothing. ``load_transferred`` then fills each rank's block (collective, any
mesh, one DCP read for the whole model):

* a tensor without channel dimensions is read as ``load_checkpoint`` reads it (same global
  shape, or an error naming the tensor and both shapes);
* a channel-indexed tensor reads, from the parent, the box of rows/columns its kept channels
  need within this rank's block (so no rank reads more than its block spans in the parent),
  and scatters them to the kept positions; entries of added channels are zero where the
  dimension says ``zero_new`` (weights from a new input, to a new output) and otherwise keep
  the model's fresh initialisation; entries of removed channels are not read.

``checkpoint_sha256`` identifies a checkpoint's content (every file but readers' pins).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from ..distributed.mesh import DomainMesh
from ..layers.channels import ChannelDims
from .manager import _PIN, _quiet, read_meta
from .planner import Block, BlockLoadPlanner, SafeFileSystemReader
from .state import model_blocks

__all__ = [
    "ChannelMap",
    "ParentWeights",
    "channel_maps",
    "check_transfer",
    "checkpoint_sha256",
    "load_transferred",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChannelMap:
    """Dimension ``dim`` of a tensor: ``index[i]`` is the parent's entry of entry ``i`` (-1: added)."""

    dim: int
    index: np.ndarray
    zero_new: bool
    parent_size: int


def channel_maps(child: ChannelDims, parent: ChannelDims) -> dict[str, tuple[ChannelMap, ...]]:
    """Entry maps of every channel-indexed tensor from the model's ``channel_dims`` called with the
    new names (``child``) and with the parent's (``parent``)."""
    if set(child) != set(parent):
        raise ValueError(
            f"channel_dims names different tensors for the parent's channels ({sorted(parent)}) and the new "
            f"ones ({sorted(child)}); it must depend on the channel names only"
        )
    out: dict[str, tuple[ChannelMap, ...]] = {}
    for name, dims in child.items():
        maps = []
        for c, p in zip(dims, parent[name], strict=True):
            if (c.dim, c.inner, c.zero_new) != (p.dim, p.inner, p.zero_new):
                raise ValueError(
                    f"channel_dims of {name} describe dimension {c.dim} differently for the parent"
                )
            for dim in (c, p):
                dup = sorted({n for n in dim.names if dim.names.count(n) > 1})
                if dup:
                    raise ValueError(
                        f"channel_dims of {name}: channel names {dup} appear twice along dim {c.dim}"
                    )
            where = {n: k for k, n in enumerate(p.names)}
            channel = np.array([where.get(n, -1) for n in c.names], dtype=np.int64)
            inner = np.arange(c.inner, dtype=np.int64)
            index = np.where(channel[:, None] >= 0, channel[:, None] * c.inner + inner, -1).reshape(-1)
            maps.append(ChannelMap(c.dim, index, c.zero_new, p.size))
        out[name] = tuple(maps)
    return out


def checkpoint_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a checkpoint's files (relative names and contents, sorted; readers' pins left out)."""
    root = Path(path)
    digest = hashlib.sha256()
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(_PIN))
    for f in files:
        digest.update(f.relative_to(root).as_posix().encode() + b"\0")
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()


def _box(
    block: Block, maps: tuple[ChannelMap, ...]
) -> tuple[list[int], list[int], dict[int, np.ndarray]] | None:
    """The parent's box (offsets, sizes) that this block's kept entries need, and for each channel
    dimension this block's entry map; ``None`` when the block holds no kept entry."""
    lo, size = list(block.offsets), list(block.tensor.shape)
    local: dict[int, np.ndarray] = {}
    for m in maps:
        o, n = block.offsets[m.dim], block.tensor.shape[m.dim]
        idx = m.index[o : o + n]
        local[m.dim] = idx
        kept = idx[idx >= 0]
        if not len(kept):
            return None
        lo[m.dim], size[m.dim] = int(kept.min()), int(kept.max() - kept.min() + 1)
    return lo, size, local


def _put(target: torch.Tensor, positions: list[tuple[int, torch.Tensor]], values: torch.Tensor) -> None:
    """``target[positions (outer product over dims)] = values``, in place."""
    (dim, pos), rest = positions[0], positions[1:]
    if not rest:
        target.index_copy_(dim, pos, values)
        return
    sub = target.index_select(dim, pos)
    _put(sub, rest, values)
    target.index_copy_(dim, pos, sub)


def check_transfer(
    path: str | os.PathLike,
    model: nn.Module,
    maps: dict[str, tuple[ChannelMap, ...]],
    saved: dict[str, tuple[int, ...]] | None = None,
) -> dict[str, tuple[int, ...]]:
    """Refuse a parent whose tensors do not fit ``model`` (reads only ``meta.json``, or takes the
    parent's global shapes ``saved`` by ``model/`` key): a tensor missing on either side, or another
    global shape outside the mapped channel dimensions. Returns the global shape each of the
    model's tensors has in the parent."""
    path = Path(path)
    if saved is None:
        meta = read_meta(path)
        saved = {k: tuple(v["global_shape"]) for k, v in meta["tensors"].items() if k.startswith("model/")}
    mine = {k: b for k, (b, _) in model_blocks(model).items()}
    unknown = sorted(k for k in maps if f"model/{k}" not in mine)
    if unknown:
        raise ValueError(f"channel_dims names {unknown}, which are not parameters of the model")
    missing = sorted(k.removeprefix("model/") for k in mine if k not in saved)
    extra = sorted(k.removeprefix("model/") for k in saved if k not in mine)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"the parent lacks {', '.join(missing[:4])}{' …' if len(missing) > 4 else ''}")
        if extra:
            parts.append(
                f"it has {', '.join(extra[:4])}{' …' if len(extra) > 4 else ''}, which this model lacks"
            )
        raise ValueError(
            f"checkpoint {path} holds a different model: {'; '.join(parts)}; fine-tune it with the parent's "
            "model (model.name, preset and overrides)"
        )
    shapes: dict[str, tuple[int, ...]] = {}
    for key, block in mine.items():
        name = key.removeprefix("model/")
        want = list(block.global_shape)
        for m in maps.get(name, ()):
            if len(m.index) != want[m.dim]:
                raise ValueError(
                    f"channel_dims of {name} names {len(m.index)} entries along dim {m.dim}, the tensor has "
                    f"{want[m.dim]}; the model's channel_dims hook must name every channel its layer sees"
                )
            want[m.dim] = m.parent_size
        if tuple(want) != saved[key]:
            channels = " with the parent's channels" if name in maps else ""
            raise ValueError(
                f"checkpoint {path}: {name} has global shape {saved[key]} in the parent, this model's "
                f"would be {tuple(want)}{channels}; the parent is a different model or grid (fine-tune "
                "with the parent's model.name, preset, overrides and grid)"
            )
        shapes[key] = saved[key]
    return shapes


@dataclass(frozen=True)
class ParentWeights:
    """Weights that are not a DCP checkpoint (a shared model's folder): their global shapes by
    ``model/`` key, how to fill blocks of them, and the parent's ``{"step", "state", "mesh"}``."""

    shapes: dict[str, tuple[int, ...]]
    fill: Callable[[dict[str, Block]], None]
    info: dict[str, Any]


def load_transferred(
    path: str | os.PathLike,
    model: nn.Module,
    mesh: DomainMesh,
    maps: dict[str, tuple[ChannelMap, ...]],
    weights: ParentWeights | None = None,
) -> dict[str, Any]:
    """Fill ``model`` from checkpoint ``path`` of a model whose channels differ (collective), or
    from ``weights`` read another way (``path`` then names them).

    ``maps`` (``channel_maps``) names the channel-indexed parameters by path. Every other
    parameter must have the parent's global shape (``check_transfer``). Returns ``{"step",
    "state", "mesh"}`` of the parent. The optimizer, step and RNG of the parent are not read.
    """
    t0 = time.perf_counter()
    path = Path(path)
    meta = read_meta(path) if weights is None else weights.info
    parent_shapes = check_transfer(path, model, maps, None if weights is None else weights.shapes)
    mine = {k: b for k, (b, _) in model_blocks(model).items()}
    targets: dict[str, Block] = {}
    scatters: list[
        tuple[torch.Tensor, dict[int, np.ndarray], torch.Tensor, list[int], tuple[ChannelMap, ...]]
    ] = []
    for key, block in mine.items():
        tmaps = maps.get(key.removeprefix("model/"), ())
        param = block.tensor.detach()
        if not tmaps:
            targets[key] = Block(param, block.global_shape, block.offsets)
            continue
        with torch.no_grad():
            for m in tmaps:  # weights from new inputs and to new outputs start at zero
                o, n = block.offsets[m.dim], param.shape[m.dim]
                new = np.nonzero(m.index[o : o + n] < 0)[0]
                if m.zero_new and len(new):
                    param.index_fill_(m.dim, torch.as_tensor(new, device=param.device), 0.0)
        box = _box(block, tmaps)
        if box is None:
            continue
        lo, size, local = box
        tmp = torch.empty(size, dtype=param.dtype, device=param.device)
        targets[key] = Block(tmp, parent_shapes[key], tuple(lo))
        scatters.append((param, local, tmp, lo, tmaps))
    with torch.no_grad():
        try:
            if weights is not None:
                weights.fill(targets)
            else:
                reader = SafeFileSystemReader(path)
                _quiet(dcp.load, {}, storage_reader=reader, planner=BlockLoadPlanner(targets))
        except (Exception, CheckpointException) as e:  # DCP's CheckpointException is a BaseException
            cause = str(e).strip().splitlines()[-1] if str(e).strip() else repr(e)
            raise ValueError(
                f"cannot read checkpoint {path}: {cause}; its files are missing, truncated or "
                "corrupted — fine-tune from another checkpoint"
            ) from e
        for param, local, tmp, lo, tmaps in scatters:
            values, positions = tmp, []
            for m in tmaps:
                idx = local[m.dim]
                kept = np.nonzero(idx >= 0)[0]
                src = torch.as_tensor(idx[kept] - lo[m.dim], device=tmp.device)
                values = values.index_select(m.dim, src)
                positions.append((m.dim, torch.as_tensor(kept, device=param.device)))
            _put(param, positions, values)
    if not dist.is_initialized() or dist.get_rank() == 0:
        log.info(
            "loaded the weights of %s (saved on mesh %s) with channels matched by name in %.2f s",
            path,
            meta["mesh"],
            time.perf_counter() - t0,
        )
    return {"step": meta["step"], "state": meta["state"], "mesh": meta["mesh"]}
