"""What forecasting costs: per-rank memory of a forward, its time, and an evaluation's size.

From the same layer cost declarations as ``plan`` (``layers/cost.py``), forward only:

* memory = parameters + the largest layer's activations (its saved input twice: input and output
  live together, no backward keeps anything) + its transient peak + the state fields a rollout
  holds (``STATE_FIELDS``: the state, the next state, its physical copy, one queued for writing);
* forward time, per layer: ``max(compute, overlapped messages) + exposed messages`` of the
  forward FLOPs and bytes, as ``plan``'s step time prices the training step;
* an evaluation of ``inits × leads`` model steps (one forward per init per step, ``batch`` inits
  per forward on every data replica) takes ``ceil(inits / (data × batch)) × steps × forward``,
  and writes ``inits × written leads × written channels × n_lat × n_lon × 4`` bytes, every rank its
  tile at ``write_gbps``; writing overlaps the forward, so the evaluation takes the longer of the two;
* an ensemble of ``members`` (``predict --members``) is spread over the mesh's ensemble axis and
  batched on each rank as ``predict`` runs it: every forward holds ``batch × members / ensemble``
  rows, and the store holds ``members`` times the fields.

``predict`` sizes its batch with ``inference_memory`` on the real model; ``plan --evaluate``
prices a whole evaluation before it is queued.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from jigsaw_earth.data.variables import headline_channels
from jigsaw_earth.models import build_model
from jigsaw_earth.models.meta import meta_construction
from jigsaw_earth.models.plan import Hardware, domain_crossing
from torch import nn

from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.layers.base import Domain
from jigsaw_earth.layers.cost import Cost, model_cost

__all__ = ["HEADLINE", "STATE_FIELDS", "EvalPlan", "forward_seconds", "inference_memory", "plan_evaluation",
           "writes"]  # fmt: skip

STATE_FIELDS = 4  # (B, C, h, w) float32 fields a rollout holds besides the model's activations
# WB2's headline fields (its scorecards): predict --variables/--levels writes only these
HEADLINE = headline_channels()


def writes(channels: int, steps: int, every: int = 4) -> dict[str, tuple[int, int]]:
    """``{label: (channels, leads)}`` of the usual choices: every channel at every lead, the WB2
    headline fields at every lead and at every ``every``-th, and ``--score`` alone (nothing)."""
    return {
        f"full ({channels} channels × {steps} leads)": (channels, steps),
        f"headline ({len(HEADLINE)} × {steps})": (len(HEADLINE), steps),
        f"headline, every {every}th lead ({len(HEADLINE)} × {steps // every})": (
            len(HEADLINE),
            steps // every,
        ),
        "--score only": (0, 0),
    }


def inference_memory(model: nn.Module, batch: int, elsize: int, tile_cells: int,
                     channels: tuple[int, int, int]) -> dict[str, int]:  # fmt: skip
    """Bytes one rank holds while forecasting ``batch`` inits with ``model`` (its own shard)."""
    costs = model_cost(model, batch, elsize, input_grad=False)
    params = 4 * sum(p.numel() for p in model.parameters())
    layer = max((2 * c.saved + c.peak for c in costs.values()), default=0)
    state = batch * tile_cells * (channels[0] * STATE_FIELDS * 4 + sum(channels[1:]) * elsize)
    out = {"parameters": params, "activations": layer, "state": state}
    out["total"] = sum(out.values())
    return out


def forward_seconds(costs: dict[str, Cost], shape: MeshShape, hw: Hardware) -> float:
    """One forward of rank 0 (``costs`` at the batch wanted): compute and the forward's messages."""
    crossing = domain_crossing(shape, hw)
    total = 0.0
    for c in costs.values():
        hidden = exposed = 0.0
        for op, (f, _b) in c.bytes.items():
            t = hw.spread_transfer(f / shape.domain_size, crossing)
            hidden, exposed = (hidden + t, exposed) if op in c.overlap else (hidden, exposed + t)
        total += max(hw.seconds(c.flops[0]), hidden) + exposed
    return total


@dataclass
class EvalPlan:
    """An evaluation of ``inits`` × ``leads`` (every ``lead_every``-th model step written) on a mesh."""

    mesh: str
    batch: int
    inits: int
    steps: int
    error: str = ""
    memory: dict[str, int] = field(default_factory=dict)
    fits: bool = False
    forward_s: float = 0.0  # one forward of ``batch`` inits on every domain group
    time_s: float = 0.0
    steps_per_s: float = 0.0  # model steps × inits per second, all replicas
    written: dict[str, int] = field(default_factory=dict)  # bytes by what is written
    total_s: dict[str, float] = field(default_factory=dict)  # by what is written: max(forward, writing)
    members: int = 1  # ensemble members per init (1: deterministic)
    rows: int = 0  # the model's batch on one rank: inits per forward × members batched per rank

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_evaluation(
    name: str,
    preset: str,
    grid: tuple[int, int],
    shape: MeshShape,
    channels: tuple[int, int, int],
    hw: Hardware,
    *,
    inits: int,
    steps: int,
    writes: dict[str, tuple[int, int]],
    batch: int | None = None,
    elsize: int = 4,
    write_gbps: float = 1.0,
    members: int = 1,
    **overrides: Any,
) -> EvalPlan:
    """Time and bytes of forecasting ``inits`` × ``steps`` model steps on ``shape``. ``writes``:
    ``{label: (channels written, leads written)}``; ``batch``: inits per forward per data replica
    (default: the most that fit, at most the inits per replica); ``write_gbps``: GB/s one rank writes;
    ``members``: an ensemble's size (split over ``shape.ensemble``, the rest batched per rank)."""
    plan = EvalPlan(str(shape), batch or 1, inits, steps, members=members)
    if members < 1 or members % shape.ensemble:
        plan.error = f"{members} members do not split over {shape.ensemble} ensemble groups"
        return plan
    batched = members // shape.ensemble
    per_replica = math.ceil(inits / shape.data)
    try:
        with meta_construction():
            domain = Domain.create(DomainMesh(MeshShape(1, shape.lat, shape.lon)), *grid)
            model = build_model(name, domain, *channels, preset, **overrides)
    except ValueError as e:
        plan.error = str(e)
        return plan
    h, w = domain.tile.shape
    one = inference_memory(model, batched, elsize, h * w, channels)  # one init: its members batched
    fixed, per = one["parameters"], one["total"] - one["parameters"]
    plan.batch = batch or max(1, min(per_replica, (hw.memory - fixed) // max(per, 1)))
    plan.rows = plan.batch * batched
    plan.memory = inference_memory(model, plan.rows, elsize, h * w, channels)
    plan.fits = plan.memory["total"] <= hw.memory
    costs = model_cost(model, plan.rows, elsize, input_grad=False)
    if hw.measured:  # the measured rate at this rank's forward work per sample, as plan_mesh
        work = sum(c.flops[0] for c in costs.values()) / plan.rows / 1e12
        hw = replace(hw, tflops=hw.rank_rate(work, shape.world_size), efficiency=1.0)
    plan.forward_s = forward_seconds(costs, shape, hw)
    plan.time_s = math.ceil(per_replica / plan.batch) * steps * plan.forward_s
    plan.steps_per_s = inits * members * steps / plan.time_s if plan.time_s > 0 else math.inf
    cells = grid[0] * grid[1]
    plan.written = {label: inits * members * c * leads * cells * 4 for label, (c, leads) in writes.items()}
    rate = write_gbps * 1e9 * shape.world_size
    plan.total_s = {label: max(plan.time_s, n / rate) for label, n in plan.written.items()}
    return plan
