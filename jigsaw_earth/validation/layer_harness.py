"""One way to check any jigsaw layer or model against its serial counterpart.

``check_module`` builds the module twice from the same seed — on a one-rank domain (the serial
module, holding the canonical full parameters) and on the mesh — and compares:

* initial parameters: every shard equals its block of the serial parameter (mesh-invariant init);
* outputs: the rank's output tile against ``reference(serial_module, x_global)``, which should be
  written in plain torch (``None`` uses the serial module itself, for composite models);
* input gradients and every parameter gradient, for a random cotangent;
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
from ..distributed.mesh import DomainMesh
from ..distributed.tiles import TileGrid
from ..layers.base import Domain, init_model, local_domain, parameter_bytes, spec_of
from .registry import Record, measure, rel_error

__all__ = ["check_module", "scatter_tile", "to_tile"]


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
    tolerance: float = 1e-5,
    expected_bytes: int | None = None,
    check_param_bytes: bool = True,
) -> Record:
    """Compare ``build(domain)`` on ``mesh`` with ``build(one-rank domain)``; see module doc."""
    out_layout = out_layout or layout
    serial = init_model(build(local_domain(*grid)), seed)
    sharded = init_model(build(Domain.create(mesh, *grid)), seed)
    full = dict(serial.named_parameters())

    x = x_global.detach().clone().requires_grad_(True)
    y_ref = (reference or (lambda m, t: m(t)))(serial, x)
    gen = torch.Generator().manual_seed(seed + 1)
    cot = torch.randn(y_ref.shape, generator=gen, dtype=y_ref.dtype)
    (y_ref * cot).sum().backward()

    k = mesh.domain.index
    in_grid = Domain.create(mesh, *grid).grid
    out_grid = _out_grid(sharded, in_grid)
    x_local = scatter_tile(x.detach(), in_grid, k, layout).requires_grad_(True)
    errs_f, errs_b = [], []
    for name, p in sharded.named_parameters():
        errs_f.append(rel_error(p, full[name][spec_of(p).index(p.shape)]))
    ledger.reset()
    y = sharded(x_local)
    fwd_bytes = ledger.bytes_sent
    y.backward(scatter_tile(cot, out_grid, k, out_layout))
    errs_f.append(rel_error(y, scatter_tile(y_ref.detach(), out_grid, k, out_layout)))
    errs_b.append(rel_error(x_local.grad, scatter_tile(x.grad, in_grid, k, layout)))
    worst_param = ""
    for name, p in sharded.named_parameters():
        ref_grad = full[name].grad
        want = ref_grad[spec_of(p).index(p.shape)] if ref_grad is not None else None
        got = p.grad if p.grad is not None else (torch.zeros_like(p) if want is not None else None)
        e = rel_error(got, want)
        if e > max(errs_b, default=0.0):
            worst_param = name
        errs_b.append(e)

    record = Record(
        op, f"{mesh.shape.lat}x{mesh.shape.lon}", shape, tolerance=tolerance, expected_bytes=expected_bytes
    )
    record = measure(record, errs_f, errs_b, ledger.bytes_sent)
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
    if worst_param:
        record.extra["worst_param"] = worst_param
    if check_param_bytes and not record.extra["param_bytes_ok"]:
        record.passed = False
    return record
