"""The truth table for any model: ``jigsaw-earth validate --model package.module:Class``.

On each mesh the model runs sharded and serially (``check_module``: outputs, input and weight
gradients in float32 and float64, bytes sent against the layers' declarations), as the built-in
models do in ``checks_models.py``. Then every submodule's first output is compared with the
serial module's output on the same input (forward hooks), and the first module to finish with a
diverging output is named: a tile-local ``torch.mean`` or a plain ``nn.Conv2d`` shows up as the
module that holds it, not as a wrong loss.

A module output is compared where its layout can be told from the shapes: the serial output's
tile as a field ``(..., H, W)`` or as tokens ``(B, H, W, C)`` of the output's own grid, or the
whole tensor where the sharded output has the serial shape (a replicated value). Others are
skipped.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..distributed.mesh import DomainMesh
from ..distributed.tiles import TileGrid
from ..layers.base import Domain, init_model, local_domain
from ..layers.cost import step_bytes
from .checks_models import BATCH, GRID, N_STATE, N_STATIC, N_TIME, FieldAdapter
from .layer_harness import check_module, scatter_tile

__all__ = ["DIVERGENCE", "check_user_model", "module_divergence"]

DIVERGENCE = 1e-4  # relative max error of a module's float32 output that counts as diverging


def _inputs(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(len(name))
    return torch.randn(BATCH, N_STATE + N_STATIC, *GRID, generator=gen), torch.randn(
        BATCH, N_TIME, generator=gen
    )


def _builder(name: str, preset: str | None, time: torch.Tensor):
    from ..models import build_model

    def build(domain: Domain) -> nn.Module:
        return FieldAdapter(build_model(name, domain, N_STATE, N_STATIC, N_TIME, preset), N_STATE, time)

    return build


def _record_outputs(model: nn.Module) -> tuple[dict[str, torch.Tensor], list[str], list]:
    outputs: dict[str, torch.Tensor] = {}
    order: list[str] = []
    handles = []
    for path, module in model.named_modules():
        if not path:
            continue

        def hook(_m: nn.Module, _inp: tuple, out: object, path: str = path) -> None:
            if path not in outputs and isinstance(out, torch.Tensor):
                outputs[path] = out.detach()
                order.append(path)

        handles.append(module.register_forward_hook(hook))
    return outputs, order, handles


def _tile_of(ref: torch.Tensor, got: torch.Tensor, mesh: DomainMesh) -> torch.Tensor | None:
    """This rank's part of the serial output ``ref``, if ``got``'s layout can be told from the shapes."""
    if ref.shape == got.shape and mesh.domain.size == 1:
        return ref
    k, (lat, lon) = mesh.domain.index, (mesh.shape.lat, mesh.shape.lon)
    if ref.dim() >= 2 and ref.shape[-2] >= lat and ref.shape[-1] >= lon:  # a field (..., H, W)
        grid = TileGrid(ref.shape[-2], ref.shape[-1], lat, lon)
        if tuple(grid.tile_of(k).shape) == tuple(got.shape[-2:]) and ref.shape[:-2] == got.shape[:-2]:
            return scatter_tile(ref, grid, k, "field")
    if ref.dim() == 4 and ref.shape[1] >= lat and ref.shape[2] >= lon:  # tokens (B, H, W, C)
        grid = TileGrid(ref.shape[1], ref.shape[2], lat, lon)
        if tuple(grid.tile_of(k).shape) == tuple(got.shape[1:3]) and ref.shape[::3] == got.shape[::3]:
            return scatter_tile(ref, grid, k, "tokens")
    return ref if ref.shape == got.shape else None


def module_divergence(
    mesh: DomainMesh, build, x: torch.Tensor, grid: tuple[int, int], seed: int
) -> list[tuple[str, str, float]]:
    """``(module path, class, relative error)`` of every comparable submodule, in completion order.

    The error is the worst over the domain ranks; -1 marks a module whose layout is unknown.
    """
    serial = init_model(build(local_domain(*grid)), seed)
    sharded = init_model(build(Domain.create(mesh, *grid)), seed)
    ref, order, handles = _record_outputs(serial)
    with torch.no_grad():
        serial(x)
    for h in handles:
        h.remove()
    got, _, handles = _record_outputs(sharded)
    in_grid = Domain.create(mesh, *grid).grid
    with torch.no_grad():
        sharded(scatter_tile(x, in_grid, mesh.domain.index, "field"))
    for h in handles:
        h.remove()
    errors = []
    for path in order:
        want = _tile_of(ref[path], got[path], mesh) if path in got else None
        if want is None:
            errors.append(-1.0)
            continue
        scale = float(ref[path].abs().max()) or 1.0
        errors.append(float((got[path].float() - want.float()).abs().max()) / scale)
    worst = torch.tensor(errors, dtype=torch.float64)
    if dist.is_initialized() and mesh.domain.size > 1:
        dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=mesh.domain.group)
    modules = dict(serial.named_modules())
    return [(p, type(modules[p]).__name__, float(e)) for p, e in zip(order, worst.tolist(), strict=True)]


def check_user_model(mesh: DomainMesh, name: str, preset: str | None) -> dict:
    """The truth-table record of model ``name`` on ``mesh`` and its first diverging module."""
    x, time = _inputs(name)
    build = _builder(name, preset, time)
    expected = sum(step_bytes(build(Domain.create(mesh, *GRID)), BATCH))  # the layers' declarations
    shape = f"{GRID[0]}x{GRID[1]} b{BATCH} {N_STATE}+{N_STATIC}+{N_TIME}ch {preset or 'default'}"
    record = check_module(mesh, name, shape, build, x, GRID, reference=None, seed=3, expected_bytes=expected)
    first = None
    for path, cls, err in module_divergence(mesh, build, x, GRID, seed=3):
        if err > DIVERGENCE:
            first = {"module": path.removeprefix("model."), "class": cls, "error": err}
            break
    return {"record": record.as_dict(), "first_divergence": first}
