"""Model size, per-rank memory and per-step communication, without allocating the model.

Every domain rank's model is constructed on the ``meta`` device (``meta_construction``): shapes
and shard specs are real, storage and initialisation are not, so a 3-billion-parameter model on
a 721 × 1440 grid is described in seconds. Communication is the sum of the bytes each layer
declares beside its forward (``cost``, ``layers.cost.model_cost``: the figures the comm ledger
measures), summed over all ranks of one domain group, for one training step (forward +
backward) at ``batch`` samples per group, fp32. ``plan`` reads the same declarations.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..distributed.mesh import DomainMesh, MeshShape
from ..layers.base import Domain, spec_of
from ..layers.cost import model_cost
from . import MODELS, build_model, model_class

__all__ = [
    "CHECKPOINT_STATES",
    "TENSOR_OVERHEAD",
    "TRAIN_STATES",
    "ModelSummary",
    "checkpoint_bytes",
    "meta_construction",
    "rank_models",
    "summarize",
]

TRAIN_STATES = 4  # tensors per parameter while training: parameter, gradient, AdamW exp_avg, exp_avg_sq
CHECKPOINT_STATES = 3  # tensors per parameter in a checkpoint: parameter, exp_avg, exp_avg_sq
TENSOR_OVERHEAD = 1600  # bytes of DCP/torch.save framing per saved block (measured: 1575 B)


def checkpoint_bytes(total_params: int, n_tensors: int = 0, writers: int = 1, elsize: int = 4) -> int:
    """Bytes of a training checkpoint (model + AdamW state) for ``total_params`` parameters.

    ``n_tensors`` parameter tensors, each saved as one block by each of ``writers`` domain ranks.
    """
    return CHECKPOINT_STATES * (total_params * elsize + n_tensors * writers * TENSOR_OVERHEAD)


_FACTORIES = {torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn, torch.empty_like}


class _MetaFactories(TorchFunctionMode):
    """Tensor factories without an explicit device allocate on ``meta``; ``torch.tensor`` (used
    for small host-side scalars during initialisation) stays on the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = dict(kwargs or {})
        if func in _FACTORIES and kwargs.get("device") is None:
            kwargs["device"] = "meta"
        return func(*args, **kwargs)


def _skip_fill(p: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    """Initialisation of a ``meta`` parameter: nothing to fill."""


@contextlib.contextmanager
def meta_construction() -> Iterator[None]:
    """Construct modules with every parameter on the ``meta`` device (no storage, no init cost).

    The layers' counter-based fills are skipped while inside (the values of a meta tensor do not
    exist; computing them on meta would only cost time), and restored on exit.
    """
    for name in MODELS:
        model_class(name)  # import every model's layers before patching them
    saved = []
    for mod_name, mod in list(sys.modules.items()):
        if mod_name.startswith("jigsaw_earth.layers") and mod is not None:
            for fn in ("fill_uniform_", "fill_normal_"):
                if hasattr(mod, fn):
                    saved.append((mod, fn, getattr(mod, fn)))
                    setattr(mod, fn, _skip_fill)
    try:
        with _MetaFactories():
            yield
    finally:
        for mod, fn, orig in saved:
            setattr(mod, fn, orig)


def rank_models(
    name: str,
    shape: MeshShape,
    grid: tuple[int, int],
    n_state: int,
    n_static: int,
    n_time: int,
    preset: str,
    **overrides: Any,
) -> list[nn.Module]:
    """The model of every domain rank of ``shape`` (data replica 0), constructed on ``meta``."""
    models = []
    with meta_construction():
        for k in range(shape.domain_size):
            domain = Domain.create(DomainMesh(MeshShape(1, shape.lat, shape.lon), rank=k), *grid)
            models.append(build_model(name, domain, n_state, n_static, n_time, preset, **overrides))
    return models


@dataclass
class ModelSummary:
    model: str
    preset: str
    mesh: str
    grid: tuple[int, int]
    channels: dict[str, int]
    batch: int
    total_params: int
    rank_params: list[int]
    rank_param_bytes_max: int
    rank_train_bytes_max: int  # parameters + gradients + AdamW's two states, fp32
    serial_train_bytes: int
    train_bytes_ratio: float  # rank max / serial
    comm_forward_bytes: int
    comm_backward_bytes: int
    comm_by_layer: dict[str, list[int]] = field(default_factory=dict)
    data_parallel_allreduce_bytes: int = 0
    checkpoint_bytes: int = 0  # model + AdamW state in a checkpoint, fp32 (metadata not counted)
    seconds: float = 0.0
    config: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def summarize(
    name: str,
    shape: MeshShape,
    grid: tuple[int, int],
    n_state: int,
    n_static: int,
    n_time: int,
    preset: str = "tiny",
    batch: int = 1,
    elsize: int = 4,
    **overrides: Any,
) -> ModelSummary:
    """Parameter counts, per-rank bytes and analytical communication of one training step."""
    import time

    start = time.perf_counter()
    models = rank_models(name, shape, grid, n_state, n_static, n_time, preset, **overrides)
    total = sum(_numel(spec_of(p).global_shape) for p in models[0].parameters())
    per_rank = [sum(p.numel() for p in m.parameters()) for m in models]
    fwd = bwd = 0
    by_layer: dict[str, list[int]] = {}
    for cost in model_cost(models[0], batch, elsize).values():
        for op, (f, b) in cost.bytes.items():
            fwd, bwd = fwd + f, bwd + b
            acc = by_layer.setdefault(op, [0, 0])
            acc[0], acc[1] = acc[0] + f, acc[1] + b
    train = TRAIN_STATES * elsize
    n_tensors = len(list(models[0].parameters()))
    d = shape.data
    dp = 2 * (d - 1) * max(per_rank) * elsize // d * shape.domain_size if d > 1 else 0
    cfg = getattr(models[0], "cfg", None)
    return ModelSummary(
        model=name,
        preset=preset,
        mesh=f"{shape.data}x{shape.lat}x{shape.lon}",
        grid=grid,
        channels={"state": n_state, "static": n_static, "time": n_time},
        batch=batch,
        total_params=total,
        rank_params=per_rank,
        rank_param_bytes_max=max(per_rank) * elsize,
        rank_train_bytes_max=max(per_rank) * train,
        serial_train_bytes=total * train,
        train_bytes_ratio=max(per_rank) / total,
        comm_forward_bytes=fwd,
        comm_backward_bytes=bwd,
        comm_by_layer=by_layer,
        data_parallel_allreduce_bytes=dp,
        checkpoint_bytes=checkpoint_bytes(total, n_tensors, shape.domain_size, elsize),
        seconds=round(time.perf_counter() - start, 3),
        config=asdict(cfg) if cfg is not None else {},
    )
