"""Which mesh to train on: per-rank memory, communication and a roofline step time of every
``data × lat × lon`` factorisation of a world size, from the layers' own cost declarations.

For each mesh, rank 0's model is constructed on the ``meta`` device (rank 0 holds the largest
share of every split: uneven splits give the first ranks the extra row, column, channel or
hidden unit), and each priced layer's ``cost`` gives its bytes, FLOPs and saved activations:

* memory = parameters + AdamW's two moments (fp32) + what the backward holds at its highest
  point: the saved activations of the layers it has not reached yet, the gradients of those it
  has passed, the inputs and the loss's fields, plus the largest transient peak of any layer;
* communication per step = the layers' bytes (forward + backward, per rank: the domain group's
  total / its size) by op, plus the data-axis all-reduce of the gradients (a ring, fp32) and the
  domain all-reduce of the gradients of replicated parameters;
* step time, per layer: ``max(compute, overlapped comm) + exposed comm`` (compute at
  ``tflops × efficiency``, or at the rate a measured ``rate_curve`` gives for the rank's forward
  work per sample: smaller matmuls run slower; times ``crowded_rate`` when several ranks share a
  node and its memory), where the weight
  ring, the token-form matmul and ring attention overlap their messages with compute and
  halos, window gathers and affine gathers do not; the gradient all-reduce runs after the
  backward (``training.optim.sync_gradients``), so it is exposed.

A module that holds parameters but declares no ``cost`` (a plain ``nn.Linear`` in a model of your
own, outside any priced layer) cannot be priced: that mesh's plan is refused with the module's
path. Parameter-free torch ops in a ``forward`` are priced at zero.

**Ensembles** (``members > 1``): ``members / ensemble`` members are batched on each rank (memory
and compute of ``batch × batched`` rows), the CRPS loss gathers the other groups' members of the
tile (``ensemble.gather``: ``(E − 1) · batched · batch · C · h · w`` fp32 per rank and step; the
gathered members and the spread terms are priced as activations), and the gradients are summed
over data × ensemble. ``plan_meshes`` tries every ensemble size dividing both ``members`` and the
world size, so it chooses between batching members and spreading them over groups.

Meshes are ranked by samples per second (``data × batch`` samples per step) among those that
fit; a mesh that the grid or the model's token layout cannot be split into is reported with
the layer's own error.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from jigsaw_earth.models import build_model
from jigsaw_earth.models.meta import meta_construction

from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.layers.base import Domain, spec_of
from jigsaw_earth.layers.cost import all_reduce_bytes, model_cost, unpriced_layers

__all__ = [
    "TRAIN_STATES",
    "Hardware",
    "MeshPlan",
    "backward_peak",
    "domain_crossing",
    "factorisations",
    "plan_mesh",
    "plan_meshes",
    "recommend",
    "sample_read_bytes",
]

TRAIN_STATES = 4  # tensors per parameter while training: parameter, gradient, AdamW exp_avg, exp_avg_sq
LOSS_FIELDS = 4  # fields of the output's size while the loss runs: target, prediction, error, its square


@dataclass(frozen=True)
class Hardware:
    """One GPU and its links. ``memory`` bytes; ``tflops`` peak dense TFLOP/s at the training
    precision; ``efficiency`` the fraction of it that matmuls reach; link bandwidths in Gbit/s
    per GPU and direction, ``link_efficiency`` the fraction of it that messages reach."""

    memory: int = 80 * 10**9
    tflops: float = 989.0
    efficiency: float = 0.5
    intra_gbps: float = 3600.0  # NVLink 4: 450 GB/s
    inter_gbps: float = 400.0  # one 400 Gbit/s NIC per GPU
    gpus_per_node: int = 8
    link_efficiency: float = 0.8
    # measured matmul rates by work: ((forward TFLOP per GPU per sample, achieved TFLOP/s), ...);
    # when given, the rate at a mesh's work per GPU replaces tflops × efficiency (rate_at)
    rate_curve: tuple[tuple[float, float], ...] = ()
    # the fraction of its matmul rate a rank keeps while every rank of its node computes at once:
    # CPU ranks share the host's memory bandwidth and page-fault path (``bench scaling`` measures
    # it with N copies of the 1/N-tile run at once); 1.0 for GPUs, each with its own memory
    crowded_rate: float = 1.0
    # GB/s that one rank's tile reader delivers (``jigsaw-earth bench io``); 0: reading not priced
    read_gbps: float = 0.0
    # whether transfers run beside compute (a GPU's copy engines, NCCL, gloo's thread); False where
    # the computing thread copies the bytes itself (the CPU shared-memory transport): then a
    # layer's transfers add to its compute instead of hiding under it
    overlap: bool = True

    def seconds(self, flops: float) -> float:
        return flops / (self.tflops * 1e12 * self.efficiency)

    def rate_at(self, work_tflop: float) -> float:
        """Achieved TFLOP/s at ``work_tflop`` forward TFLOP per GPU per sample: ``rate_curve``
        interpolated linearly in log(work) between its points, held at its ends; without a
        curve, tflops × efficiency."""
        if not self.rate_curve:
            return self.tflops * self.efficiency
        pts = sorted(self.rate_curve)
        if work_tflop <= pts[0][0]:
            return pts[0][1]
        for (w0, r0), (w1, r1) in itertools.pairwise(pts):
            if work_tflop <= w1:
                f = math.log(work_tflop / w0) / math.log(w1 / w0)
                return r0 + f * (r1 - r0)
        return pts[-1][1]

    def rank_rate(self, work_tflop: float, world: int) -> float:
        """The matmul rate of one rank of ``world``: ``rate_at`` its work, times ``crowded_rate``
        where other ranks share its node."""
        shared = min(world, self.gpus_per_node) > 1
        return self.rate_at(work_tflop) * (self.crowded_rate if shared else 1.0)

    @property
    def measured(self) -> bool:
        """Whether rates were measured (``rate_curve``, ``crowded_rate``) rather than assumed."""
        return bool(self.rate_curve) or self.crowded_rate != 1.0

    def transfer(self, nbytes: float, inter: bool) -> float:
        gbps = self.inter_gbps if inter else self.intra_gbps
        return nbytes * 8 / (gbps * 1e9 * self.link_efficiency)

    def spread_transfer(self, nbytes: float, crossing: float) -> float:
        """Seconds for ``nbytes`` sent to peers of which the fraction ``crossing`` is on other nodes:
        that share over the network, the rest over the node's links, both at once."""
        return max(self.transfer(nbytes * crossing, True), self.transfer(nbytes * (1 - crossing), False))


@dataclass
class MeshPlan:
    mesh: str
    data: int
    lat: int
    lon: int
    error: str = ""  # why this mesh is impossible (the layer's message); empty when it is
    memory: dict[str, int] = field(default_factory=dict)  # bytes of rank 0
    fits: bool = False
    headroom: int = 0  # bytes left on the GPU (negative: by how much it does not fit)
    comm: dict[str, int] = field(default_factory=dict)  # bytes per rank per step, by op
    kinds: dict[str, dict[str, float]] = field(default_factory=dict)  # seconds by layer kind
    compute_s: float = 0.0
    comm_s: float = 0.0
    exposed_s: float = 0.0  # communication not hidden behind compute
    step_s: float = 0.0
    samples_per_s: float = 0.0
    domain_link: str = ""
    data_link: str = ""
    batch: int = 1  # samples per data replica
    rate_tflops: float = 0.0  # rate_curve's rate times crowded_rate where they apply (0: tflops × efficiency)
    work_tflop: float = 0.0  # rank 0's forward TFLOP per sample (member), where rate_curve is read
    read_bytes: int = 0  # bytes rank 0 reads per step (its tile of inputs and one target per sample)
    io_s: float = 0.0  # seconds to read them at Hardware.read_gbps (0: not priced)
    io_bound: bool = False  # reading takes longer than the step: prefetch cannot hide it
    ensemble: int = 1  # groups the members are spread over (the mesh's ensemble axis)
    members: int = 1  # ensemble members per sample in all (members / ensemble batched per rank)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def factorisations(world: int) -> list[tuple[int, int, int]]:
    """Every ``(data, lat, lon)`` with ``data·lat·lon = world``, data-major."""
    out = []
    for d in range(1, world + 1):
        if world % d:
            continue
        rest = world // d
        out += [(d, a, rest // a) for a in range(1, rest + 1) if rest % a == 0]
    return out


def _links(shape: MeshShape, hw: Hardware) -> tuple[bool, bool]:
    """Whether the domain group and the data axis cross nodes (ranks are data-major, so a
    domain group is consecutive ranks)."""
    return shape.domain_size > hw.gpus_per_node, shape.world_size > hw.gpus_per_node


def domain_crossing(shape: MeshShape, hw: Hardware) -> float:
    """The fraction of rank 0's domain peers on other nodes: a domain group of P consecutive ranks
    on nodes of G holds G − 1 of them on rank 0's node. The domain's exchanges send each peer about
    as much (all-gathers, the token-form matmul) or pass a ring through every rank (the weight
    rings), so this is also the share of the domain's bytes that crosses the network (measured on
    the demo, 2 nodes × 2: 0.57 of the bytes for 0.67 of the peers; docs/multinode.md)."""
    P, G = shape.domain_size, hw.gpus_per_node
    return (P - min(G, P)) / (P - 1) if P > 1 else 0.0


def _label(crossing: float) -> str:
    if crossing in (0.0, 1.0):
        return "inter-node" if crossing else "intra-node"
    return f"{crossing:.0%} of peers inter-node"


def plan_mesh(
    name: str,
    preset: str,
    grid: tuple[int, int],
    shape: MeshShape,
    channels: tuple[int, int, int],
    hw: Hardware,
    batch: int = 1,
    elsize: int = 4,
    members: int = 1,
    **overrides: Any,
) -> MeshPlan:
    """Memory, communication and step time of rank 0 of ``shape`` (see the module docstring)."""
    plan = MeshPlan(str(shape), shape.data, shape.lat, shape.lon, batch=batch)
    plan.ensemble, plan.members = shape.ensemble, members
    if members % shape.ensemble:
        plan.error = f"{members} members do not split over {shape.ensemble} ensemble groups"
        return plan
    rows = batch * members // shape.ensemble  # the model's batch on one rank: samples x batched members
    try:
        with meta_construction():
            domain = Domain.create(DomainMesh(MeshShape(1, shape.lat, shape.lon)), *grid)
            model = build_model(name, domain, *channels, preset, **overrides)
    except ValueError as e:
        plan.error = str(e)
        return plan
    unpriced = unpriced_layers(model)
    if unpriced:
        path, module = unpriced[0]
        names = [f"{path}.{n}" if path else n for n, _ in module.named_parameters(recurse=False)]
        plan.error = (
            f"parameter {', '.join(names)} belongs to {type(module).__name__}, which declares no "
            "cost(batch, elsize, input_grad); plan cannot price it: build it from jigsaw layers or give "
            f"{type(module).__name__} a cost method (docs/models.md)"
        )
        return plan
    costs = model_cost(model, rows, elsize, input_grad=False)
    params = sum(p.numel() for p in model.parameters()) * 4
    h, w = domain.tile.shape
    io = rows * h * w * (channels[0] * LOSS_FIELDS * 4 + sum(channels[:2]) * elsize)
    grads, acts = backward_peak(model, costs)
    plan.memory = {
        "parameters": params,
        "optimizer": (TRAIN_STATES - 2) * params,
        "gradients": grads,
        "activations": acts + io + ensemble_loss_bytes(members, rows // batch, batch * channels[0] * h * w),
        "transient": max((c.peak for c in costs.values()), default=0),
    }
    plan.memory["total"] = sum(plan.memory.values())
    plan.headroom = hw.memory - plan.memory["total"]
    plan.fits = plan.headroom >= 0
    plan.work_tflop = sum(c.flops[0] for c in costs.values()) / rows / 1e12
    if hw.measured:  # the measured rate at this rank's forward work per sample, its node busy
        plan.rate_tflops = hw.rank_rate(plan.work_tflop, shape.world_size)
        hw = replace(hw, tflops=plan.rate_tflops, efficiency=1.0)
    _time(plan, model, costs, shape, hw, params, batch)
    _price_ensemble(plan, shape, hw, rows // batch, batch * channels[0] * h * w)
    _price_reads(plan, hw, h * w * channels[0], batch)
    return plan


def ensemble_loss_bytes(members: int, batched: int, field_values: int) -> int:
    """Bytes the CRPS loss holds on one rank (``training/crps.py``): every member's field gathered
    (``members`` × the tile's fields), and the spread and slope of this rank's ``batched``."""
    if members < 2:
        return 0
    return 4 * field_values * (members + 2 * batched)


def ensemble_gather_bytes(ensemble: int, batched: int, field_values: int) -> int:
    """Bytes one rank sends per loss evaluation: its ``batched`` members' tile, fp32, to each of the
    ``ensemble − 1`` other groups (``training.crps.gather_members``)."""
    return 4 * field_values * batched * (ensemble - 1)


def _price_ensemble(plan: MeshPlan, shape: MeshShape, hw: Hardware, batched: int, field_values: int) -> None:
    """The members' gather over the ensemble axis before the loss: exposed (the loss waits for it)."""
    if shape.ensemble < 2:
        return
    sent = ensemble_gather_bytes(shape.ensemble, batched, field_values)
    plan.comm["ensemble.gather"] = sent
    t = hw.transfer(sent, shape.domain_size * shape.ensemble > hw.gpus_per_node)
    plan.kinds.setdefault("ensemble loss", {"compute_s": 0.0, "comm_s": 0.0, "step_s": 0.0})
    plan.kinds["ensemble loss"]["comm_s"] += t
    plan.kinds["ensemble loss"]["step_s"] += t
    plan.comm_s += t
    plan.step_s += t
    plan.exposed_s += t
    plan.samples_per_s = shape.data * plan.batch / plan.step_s if plan.step_s > 0 else math.inf


def _whole(p: Any) -> bool:
    """Whether rank 0 holds the whole parameter (replicated over the domain; ``distributed/grads.py``)."""
    spec = spec_of(p)
    return tuple(p.shape) == tuple(spec.global_shape) and not any(spec.offsets)


def sample_read_bytes(tile_cells: int, channels: int, lead_steps: int = 1) -> int:
    """Bytes one rank reads for one training sample: its tile of the inputs and of ``lead_steps``
    targets, float32 (the layers exchange halos, so the reader reads none)."""
    return 4 * tile_cells * channels * (1 + lead_steps)


def _price_reads(plan: MeshPlan, hw: Hardware, tile_values: int, batch: int) -> None:
    """Reading the next batch overlaps the step (prefetch), so the step takes the longer of the
    two; a mesh whose reading is longer is I/O-bound (adding ranks shrinks each one's tile)."""
    plan.read_bytes = batch * sample_read_bytes(tile_values, 1)
    if hw.read_gbps <= 0:
        return
    plan.io_s = plan.read_bytes / (hw.read_gbps * 1e9)
    plan.io_bound = plan.io_s > plan.step_s
    if plan.io_bound:
        plan.step_s = plan.io_s
        plan.samples_per_s = plan.data * batch / plan.step_s


def backward_peak(model, costs) -> tuple[int, int]:
    """(gradients, activations) live when the backward holds the most: it runs the layers in
    reverse, freeing each one's saved activations as its parameters' gradients appear. At the
    optimizer step every gradient is live and no activation."""
    modules = dict(model.named_modules())
    stage = getattr(model, "forward_stage", lambda path: 0)  # Forecaster's; registration order otherwise
    paths = sorted(costs, key=stage)  # stable: registration order within a stage
    saved = [costs[path].saved for path in paths]
    grads = [4 * sum(p.numel() for p in modules[path].parameters(recurse=False)) for path in paths]
    best = (sum(grads), 0)
    for i in range(len(saved)):
        g, a = sum(grads[i:]), sum(saved[: i + 1])
        if g + a > sum(best):
            best = (g, a)
    return best


def _time(plan: MeshPlan, model, costs, shape: MeshShape, hw: Hardware, params: int, batch: int) -> None:
    P = shape.domain_size
    inter_domain, inter_data = _links(shape, hw)
    crossing = domain_crossing(shape, hw)
    plan.domain_link = _label(crossing)
    plan.data_link = "inter-node" if inter_data else "intra-node"
    comm: dict[str, int] = defaultdict(int)
    kinds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    modules = dict(model.named_modules())
    for path, c in costs.items():
        compute = hw.seconds(sum(c.flops))
        hidden = exposed = 0.0
        for op, (f, b) in c.bytes.items():
            per_rank = (f + b) / P
            comm[op] += round(per_rank)
            t = hw.spread_transfer(per_rank, crossing)
            hidden, exposed = (hidden + t, exposed) if op in c.overlap else (hidden, exposed + t)
        step = (max(compute, hidden) if hw.overlap else compute + hidden) + exposed
        k = kinds[type(modules[path]).__name__]
        k["compute_s"] += compute
        k["comm_s"] += hidden + exposed
        k["step_s"] += step
        plan.compute_s += compute
        plan.comm_s += hidden + exposed
        plan.step_s += step
    replicated = 4 * sum(p.numel() for p in model.parameters() if _whole(p)) if P > 1 else 0
    if replicated:  # replicated parameters' gradients, summed over the domain after the backward
        sent = all_reduce_bytes(P, replicated) // P
        comm["domain.grad_replicated"] = sent
        t = hw.transfer(sent, inter_domain)
        kinds["replicated parameters"]["comm_s"] += t
        kinds["replicated parameters"]["step_s"] += t
        plan.comm_s += t
        plan.step_s += t
    if shape.replicas > 1:  # the gradients' ring all-reduce over data x ensemble, after the backward
        sent = all_reduce_bytes(shape.replicas, params) // shape.replicas
        comm["data.grad_allreduce"] = sent
        t = hw.transfer(sent, inter_data)
        kinds["data parallel"]["comm_s"] += t
        kinds["data parallel"]["step_s"] += t
        plan.comm_s += t
        plan.step_s += t
    plan.exposed_s = plan.step_s - plan.compute_s
    plan.comm = dict(comm)
    plan.kinds = {k: dict(v) for k, v in kinds.items()}
    plan.samples_per_s = shape.data * batch / plan.step_s if plan.step_s > 0 else math.inf


def plan_meshes(
    name: str,
    preset: str,
    grid: tuple[int, int],
    world: int,
    channels: tuple[int, int, int],
    hw: Hardware,
    batch: int = 1,
    elsize: int = 4,
    global_batch: int | None = None,
    members: int = 1,
    **overrides: Any,
) -> list[MeshPlan]:
    """Every factorisation of ``world``: the feasible ones ranked (fitting first, by samples
    per second; then the rest by how much they miss), the impossible ones last.

    ``batch`` samples per data replica; or ``global_batch`` samples per step split over the
    replicas (then every mesh does the same work per step and samples per second ranks by step
    time; a data size that does not divide it is impossible). ``members`` > 1: also every
    ensemble axis dividing both ``members`` and ``world`` (``data × ensemble × lat × lon``)."""
    plans = []
    layouts = [
        (MeshShape(d, lat, lon, e), d, lat, lon)
        for e in range(1, world + 1)
        if world % e == 0 and members % e == 0
        for d, lat, lon in factorisations(world // e)
    ]
    for shape, d, lat, lon in layouts:
        if global_batch is not None and global_batch % d:
            plans.append(MeshPlan(str(shape), d, lat, lon, error=f"{d} data replicas do not divide "
                                  f"the global batch of {global_batch}", ensemble=shape.ensemble,
                                  members=members))  # fmt: skip
            continue
        b = batch if global_batch is None else global_batch // d
        plans.append(plan_mesh(name, preset, grid, shape, channels, hw, b, elsize, members, **overrides))
    return sorted(plans, key=_rank_key)


def _rank_key(p: MeshPlan) -> tuple[bool, bool, float]:
    return bool(p.error), not p.fits, -p.samples_per_s if p.fits else -p.headroom


def recommend(plans: list[MeshPlan]) -> tuple[MeshPlan | None, list[str]]:
    """The best mesh and the reasons, in sentences; ``None`` when no mesh fits."""
    fitting = [p for p in plans if p.fits]
    if not fitting:
        near = min((p for p in plans if not p.error), key=lambda p: -p.headroom, default=None)
        why = ["no mesh fits"]
        if near is not None:
            why.append(f"the closest, {near.mesh}, needs {_gb(-near.headroom)} GB more per GPU")
        return None, why
    best = fitting[0]
    io = (
        [
            f"reading a batch takes {best.io_s * 1e3:.1f} ms: I/O-bound, the step waits for data"
            if best.io_bound
            else f"reading a batch ({best.io_s * 1e3:.1f} ms) hides behind the step"
        ]
        if best.io_s
        else []
    )
    why = [
        f"fits with {_gb(best.headroom)} GB headroom ({_gb(best.memory['total'])} GB per GPU)",
        f"step {best.step_s * 1e3:.1f} ms for {best.data * best.batch} sample(s): "
        f"{best.samples_per_s:.2f} samples/s",
        f"{_gb(sum(best.comm.values()))} GB sent per GPU per step, "
        f"{best.exposed_s * 1e3:.1f} ms of it not hidden behind compute",
        *io,
    ]
    pure_domain = [p for p in fitting if p.data == 1 and p.ensemble == 1]
    others = {"the runner-up": fitting[1:2], "pure domain parallelism": pure_domain}
    others["pure data parallelism"] = [p for p in fitting if p.lat * p.lon * p.ensemble == 1]
    for label, group in others.items():
        if group and group[0] is not best:
            other = group[0]
            ratio = best.samples_per_s / other.samples_per_s
            why.append(f"{ratio:.2f}× the throughput of {other.mesh} ({label})")
    misses = [p for p in plans if not p.error and not p.fits]
    if misses:
        worst = min(misses, key=lambda p: p.headroom)
        why.append(
            f"{len(misses)} mesh(es) do not fit; {worst.mesh} misses by {_gb(-worst.headroom)} GB per GPU"
        )
    return best, why


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f}"
