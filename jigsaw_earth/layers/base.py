"""What every jigsaw layer shares: the domain it runs on and how its parameters are sharded.

* ``Domain`` — a mesh plus the global ``lat × lon`` grid of a layer's input. Layers take and
  return this rank's tile: fields as ``(B, C, h, w)``, token tiles as ``(B, h, w, C)``.
* Every parameter is a rectangular block of a *canonical global tensor* (``ShardSpec``): the
  tensor the 1-rank model would hold. Initialisation draws each element from a counter-based
  generator keyed by ``(seed, parameter path, global element index)``, so one seed gives the
  same model on every mesh; checkpoints save blocks with their global offsets and reload on
  another mesh.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..distributed.collectives import all_gather
from ..distributed.mesh import Axis, DomainMesh, MeshShape
from ..distributed.tiles import Tile, TileGrid, split_offsets, split_sizes

__all__ = [
    "Domain",
    "ShardSpec",
    "fill_fan_in_",
    "gather_field",
    "init_model",
    "local_domain",
    "normal_at",
    "output_sharded",
    "parameter_bytes",
    "sharded_parameter",
    "uniform_at",
]


@dataclass(frozen=True, eq=False)
class Domain:
    """A mesh and the global grid that a layer's input lives on."""

    mesh: DomainMesh
    grid: TileGrid

    @classmethod
    def create(cls, mesh: DomainMesh, n_lat: int, n_lon: int) -> Domain:
        return cls(mesh, TileGrid(n_lat, n_lon, mesh.shape.lat, mesh.shape.lon))

    @property
    def axis(self) -> Axis:
        return self.mesh.domain

    @property
    def size(self) -> int:
        return self.mesh.domain.size

    @property
    def index(self) -> int:
        return self.mesh.domain.index

    @property
    def tile(self) -> Tile:
        return self.grid.tile_of(self.index)

    def resized(self, n_lat: int, n_lon: int) -> Domain:
        """The same mesh over another global grid (after patching or resampling)."""
        return Domain.create(self.mesh, n_lat, n_lon)

    def counts(self, batch: int = 1) -> tuple[int, ...]:
        """Tokens per rank (``batch × tile area``), in domain-axis order."""
        return tuple(batch * t.shape[0] * t.shape[1] for t in self.grid.tiles())

    def split(self, n: int) -> tuple[int, int]:
        """This rank's ``[start, stop)`` of ``n`` items split over the domain ranks."""
        offsets = split_offsets(split_sizes(n, self.size))
        return offsets[self.index], offsets[self.index + 1]

    def split_sizes(self, n: int) -> tuple[int, ...]:
        return split_sizes(n, self.size)


def local_domain(n_lat: int, n_lon: int) -> Domain:
    """A one-rank domain with no communication: the serial counterpart of any layer."""
    return Domain.create(DomainMesh(MeshShape()), n_lat, n_lon)


@dataclass(frozen=True)
class ShardSpec:
    """This rank's block of a canonical global tensor: ``full[offsets[d] : offsets[d] + shape[d]]``."""

    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]

    def index(self, local_shape: Sequence[int]) -> tuple[slice, ...]:
        return tuple(slice(o, o + n) for o, n in zip(self.offsets, local_shape, strict=True))

    def flat_indices(self, local_shape: Sequence[int], device: torch.device | None = None) -> torch.Tensor:
        """Row-major global indices of the block's elements."""
        idx = torch.zeros((), dtype=torch.int64, device=device)
        stride = 1
        for d in reversed(range(len(self.global_shape))):
            r = torch.arange(self.offsets[d], self.offsets[d] + local_shape[d], device=device) * stride
            idx = r.view(-1, *([1] * (len(self.global_shape) - 1 - d))) + idx
            stride *= self.global_shape[d]
        return idx


def sharded_parameter(
    global_shape: Sequence[int], dim: int | None, start: int = 0, stop: int | None = None
) -> nn.Parameter:
    """An uninitialised parameter holding ``[start, stop)`` of ``global_shape`` along ``dim``.

    ``dim=None`` keeps the whole tensor on every domain rank (use only for what cannot be split, and
    say why): a replicated parameter, whose gradient the trainer sums over the domain ranks each
    step (``distributed/grads.py``), so every copy stays the same.
    """
    shape, offsets = list(global_shape), [0] * len(global_shape)
    if dim is not None:
        stop = global_shape[dim] if stop is None else stop
        shape[dim], offsets[dim] = stop - start, start
    p = nn.Parameter(torch.empty(shape))
    p._jigsaw_spec = ShardSpec(tuple(global_shape), tuple(offsets))  # type: ignore[attr-defined]
    return p


def output_sharded(
    domain: Domain, weight_shape: Sequence[int], dim: int, bias: bool
) -> tuple[tuple[int, ...], nn.Parameter, nn.Parameter | None]:
    """A weight sharded over its output features (``weight_shape[dim]``, split as ``domain.split``) and
    its bias likewise (``None`` without): ``(every rank's share of the outputs, weight, bias)``."""
    n = weight_shape[dim]
    start, stop = domain.split(n)
    weight = sharded_parameter(weight_shape, dim, start, stop)
    return domain.split_sizes(n), weight, sharded_parameter((n,), 0, start, stop) if bias else None


def spec_of(p: torch.Tensor) -> ShardSpec:
    """``p``'s block; a plain ``nn.Parameter`` is the whole tensor, replicated on every rank."""
    spec = getattr(p, "_jigsaw_spec", None)
    return spec if spec is not None else ShardSpec(tuple(p.shape), (0,) * p.dim())


# ------------------------------------------------------------------ counter-based randomness
_M1, _M2 = -4658895280553007687, -7723592293110705685  # splitmix64 constants as signed int64


def _srl(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = x ^ _srl(x, 30)
    x = x * _M1
    x = x ^ _srl(x, 27)
    x = x * _M2
    return x ^ _srl(x, 31)


def _stream(seed: int, key: str) -> int:
    s = (seed * 0x9E3779B97F4A7C15 + zlib.crc32(key.encode())) & ((1 << 63) - 1)
    return int(_mix(torch.tensor(s)).item())


def uniform_at(index: torch.Tensor, seed: int, key: str) -> torch.Tensor:
    """Uniform (0, 1) float32 values that depend only on ``(seed, key, index)``."""
    h = _mix(index * 2 + 1 + _stream(seed, key))
    return (_srl(h, 40).to(torch.float32) + 0.5) / float(1 << 24)


def normal_at(index: torch.Tensor, seed: int, key: str) -> torch.Tensor:
    """Standard normal float32 values that depend only on ``(seed, key, index)`` (Box–Muller)."""
    u1 = uniform_at(index * 2, seed, key)
    u2 = uniform_at(index * 2 + 1, seed, key)
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)


@torch.no_grad()
def fill_normal_(p: torch.Tensor, seed: int, key: str, std: float, mean: float = 0.0) -> None:
    idx = spec_of(p).flat_indices(p.shape, p.device)
    p.copy_(normal_at(idx, seed, key) * std + mean)


@torch.no_grad()
def fill_uniform_(p: torch.Tensor, seed: int, key: str, low: float, high: float) -> None:
    idx = spec_of(p).flat_indices(p.shape, p.device)
    p.copy_(uniform_at(idx, seed, key) * (high - low) + low)


def fill_fan_in_(weight: torch.Tensor, bias: torch.Tensor | None, seed: int, key: str, fan_in: int) -> None:
    """torch's default for linear and conv layers: weight and bias uniform in ±1/sqrt(fan_in)."""
    bound = 1.0 / math.sqrt(fan_in)
    fill_uniform_(weight, seed, f"{key}.weight", -bound, bound)
    if bias is not None:
        fill_uniform_(bias, seed, f"{key}.bias", -bound, bound)


def init_model(model: nn.Module, seed: int) -> nn.Module:
    """(Re)initialise every layer with keys from its module path: mesh-invariant.

    A jigsaw layer fills its blocks from the counter-based generator; a plain torch layer holding
    weights (replicated: every rank holds all of it) runs its own ``reset_parameters`` under a
    generator seeded from ``(seed, path)``, so it too is the same on every rank and every mesh.
    """
    for name, module in model.named_modules():
        reset = getattr(module, "reset_parameters", None)
        if reset is None:
            continue
        key = name or type(module).__name__
        if getattr(module, "jigsaw_layer", False):
            reset(seed=seed, key=key)
        elif own := list(module.parameters(recurse=False)):
            cuda = sorted({p.device.index or 0 for p in own if p.device.type == "cuda"})
            with torch.random.fork_rng(devices=cuda):
                torch.manual_seed(_stream(seed, key) & ((1 << 63) - 1))
                reset()
    return model


def parameter_bytes(module: nn.Module) -> int:
    """Bytes of the parameters this rank holds."""
    return sum(p.numel() * p.element_size() for p in module.parameters())


# --------------------------------------------------------------------------- field helpers
def gather_field(x: torch.Tensor, domain: Domain) -> torch.Tensor:
    """The global field ``(..., n_lat, n_lon)`` from every rank's tile (autograd-aware)."""
    if domain.size == 1:
        return x
    areas = domain.counts()
    flat = all_gather(x.flatten(-2), domain.axis, dim=-1, sizes=areas)
    tiles = [
        piece.unflatten(-1, t.shape)
        for piece, t in zip(flat.split(list(areas), dim=-1), domain.grid.tiles(), strict=True)
    ]
    return domain.grid.assemble(tiles)
