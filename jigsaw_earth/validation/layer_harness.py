"""One way to check any jigsaw layer or model against its serial counterpart.

``check_module`` builds the module twice from the same seed — on a one-rank domain (the serial
module, holding the canonical full parameters) and on the mesh — and compares:

* initial parameters: every shard equals its block of the serial parameter (mesh-invariant init);
* outputs: the rank's output tile against ``reference(serial_module, x_global)``, which should be
  written in plain torch (``None`` uses the serial module itself, for composite models);
* input gradients and every parameter gradient, for a random cotangent (a parameter replicated
  over the domain summed over it first, as the trainer does: ``distributed/grads.py``);
* each against the serial result in float32 and in float64 (the serial module and input cast
  to double), judged by the registry's one rule (``registry.judge``);
* communication: bytes sent over all ranks (against ``expected_bytes`` when given);
* parameter bytes per rank against the serial figure / N plus one slice of rounding per
  parameter (reported in ``extra``; part of ``passed`` when ``check_param_bytes``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from ..distributed.comm import ledger
from ..distributed.grads import domain_holders, reduce_gradients
from ..distributed.mesh import DomainMesh
from ..distributed.tiles import TileGrid
from ..layers.base import Domain, init_model, local_domain, parameter_bytes, spec_of
from .registry import Record, compare, measure

__all__ = ["FP32_TOLERANCE", "check_module", "scatter_tile", "to_tile"]

FP32_TOLERANCE = 1e-4


def scatter_tile(x: torch.Tensor, grid: TileGrid, k: int, layout: str) -> torch.Tensor:
    """Rank ``k``'s tile of a global tensor: ``field`` is (..., H, W), ``tokens`` is (B, H, W, C)."""
    if layout == "field":
        return grid.scatter(x, k)
    if layout == "tokens":
        return grid.scatter(x.movedim(-1, 1), k).movedim(1, -1).contiguous()
    raise ValueError(f"layout {layout!r}: use 'field' or 'tokens'")


to_tile = scatter_tile


def _out_grid(module: nn.Module, fallback: TileGrid) -> TileGrid:
    out = getattr(module, "out_domain", None)
    return out.grid if out is not None else fallback


def _slice_allowance(p: torch.Tensor) -> int:
    spec = spec_of(p)
    numel = 1
    for n in spec.global_shape:
        numel *= n
    split = [d for d, n in enumerate(p.shape) if n != spec.global_shape[d]]
    return sum(numel // spec.global_shape[d] for d in split) * p.element_size()


def _serial_run(
    module: nn.Module,
    x: torch.Tensor,
    reference: Callable[[nn.Module, torch.Tensor], torch.Tensor],
    cot: Callable[[torch.Size], torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:
    """Output, input gradient and parameters (with gradients) of the serial module."""
    x = x.detach().clone().requires_grad_(True)
    y = reference(module, x)
    (y * cot(y.shape).to(y.dtype)).sum().backward()
    return y.detach(), x.grad, dict(module.named_parameters())


def _grad(p: torch.Tensor | None) -> torch.Tensor | None:
    return None if p is None else p.grad


def check_module(
    mesh: DomainMesh,
    op: str,
    shape: str,
    build: Callable[[Domain], nn.Module],
    x_global: torch.Tensor,
    grid: tuple[int, int],
    *,
    layout: str = "field",
    out_layout: str | None = None,
    reference: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None,
    seed: int = 0,
    tolerance: float | None = None,
    expected_bytes: int | None = None,
    check_param_bytes: bool = True,
) -> Record:
    """Compare ``build(domain)`` on ``mesh`` with ``build(one-rank domain)``; see module doc.

    The serial module runs twice, in float32 and cast to float64, and the registry's judge
    compares the sharded result with both. ``tolerance`` marks a reduced-precision case (bf16
    autocast inside ``build``): a relative bound instead. For compatibility, a tolerance of at
    most ``FP32_TOLERANCE`` (what float32 cases passed before the float64 judge) is ignored.
    """
    if tolerance is not None and tolerance <= FP32_TOLERANCE:
        tolerance = None
    out_layout = out_layout or layout
    ref = reference or (lambda m, t: m(t))
    gen = torch.Generator().manual_seed(seed + 1)
    cot_cache: list[torch.Tensor] = []

    def cot(shape: torch.Size) -> torch.Tensor:  # the same random cotangent for every run
        if not cot_cache:
            cot_cache.append(torch.randn(shape, generator=gen, dtype=torch.float32))
        return cot_cache[0]

    serial = init_model(build(local_domain(*grid)), seed)
    y32, gx32, p32 = _serial_run(serial, x_global.float(), ref, cot)
    serial64 = init_model(build(local_domain(*grid)), seed).double()
    y64, gx64, p64 = _serial_run(serial64, x_global.double(), ref, cot)
    sharded = init_model(build(Domain.create(mesh, *grid)), seed)

    k = mesh.domain.index
    in_grid = Domain.create(mesh, *grid).grid
    out_grid = _out_grid(sharded, in_grid)

    def tile(t: torch.Tensor | None, g: TileGrid, lay: str) -> torch.Tensor | None:
        return None if t is None else scatter_tile(t.detach(), g, k, lay)

    x_local = scatter_tile(x_global.detach().float(), in_grid, k, layout).requires_grad_(True)
    fwd, bwd, labels = [], [], ["input"]
    for name, p in sharded.named_parameters():
        block = spec_of(p).index(p.shape)
        fwd.append(compare(p, p64[name][block], p32[name][block]))
    ledger.reset()
    y = sharded(x_local)
    fwd_bytes = ledger.bytes_sent
    y.backward(tile(cot(y32.shape), out_grid, out_layout))
    sent = ledger.bytes_sent  # the layers' own traffic; the trainer's gradient sums are not theirs
    params = list(sharded.parameters())
    holders = domain_holders(params, mesh)
    replicated = [p for p, n in zip(params, holders, strict=True) if n == mesh.domain.size > 1]
    reduce_gradients(replicated, mesh.domain, op="grad.replicated")  # as the trainer does each step
    fwd.append(compare(y, tile(y64, out_grid, out_layout), tile(y32, out_grid, out_layout)))
    bwd.append(compare(x_local.grad, tile(gx64, in_grid, layout), tile(gx32, in_grid, layout)))
    for name, p in sharded.named_parameters():
        block = spec_of(p).index(p.shape)
        want64, want32 = _grad(p64[name]), _grad(p32[name])
        got = p.grad if p.grad is not None else (torch.zeros_like(p) if want64 is not None else None)
        bwd.append(
            compare(
                got,
                None if want64 is None else want64[block],
                None if want32 is None else want32[block],
            )
        )
        labels.append(name)

    record = Record(
        op, f"{mesh.shape.lat}x{mesh.shape.lon}", shape, tolerance=tolerance, expected_bytes=expected_bytes
    )
    record = measure(record, fwd, bwd, sent, labels)
    mine = parameter_bytes(sharded)
    bound = parameter_bytes(serial) / mesh.domain.size + sum(
        _slice_allowance(p) for p in sharded.parameters()
    )
    stats = torch.tensor([mine, fwd_bytes, 1.0 if mine <= bound + 1e-9 else 0.0], dtype=torch.float64)
    if dist.is_initialized():
        maxed = stats.clone()
        dist.all_reduce(maxed[:1], op=dist.ReduceOp.MAX)
        dist.all_reduce(maxed[1:2])
        dist.all_reduce(maxed[2:], op=dist.ReduceOp.MIN)
        stats = maxed
    record.extra.update(
        param_bytes_rank_max=int(stats[0]),
        param_bytes_serial=parameter_bytes(serial),
        param_bytes_ok=bool(stats[2]),
        forward_bytes=int(stats[1]),
    )
    if check_param_bytes and not record.extra["param_bytes_ok"]:
        record.passed = False
    return record
