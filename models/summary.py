"""Model size, FLOPs, per-rank memory and per-step communication, without allocating the model.

Every domain rank's model is constructed on the ``meta`` device (``meta_construction``): shapes
and shard specs are real, storage and initialisation are not, so a 3-billion-parameter model on
a 721 × 1440 grid is described in seconds. Communication is the sum of the bytes each layer
declares beside its forward (``cost``, ``layers.cost.model_cost``: the figures the comm ledger
measures), summed over all ranks of one domain group, for one training step (forward +
backward; the input needs no gradient) at ``batch`` samples per group, fp32. FLOPs are per
sample, summed over the group's ranks, from the same declarations (matmuls as 2·m·n·k, norms;
elementwise activations and additions are not counted). The per-rank
memory of a training step is ``plan``'s (``plan_mesh``), from the same declarations. With an
ensemble (``members`` > 1 on a mesh with an ``ensemble`` axis) the step memory holds the batched
members and the CRPS loss's gathered fields, and ``ensemble_gather_bytes`` is what the domain
group's ranks send for the members' gather before the loss.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from jigsaw_earth.models import build_model
from jigsaw_earth.models.meta import meta_construction
from jigsaw_earth.models.plan import TRAIN_STATES, Hardware, ensemble_gather_bytes, plan_mesh
from torch import nn

from jigsaw_earth.distributed.comm import ring_bytes
from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.layers.base import Domain, spec_of
from jigsaw_earth.layers.cost import model_cost

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

CHECKPOINT_STATES = 3  # tensors per parameter in a checkpoint: parameter, exp_avg, exp_avg_sq
TENSOR_OVERHEAD = 1600  # bytes of DCP/torch.save framing per saved block (measured: 1575 B)


def checkpoint_bytes(total_params: int, n_tensors: int = 0, writers: int = 1, elsize: int = 4) -> int:
    """Bytes of a training checkpoint (model + AdamW state) for ``total_params`` parameters.

    ``n_tensors`` parameter tensors, each saved as one block by each of ``writers`` domain ranks.
    """
    return CHECKPOINT_STATES * (total_params * elsize + n_tensors * writers * TENSOR_OVERHEAD)


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
    forward_flops: int = 0  # per sample, all ranks of the domain group, from the layers' cost declarations
    backward_flops: int = 0  # likewise (the input needs no gradient)
    data_parallel_allreduce_bytes: int = 0
    checkpoint_bytes: int = 0  # model + AdamW state in a checkpoint, fp32 (metadata not counted)
    step_memory: dict[str, int] = field(default_factory=dict)  # rank 0 in a training step, as plan has it
    members: int = 1  # ensemble members per sample (members / ensemble batched per rank)
    ensemble_gather_bytes: int = 0  # per step, all ranks of one domain group (fp32 fields of the loss)
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
    members: int = 1,
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
    for cost in model_cost(models[0], batch, elsize, input_grad=False).values():  # no dX of the input
        for op, (f, b) in cost.bytes.items():
            fwd, bwd = fwd + f, bwd + b
            acc = by_layer.setdefault(op, [0, 0])
            acc[0], acc[1] = acc[0] + f, acc[1] + b
    flops = [0, 0]
    for m in models:  # per sample: batch 1, every rank's share
        for cost in model_cost(m, 1, elsize, input_grad=False).values():
            flops[0], flops[1] = flops[0] + cost.flops[0], flops[1] + cost.flops[1]
    train = TRAIN_STATES * elsize
    n_tensors = len(list(models[0].parameters()))
    dp = ring_bytes("all_reduce", max(per_rank) * elsize, shape.replicas) * shape.domain_size
    cfg = getattr(models[0], "cfg", None)
    chans = (n_state, n_static, n_time)
    step = plan_mesh(name, preset, grid, shape, chans, Hardware(), batch, elsize, members, **overrides)
    if step.error:
        raise ValueError(f"model summary on mesh {shape}: {step.error}")
    batched = members // shape.ensemble
    gather = ensemble_gather_bytes(shape.ensemble, batched, batch * n_state * grid[0] * grid[1])
    return ModelSummary(
        model=name,
        preset=preset,
        mesh=str(shape),
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
        forward_flops=flops[0],
        backward_flops=flops[1],
        data_parallel_allreduce_bytes=dp,
        checkpoint_bytes=checkpoint_bytes(total, n_tensors, shape.domain_size, elsize),
        step_memory=step.memory,
        members=members,
        ensemble_gather_bytes=gather,
        seconds=round(time.perf_counter() - start, 3),
        config=asdict(cfg) if cfg is not None else {},
    )
