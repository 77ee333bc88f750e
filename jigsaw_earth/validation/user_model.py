"""The truth table for any model: ``jigsaw-earth validate --model package.module:Class``.

First the model contract (``check_contract``, in the calling process: ``forward``'s signature,
its output's shape, no parameter made in ``forward``), one line per breach. Then on each mesh the
model runs sharded and serially (``check_module``: outputs, input and weight gradients in float32
and float64, bytes sent against the layers' declarations), as the built-in models do in
``checks_models.py``, and:

* the serial run must reproduce itself (``reproducibility``): two builds with the same seed hold
  the same parameters and buffers and compute the same values on the same input. A parameter
  drawn outside the seeded init or a forward that draws random numbers makes every reference
  arbitrary, so the case fails, naming the parameter, module or op;
* every submodule's first output and every torch call of the model's own source (``op_trace``:
  an inline ``torch.mean`` or ``torch.roll`` in ``predict`` included) is compared with the serial
  run's, and the first to finish with a diverging value is named, with why it fails
  (``op_trace.explain``).

A value is compared where its layout can be told from the shapes: the serial value's tile as a
field ``(..., H, W)`` or as tokens ``(B, H, W, C)``, or the whole tensor where the sharded value
has the serial shape (a replicated value); an op's field or tokens must be on one of the model's
grids (a flattened field is skipped). Others are skipped.
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
from .op_trace import Item, Trace, explain, traced

__all__ = ["DIVERGENCE", "check_contract", "check_user_model", "reproducibility"]

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


def _errors(
    ref: Trace, got: Trace, mesh: DomainMesh, grids: set[tuple[int, int]]
) -> list[tuple[Item, float]]:
    """Each serial item with the sharded run's relative error (-1: not comparable), in order."""
    mine = got.by_key()
    out = []
    for item in ref.items:
        other = mine.get(item.key)
        want = None
        if other is not None:
            if item.kind == "op" and ref_shape_unknown(item.value, other.value, grids):
                want = None
            else:
                want = _tile_of(item.value, other.value, mesh)
        if want is None:
            out.append((item, -1.0))
            continue
        scale = float(item.value.abs().max()) if item.value.numel() else 1.0
        err = float((other.value.float() - want.float()).abs().max()) if want.numel() else 0.0
        out.append((item, err / (scale or 1.0)))
    return out


def ref_shape_unknown(ref: torch.Tensor, got: torch.Tensor, grids: set[tuple[int, int]]) -> bool:
    """An op's output whose layout cannot be told: not the serial shape, and not a field or token
    tile of one of the model's grids (a flattened or reshaped field is not compared)."""
    if ref.shape == got.shape:
        return False
    field = ref.dim() >= 2 and tuple(ref.shape[-2:]) in grids
    tokens = ref.dim() == 4 and tuple(ref.shape[1:3]) in grids
    return not (field or tokens)


def _grids(model: nn.Module, grid: tuple[int, int]) -> set[tuple[int, int]]:
    """The global grids of the model's layers (its input grid, patch grids, …)."""
    found = {tuple(grid)}
    for m in model.modules():
        for attr in ("domain", "out_domain"):
            d = getattr(m, attr, None)
            g = getattr(d, "grid", None)
            if g is not None:
                found.add((g.n_lat, g.n_lon))
    return found


def _divergence(mesh: DomainMesh, build, x: torch.Tensor, grid: tuple[int, int], seed: int):
    """``(traced item, relative error)`` of every comparable submodule output and every torch call of the
    model's own code, in completion order (``op_trace``), the error the worst over the domain ranks (-1:
    a value whose layout is unknown); and the serial model's modules by path."""
    serial = init_model(build(local_domain(*grid)), seed)
    sharded = init_model(build(Domain.create(mesh, *grid)), seed)
    with torch.no_grad(), traced(serial) as ref:
        serial(x)
    in_grid = Domain.create(mesh, *grid).grid
    with torch.no_grad(), traced(sharded) as got:
        sharded(scatter_tile(x, in_grid, mesh.domain.index, "field"))
    pairs = _errors(ref, got, mesh, _grids(serial, grid))
    worst = torch.tensor([e for _, e in pairs], dtype=torch.float64)
    if dist.is_initialized() and mesh.domain.size > 1:
        dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=mesh.domain.group)
    return [(i, float(e)) for (i, _), e in zip(pairs, worst.tolist(), strict=True)], dict(
        serial.named_modules()
    )


def reproducibility(build, x: torch.Tensor, grid: tuple[int, int], seed: int) -> str | None:
    """Why two serial builds of the model with the same seed disagree (``None``: they agree
    bit for bit): a parameter or buffer drawn outside the seeded init, or a forward that draws
    random numbers (both sharded and serial references would then be arbitrary)."""
    a = init_model(build(local_domain(*grid)), seed)
    b = init_model(build(local_domain(*grid)), seed)
    tb = dict(b.state_dict(keep_vars=True))
    for name, t in a.state_dict(keep_vars=True).items():
        other = tb.get(name)
        if other is None or other.shape != t.shape or not torch.equal(t.detach(), other.detach()):
            kind = "parameter" if isinstance(t, nn.Parameter) else "buffer"
            d = (
                float((t.detach() - other.detach()).abs().max())
                if other is not None and other.shape == t.shape
                else float("nan")
            )
            return (
                f"{kind} {name!r} differs between two builds with the same seed (max difference {d:.2e}): it "
                f"is drawn outside the seeded initialisation (e.g. nn.Parameter(torch.randn(...)) in "
                f"__init__), so every build and every rank holds another model; make it a jigsaw "
                f"parameter (sharded_parameter + reset_parameters(seed, key)) or a torch layer that "
                f"init_model re-initialises"
            )
    with torch.no_grad(), traced(a) as ta:
        ya = a(x)
    with torch.no_grad(), traced(b) as tb2:
        yb = b(x)
    other = tb2.by_key()
    for item in ta.items:
        o = other.get(item.key)
        if o is None or o.value.shape != item.value.shape:
            continue
        scale = float(item.value.abs().max()) or 1.0
        if float((item.value - o.value).abs().max()) > 1e-6 * scale:
            what = item.label if item.kind == "op" else f"module {item.label!r} ({item.cls.__name__})"
            return (
                f"{what} gives other values on a second run of the same serial model on the same input: "
                f"the forward draws random numbers (dropout in training mode, torch.randn/rand in "
                f"forward?); make it deterministic (jigsaw_earth.layers.Dropout is keyed by step and "
                f"position)"
            )
    scale = float(ya.abs().max()) or 1.0
    if float((ya - yb).abs().max()) > 1e-6 * scale:
        return (
            "the model's output differs between two runs of the same serial model on the same input: its "
            "forward draws random numbers; make it deterministic"
        )
    return None


def check_contract(name: str, preset: str | None) -> None:
    """The model contract (``models/contract.py``) on one rank of the validator's grid: one-line
    errors for a wrong ``forward`` signature, output shape or a parameter made in ``forward``."""
    from ..models import build_model
    from ..models.contract import check_signature, guard

    x, time = _inputs(name)
    model = build_model(name, local_domain(*GRID), N_STATE, N_STATIC, N_TIME, preset)
    check_signature(model, name)
    model = guard(init_model(model, 3), N_STATE, name)
    try:
        with torch.no_grad():
            model(x[:, :N_STATE], x[0, N_STATE:], time)
    except (RuntimeError, TypeError, IndexError, AttributeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ValueError(
            f"model {name}: forward fails on one rank ({GRID[0]}x{GRID[1]} grid, {N_STATE} state, {N_STATIC} "
            f"static, {N_TIME} time channels): {type(err).__name__}: {first}"
        ) from None


def check_user_model(mesh: DomainMesh, name: str, preset: str | None) -> dict:
    """The truth-table record of model ``name`` on ``mesh``, whether its serial run reproduces
    itself, and its first diverging module or op with the reason."""
    x, time = _inputs(name)
    build = _builder(name, preset, time)
    expected = sum(step_bytes(build(Domain.create(mesh, *GRID)), BATCH))  # the layers' declarations
    shape = f"{GRID[0]}x{GRID[1]} b{BATCH} {N_STATE}+{N_STATIC}+{N_TIME}ch {preset or 'default'}"
    record = check_module(mesh, name, shape, build, x, GRID, reference=None, seed=3, expected_bytes=expected)
    unsteady = reproducibility(build, x, GRID, seed=3)
    if unsteady is not None:
        record.passed = False
        record.extra["not_reproducible"] = unsteady
    first = None
    found, modules = _divergence(mesh, build, x, GRID, seed=3)
    for item, err in found if unsteady is None else ():  # an arbitrary reference blames nothing
        if err > DIVERGENCE:
            label = item.label.removeprefix("model.") if item.kind == "module" else item.label
            inside = item.inside.removeprefix("model").removeprefix(".")  # FieldAdapter holds it as 'model'
            cls = type(modules[item.inside]).__name__ if item.inside else ""
            first = {"module": label, "class": item.cls.__name__ if item.cls else "op", "kind": item.kind,
                     "inside": inside, "inside_class": cls, "error": err, "why": explain(item)}  # fmt: skip
            break
    return {"record": record.as_dict(), "first_divergence": first}
