"""Validator checks for attention: ring attention core, global and neighbourhood attention.

References are plain torch on the global token sequence: ``F.scaled_dot_product_attention``
over the row-major flattened grid, and neighbourhood attention by ``pad_reference`` +
``F.unfold`` + masked softmax. Expected bytes: the bare ring's closed form
``(P-1)·|K+V|`` forward and ``(P-1)·(|K+V| + |dK+dV|)`` backward, and for the attention layers
what the layers declare (``cost``: projections, ring or halo, relative-bias gather).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import checkpoint

from ..distributed.halo import Halo, pad_reference
from ..distributed.mesh import DomainMesh
from ..layers.attention import GlobalAttention, LocalAttention
from ..layers.base import Domain, init_model, local_domain
from ..layers.cost import step_bytes
from ..layers.ring_attention import ring_attention, ring_attention_bytes
from .layer_harness import check_module
from .registry import Record, register

GRIDS = [(8, 12), (7, 10)]  # divisible on small meshes, uneven


def _fits(mesh: DomainMesh, grid: tuple[int, int]) -> bool:
    return grid[0] >= mesh.shape.lat and grid[1] >= mesh.shape.lon


class _Mode(nn.Module):
    """Runs ``inner`` under activation checkpointing or bf16 autocast (output cast to fp32)."""

    def __init__(self, inner: nn.Module, mode: str):
        super().__init__()
        self.inner, self.mode = inner, mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "checkpoint":
            return checkpoint(self.inner, x, use_reentrant=False)
        if self.mode == "bf16":
            with torch.autocast(x.device.type, dtype=torch.bfloat16):
                return self.inner(x).float()
        return self.inner(x)


# mode: (tolerance, forward passes in the bytes: checkpointing recomputes the forward)
MODES = {"fp32": (1e-5, 1), "checkpoint": (1e-5, 2), "bf16": (3e-2, 1)}


def _check_modes(mesh, op, shape, build, x, grid, reference, fwd_bwd, modes):
    """``check_module`` of ``build`` in each of ``modes`` (see ``MODES``).

    bf16 moves bf16 activations, so its bytes are recorded but not compared.
    """
    for mode in modes:
        tol, passes = MODES[mode]
        yield check_module(
            mesh,
            op if mode == "fp32" else f"{op}.{mode}",
            shape,
            lambda dm, mode=mode: _Mode(build(dm), mode),
            x,
            grid,
            layout="tokens",
            reference=lambda m, t: reference(m.inner, t),
            tolerance=tol,
            expected_bytes=None if mode == "bf16" else passes * fwd_bwd[0] + fwd_bwd[1],
        )


def _heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, H, W, C) → (B, heads, H·W, C/heads), tokens row-major."""
    B, n_lat, n_lon, C = t.shape
    return t.reshape(B, n_lat * n_lon, heads, C // heads).transpose(1, 2)


def _merge(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    return t.transpose(1, 2).reshape(shape)


class _RingCore(nn.Module):
    """The bare ``ring_attention`` on a token tile holding ``[q | k | v]`` channels."""

    jigsaw_layer = False

    def __init__(self, domain: Domain, heads: int, block: int | None):
        super().__init__()
        self.domain, self.heads, self.block = domain, heads, block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (_heads(t.contiguous(), self.heads) for t in x.chunk(3, dim=-1))
        o = ring_attention(q, k, v, self.domain.axis, self.domain.counts(1), block=self.block)
        return _merge(o, (*x.shape[:-1], x.shape[-1] // 3))


def _sdpa_ref(x: torch.Tensor, heads: int) -> torch.Tensor:
    q, k, v = (_heads(t, heads) for t in x.chunk(3, dim=-1))
    return _merge(F.scaled_dot_product_attention(q, k, v), (*x.shape[:-1], x.shape[-1] // 3))


def _qkv_ref(m: GlobalAttention | LocalAttention, x: torch.Tensor) -> torch.Tensor:
    """``[q | k | v]`` channels from the serial module's full weights."""
    return torch.cat([x @ lin.weight + (0 if lin.bias is None else lin.bias) for lin in (m.q, m.k, m.v)], -1)


def _global_ref(m: GlobalAttention, x: torch.Tensor) -> torch.Tensor:
    o = _sdpa_ref(_qkv_ref(m, x), m.num_heads)
    return o @ m.proj.weight + m.proj.bias


@register("ring_attention")
def check_ring(mesh: DomainMesh) -> Iterator[Record]:
    for grid, batch, heads, d, block, modes in [
        ((8, 12), 2, 2, 4, None, ["fp32", "bf16"]),
        ((7, 10), 2, 3, 2, 7, ["fp32"]),
    ]:
        if not _fits(mesh, grid):
            continue
        C = heads * d
        x = torch.randn(batch, *grid, 3 * C, generator=torch.Generator().manual_seed(grid[0] + C))
        domain = Domain.create(mesh, *grid)
        yield from _check_modes(
            mesh,
            "ring_attention",
            f"{grid[0]}x{grid[1]} b{batch} h{heads} d{d} block{block}",
            lambda dm, heads=heads, block=block: _RingCore(dm, heads, block),
            x,
            grid,
            lambda m, t: _sdpa_ref(t, m.heads),
            ring_attention_bytes(domain.counts(1), batch, C),
            modes,
        )


@register("global_attention")
def check_global(mesh: DomainMesh) -> Iterator[Record]:
    for grid, batch, dim, heads, bias, modes in [
        ((8, 12), 2, 8, 2, True, ["fp32", "checkpoint"]),
        ((7, 10), 1, 6, 3, False, ["fp32"]),
    ]:
        if not _fits(mesh, grid):
            continue
        x = torch.randn(batch, *grid, dim, generator=torch.Generator().manual_seed(dim))
        domain = Domain.create(mesh, *grid)
        yield from _check_modes(
            mesh,
            "global_attention",
            f"{grid[0]}x{grid[1]} b{batch} dim{dim} h{heads}{' qkv_bias' if bias else ''}",
            lambda dm, a=(dim, heads, bias): GlobalAttention(dm, *a),
            x,
            grid,
            _global_ref,
            step_bytes(GlobalAttention(domain, dim, heads, bias), batch),  # as the layers declare
            modes,
        )
    yield _memory_record(mesh)


# ----------------------------------------------------------------------- local attention
def _neighbourhood_ref(m: LocalAttention, qkv: torch.Tensor) -> torch.Tensor:
    """Neighbourhood attention on the global grid: pad_reference + unfold + masked softmax."""
    B, n_lat, n_lon, C3 = qkv.shape
    C, H, d, r = C3 // 3, m.num_heads, m.head_dim, m.radius
    K, N = (2 * r + 1) ** 2, n_lat * n_lon
    q = qkv[..., :C].reshape(B, N, H, d)
    kv = pad_reference(qkv[..., C:].permute(0, 3, 1, 2), Halo.uniform(r, m.lat_mode))
    nb = F.unfold(kv, 2 * r + 1).reshape(B, 2, H, d, K, N)
    scores = torch.einsum("bnhd,bhdkn->bhnk", q, nb[:, 0]) * d**-0.5
    if m.rel_bias is not None:
        scores = scores + m.rel_bias[None, :, None, :]
    ones = torch.ones(1, 1, n_lat, n_lon)
    valid = F.unfold(pad_reference(ones, Halo.uniform(r, "zeros")), 2 * r + 1)[0].T  # (N, K)
    if m.lat_mode == "zeros":
        scores = scores.masked_fill(valid == 0, float("-inf"))
    return torch.einsum("bhnk,bhdkn->bnhd", scores.softmax(-1), nb[:, 1]).reshape(B, n_lat, n_lon, C)


def _local_ref(m: LocalAttention, x: torch.Tensor) -> torch.Tensor:
    return _neighbourhood_ref(m, _qkv_ref(m, x)) @ m.proj.weight + m.proj.bias


class _LocalCore(nn.Module):
    """``LocalAttention.attend`` alone, on a token tile holding ``[q | k | v]`` channels."""

    def __init__(self, layer: LocalAttention):
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer.attend(*x.chunk(3, dim=-1))


@register("local_attention")
def check_local(mesh: DomainMesh) -> Iterator[Record]:
    for grid, batch, dim, heads, radius, mode, qkv_bias, rel, modes in [
        ((8, 12), 2, 8, 2, 1, "pole", True, True, ["fp32", "checkpoint"]),
        ((7, 10), 2, 6, 3, 2, "zeros", False, True, ["fp32"]),
        ((7, 10), 1, 4, 1, 3, "pole", True, False, ["fp32"]),  # window wider than most tiles
    ]:
        if not _fits(mesh, grid):
            continue
        x = torch.randn(batch, *grid, dim, generator=torch.Generator().manual_seed(radius * 10 + dim))
        domain = Domain.create(mesh, *grid)
        layer = LocalAttention(domain, dim, heads, radius, mode, qkv_bias, rel)
        yield from _check_modes(
            mesh,
            "local_attention",
            f"{grid[0]}x{grid[1]} b{batch} dim{dim} h{heads} r{radius} {mode}{' relbias' if rel else ''}",
            lambda dm, a=(dim, heads, radius, mode, qkv_bias, rel): LocalAttention(dm, *a),
            x,
            grid,
            _local_ref,
            step_bytes(layer, batch),  # as the layers declare
            modes,
        )
    # bf16 autocast on the attention between the projections (halo, masked softmax, bias)
    grid, dim, heads = (7, 10), 6, 3
    if _fits(mesh, grid):
        x = torch.randn(2, *grid, 3 * dim, generator=torch.Generator().manual_seed(5))
        yield from _check_modes(
            mesh,
            "local_attention.core",
            f"{grid[0]}x{grid[1]} b2 dim{dim} h{heads} r2 zeros relbias",
            lambda dm: _LocalCore(LocalAttention(dm, dim, heads, 2, "zeros", rel_pos_bias=True)),
            x,
            grid,
            lambda m, t: _neighbourhood_ref(m.layer, t),
            (0, 0),
            ["bf16"],
        )


# ------------------------------------------------------------------------ memory check
class LargestTensor(TorchDispatchMode):
    """Records the largest tensor (bytes) produced by any op run inside the mode."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


def largest_intermediate(module: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the largest tensor any op creates in one forward + backward of ``module``."""
    x = x.detach().clone().requires_grad_(True)
    with LargestTensor() as mode:
        module(x).square().sum().backward()
    return mode.largest


def _memory_record(mesh: DomainMesh, grid: tuple[int, int] = (16, 16), dim: int = 8, heads: int = 2):
    """Per-rank largest intermediate of GlobalAttention vs the 1-rank module, same global size.

    Passes when no tensor exceeds one circulating fp32 ``[k, v]`` block ``B × 2 × n_local × dim``
    of the largest tile: the fused block kernels keep no ``n_local × n_block`` score tile (the
    ``math`` fallback kernel would, and would fail).
    """
    batch = 1
    domain = Domain.create(mesh, *grid)
    x = torch.randn(batch, *grid, dim, generator=torch.Generator().manual_seed(3))
    serial = largest_intermediate(init_model(GlobalAttention(local_domain(*grid), dim, heads), 0), x)
    t = domain.tile
    local = x[:, t.lat_start : t.lat_stop, t.lon_start : t.lon_stop].contiguous()
    mine = largest_intermediate(init_model(GlobalAttention(domain, dim, heads), 0), local)
    worst = torch.tensor([float(mine)], dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    n_max = max(domain.counts(1))
    bound = batch * 2 * n_max * dim * 4
    rec = Record(
        "global_attention.memory",
        f"{mesh.shape.lat}x{mesh.shape.lon}",
        f"{grid[0]}x{grid[1]} b{batch} dim{dim} h{heads} largest tensor",
        passed=int(worst.item()) <= bound,
        extra={
            "largest_bytes_rank_max": int(worst.item()),
            "largest_bytes_serial": serial,
            "kv_block_bound": bound,
            "score_tile_bytes": batch * heads * n_max * n_max * 4,
        },
    )
    return rec
