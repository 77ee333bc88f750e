"""Training strategies compared by ``jigsaw-earth bench strategies``: one model, one data set.

A strategy is how the model is wrapped and which slice of each sample a rank holds:

* ``jigsaw``: the jigsaw model on a ``lat × lon`` domain mesh; each rank holds its tile of every
  sample of the group's batch (domain and tensor parallelism in the layers);
* ``ddp``: the plain twin in ``torch.nn.parallel.DistributedDataParallel``; whole samples, one
  share of the batch per rank;
* ``fsdp2``: the twin sharded with ``torch.distributed.fsdp.fully_shard`` (each block, then the
  root) on a 1-D ``DeviceMesh``; whole samples, one share of the batch per rank;
* ``tp``: Megatron-style tensor parallelism with DTensor: ``parallelize_module`` with
  ``ColwiseParallel`` on each MLP's / token mixing's first linear and ``RowwiseParallel`` on its
  second; the input is replicated (every rank holds the whole batch);
* ``jigsaw_ddp``: jigsaw on a ``1 × N/2`` domain, two data-parallel replicas (gradients summed
  over the data axis with the trainer's ``sync_gradients``).

Every strategy minimises the same loss: the latitude-weighted squared error summed over the
global batch, divided by its element count (``training.loss.weighted_sq_error``). Strategies that
average gradients over ranks (DDP, FSDP2) scale their local loss by the rank count, so all
produce the same gradient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel

from ..data.times import N_TIME_FEATURES
from ..distributed.comm import ledger
from ..distributed.mesh import DomainMesh, MeshShape
from ..layers.base import Domain, init_model, local_domain
from ..models import build_model
from ..models.unet import ConvBlock
from ..models.vit import TransformerBlock
from ..models.weathermixer import MixerBlock
from ..sphere import grid_latitudes, latitude_weights
from ..training.loss import weighted_sq_error
from ..training.optim import clip_grad_norm, replication_weights, sync_gradients
from ..twins import MLP, TokenMixing, build_twin, plain
from .comm_count import CommCount, CountFunctional, count_c10d, ddp_counting_hook, ring_bytes

__all__ = ["STRATEGIES", "Problem", "Runner", "build_runner", "domain_shape"]

STRATEGIES = ("jigsaw", "ddp", "fsdp2", "tp", "jigsaw_ddp")
N_TIME = N_TIME_FEATURES  # the trainer's time inputs


@dataclass(frozen=True)
class Problem:
    """The model (``build_model`` arguments) and synthetic data every strategy trains on."""

    model: str
    preset: str
    overrides: dict
    grid: tuple[int, int]
    n_state: int
    n_static: int
    seed: int = 0

    def jigsaw(self, domain: Domain) -> nn.Module:
        net = build_model(
            self.model, domain, self.n_state, self.n_static, N_TIME, self.preset, **self.overrides
        )
        return init_model(net, self.seed)

    def twin(self) -> nn.Module:
        """The plain twin holding the same weights as the jigsaw model (seeded, mesh-invariant)."""
        return plain(self.jigsaw(local_domain(*self.grid)))

    def sample(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Global sample ``i``: state ``(C, H, W)``, target ``(C, H, W)``, time features ``(4,)``."""
        gen = torch.Generator().manual_seed(self.seed * 100_003 + i)
        state = torch.randn(self.n_state, *self.grid, generator=gen)
        target = state + 0.1 * torch.randn(self.n_state, *self.grid, generator=gen)
        return state, target, torch.randn(N_TIME, generator=gen)

    def static(self) -> torch.Tensor:
        return torch.randn(self.n_static, *self.grid, generator=torch.Generator().manual_seed(self.seed + 7))

    def lat_weights(self) -> torch.Tensor:
        lat = grid_latitudes(self.grid[0], centred=True)
        return torch.from_numpy(latitude_weights(lat).astype(np.float32))

    def count(self, batch: int) -> int:
        return batch * self.n_state * self.grid[0] * self.grid[1]


def domain_shape(world: int) -> tuple[int, int]:
    """The most square ``lat × lon`` factorisation of ``world`` with ``lat <= lon`` (4 → 2 × 2)."""
    lat = max(d for d in range(1, math.isqrt(world) + 1) if world % d == 0)
    return lat, world // lat


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _bytes(tensors) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors if t is not None)


@dataclass
class Runner:
    """One strategy on this rank: a wrapped model, its optimizer and how it slices samples."""

    name: str
    model: nn.Module
    replicas: int  # data-parallel replicas sharing the global batch
    replica: int  # this rank's replica
    grad_scale: float  # ranks over which the gradient is averaged (DDP, FSDP2) else 1
    duplicates: int  # ranks holding the same piece of the loss (replicated input) else 1
    tile: tuple[slice, slice] = (slice(None), slice(None))
    mesh: DomainMesh | None = None  # jigsaw strategies
    count: CommCount = field(default_factory=CommCount)
    optimizer: torch.optim.Optimizer | None = None

    def __post_init__(self) -> None:
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3, foreach=False)

    @property
    def keeps_grads(self) -> bool:
        """DDP's gradients are views of its buckets, which live across steps; every other
        strategy frees them between steps, as the trainer does (``zero_grad(set_to_none=True)``)."""
        return self.name == "ddp"

    def my_samples(self, global_batch: int) -> list[int]:
        per = global_batch // self.replicas
        return list(range(self.replica * per, (self.replica + 1) * per))

    def inputs(self, problem: Problem, samples: Sequence[int]) -> tuple[torch.Tensor, ...]:
        lat, lon = self.tile
        parts = [problem.sample(i) for i in samples]
        state = torch.stack([s for s, _, _ in parts])[..., lat, lon].contiguous()
        target = torch.stack([t for _, t, _ in parts])[..., lat, lon].contiguous()
        time = torch.stack([f for _, _, f in parts])
        static = problem.static()[:, lat, lon].contiguous()
        return state, static, time, target, problem.lat_weights()[lat].contiguous()

    def step(self, batch: tuple[torch.Tensor, ...], count: int) -> torch.Tensor:
        """Forward, backward, gradient sync and AdamW step; the local loss (detached)."""
        state, static, time, target, lat_w = batch
        self.optimizer.zero_grad(set_to_none=not self.keeps_grads)
        ctx = CountFunctional(self.count) if self.name == "tp" else _null()
        with ctx:
            out = self.model(state, static, time)
            ones = torch.ones(out.shape[1])
            local = weighted_sq_error(out, target, lat_w, ones) * (self.grad_scale / count)
            local.backward()
        if self.name == "jigsaw_ddp":  # the ledger counts the data axis's sum (distributed/grads.py)
            sync_gradients(list(self.model.parameters()), self.mesh)
        self.optimizer.step()
        return local.detach()

    def bytes_sent(self) -> int:
        """This rank's bytes sent since ``reset_comm`` (jigsaw: its comm ledger, plus the data axis)."""
        jig = ledger.bytes_sent if self.name.startswith("jigsaw") else 0
        return jig + self.count.bytes_sent

    def reset_comm(self) -> None:
        ledger.reset()
        self.count.reset()

    def global_loss(self, local: torch.Tensor) -> float:
        total = local.clone()
        dist.all_reduce(total)
        return float(total) / (self.grad_scale * self.duplicates)

    def grad_norm(self) -> float:
        """The global gradient norm (every shard once)."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.mesh is not None:
            return float(clip_grad_norm(params, replication_weights(params, self.mesh), 0.0, self.mesh))
        sharded = torch.zeros((), dtype=torch.float64)
        whole = torch.zeros((), dtype=torch.float64)
        for p in params:
            g = p.grad
            if isinstance(g, DTensor) and not all(isinstance(pl, Replicate) for pl in g.placements):
                sharded += g.to_local().double().square().sum()
            else:
                whole += _local(g).double().square().sum()
        if self.name == "fsdp2" or self.name == "tp":
            dist.all_reduce(sharded)
        return float((sharded + whole).sqrt())

    def state_bytes(self) -> dict[str, int]:
        """This rank's parameter, gradient and optimizer-state bytes (local shards)."""
        params = list(self.model.parameters())
        opt = [t for s in self.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
        return {
            "parameters": _bytes(params),
            "gradients": _bytes(p.grad for p in params),
            "optimizer": _bytes(opt),
        }


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def tp_plan(twin: nn.Module) -> dict[str, object]:
    """Colwise first / rowwise second linear of every MLP and token mixing (Megatron's pairs)."""
    plan: dict[str, object] = {}
    for path, module in twin.named_modules():
        if isinstance(module, (MLP, TokenMixing)):
            plan[f"{path}.fc1"] = ColwiseParallel()
            plan[f"{path}.fc2"] = RowwiseParallel()
    return plan


FSDP_UNITS = (MixerBlock, TransformerBlock, ConvBlock)


def build_runner(name: str, problem: Problem, rank: int, world: int) -> Runner:
    """Strategy ``name`` on this rank (collective: every rank builds the same strategies in order)."""
    if name in ("jigsaw", "jigsaw_ddp"):
        lat, lon = domain_shape(world) if name == "jigsaw" else (1, world // 2)
        data = world // (lat * lon)
        mesh = DomainMesh(MeshShape(data, lat, lon), rank)
        mesh._build_groups()
        domain = Domain.create(mesh, *problem.grid)
        t = domain.tile
        tile = (slice(t.lat_start, t.lat_stop), slice(t.lon_start, t.lon_stop))
        return Runner(name, problem.jigsaw(domain), data, mesh.coord[0], 1.0, 1, tile, mesh)
    twin = problem.twin()
    device_mesh = init_device_mesh("cpu", (world,))
    if name == "ddp":
        model = DistributedDataParallel(twin, gradient_as_bucket_view=True)
        runner = Runner(name, model, world, rank, float(world), 1)
        model.register_comm_hook(runner.count, ddp_counting_hook)
        return runner
    if name == "fsdp2":
        for module in twin.modules():
            if isinstance(module, FSDP_UNITS):
                fully_shard(module, mesh=device_mesh)
        fully_shard(twin, mesh=device_mesh)
        return _FSDPRunner(name, twin, world, rank, float(world), 1)
    if name == "tp":
        parallelize_module(twin, device_mesh, tp_plan(twin))
        return Runner(name, twin, 1, 0, 1.0, world)
    raise ValueError(f"strategy {name!r}: use one of {', '.join(STRATEGIES)}")


class _FSDPRunner(Runner):
    """FSDP2's all-gathers and reduce-scatters are ``torch.distributed`` calls: count them."""

    def step(self, batch: tuple[torch.Tensor, ...], count: int) -> torch.Tensor:
        with count_c10d(self.count):
            return super().step(batch, count)


def analytic_bytes(runner: Runner, problem: Problem, global_batch: int) -> int:
    """This rank's minimum bytes sent per step for the strategy (ring formulas; see comm_count)."""
    world = dist.get_world_size()
    if runner.name == "ddp":
        return ring_bytes("all_reduce", _bytes(runner.model.parameters()), world)
    if runner.name == "fsdp2":
        return fsdp_bytes(runner.model, world)
    if runner.name == "tp":
        return tp_bytes(problem, global_batch, world)
    from ..models.summary import summarize

    shape = runner.mesh.shape
    s = summarize(problem.model, shape, problem.grid, problem.n_state, problem.n_static, N_TIME,
                  problem.preset, batch=global_batch // shape.data, **problem.overrides)  # fmt: skip
    domain = (s.comm_forward_bytes + s.comm_backward_bytes) // shape.domain_size
    return domain + s.data_parallel_allreduce_bytes // shape.domain_size


def fsdp_bytes(model: nn.Module, world: int) -> int:
    """ZeRO-3 per step: every unit's parameters all-gathered for forward and again for backward
    (the root's once: FSDP2 keeps the root unsharded between them), gradients reduce-scattered."""
    total = _global_bytes(model.parameters())
    inner = sum(_global_bytes(m.parameters()) for m in model.modules() if isinstance(m, FSDP_UNITS))
    gathered = 2 * inner + (total - inner)
    return ring_bytes("all_gather", gathered, world) + ring_bytes("reduce_scatter", total, world)


def _global_bytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def tp_bytes(problem: Problem, batch: int, world: int) -> int:
    """Megatron's minimum: one all-reduce of each rowwise output (forward) and of each colwise
    input's gradient (backward), measured as shapes on a plain forward of the twin."""
    twin = build_twin(problem.model, problem.grid, problem.n_state, problem.n_static, N_TIME,
                      problem.preset, **problem.overrides)  # fmt: skip
    sizes: list[int] = []
    hooks = []
    for path, style in tp_plan(twin).items():
        module = twin.get_submodule(path)
        if isinstance(style, RowwiseParallel):
            hooks.append(module.register_forward_hook(lambda m, i, o: sizes.append(o.numel() * 4)))
        else:
            hooks.append(module.register_forward_hook(lambda m, i, o: sizes.append(i[0].numel() * 4)))
    state = torch.zeros(batch, problem.n_state, *problem.grid)
    with torch.no_grad():
        twin(state, torch.zeros(problem.n_static, *problem.grid), torch.zeros(batch, N_TIME))
    for h in hooks:
        h.remove()
    return sum(ring_bytes("all_reduce", n, world) for n in sizes)
