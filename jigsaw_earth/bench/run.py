"""Run bench cases: equality check, interleaved timing and peak memory on one rank, then
per-rank peak memory and bytes sent on each mesh (one spawn per mesh, CPU, gloo)."""

from __future__ import annotations

import copy
import logging

import torch

from ..distributed.comm import ledger
from ..distributed.mesh import DomainMesh, parse_mesh
from ..distributed.spawn import spawn
from ..layers.base import Domain, init_model, local_domain
from ..twins import plain, twin_errors
from ..validation.layer_harness import scatter_tile
from .cases import Case, layer_cases, model_cases, select
from .measure import Step, peak_bytes, time_pair
from .parts import layer_paths, part_times
from .plain_forms import PLAIN_FORMS

__all__ = ["check_case", "mesh_figures", "run_cases"]

log = logging.getLogger(__name__)

DTYPES = {"fp32": None, "bf16": torch.bfloat16}


def cases_for(kind: str, size: str, only: list[str] | None) -> list[Case]:
    return select(layer_cases(size) if kind == "layers" else model_cases(size), only)


def check_case(case: Case, jig: torch.nn.Module, twin: torch.nn.Module, inputs, tolerance: float) -> dict:
    """fp32 errors of the twin against jigsaw; raises when any live tensor differs beyond ``tolerance``.

    A parameter whose gradient is ~0 (below 1e-6 of the largest parameter gradient: a dead
    parameter, e.g. a conv bias feeding GroupNorm) is reported but not judged."""
    errors = twin_errors(jig, twin, inputs, seed=99, convert="same" not in case.tags)
    grads = {n: p.grad.abs().max().item() for n, p in jig.named_parameters() if p.grad is not None}
    top = max(grads.values(), default=0.0)
    dead = sorted(n for n, g in grads.items() if g <= 1e-6 * top)
    judged = {k: v for k, v in errors.items() if k.removeprefix("grad:") not in dead}
    worst = max(judged, key=judged.get)
    if not judged[worst] <= tolerance:
        raise RuntimeError(
            f"bench {case.name}: the jigsaw module and its plain twin differ: {worst} relative error "
            f"{judged[worst]:.2e} > {tolerance:.0e}; fix the layer (or the twin) before timing it"
        )
    return {"max_error": judged[worst], "worst": worst, "dead_parameters": dead}


def run_case(
    case: Case, repeats: int, device: str, dtype: str, tolerance: float, parts: bool = False
) -> dict:
    jig = init_model(case.jigsaw(local_domain(*case.grid)), 0)
    twin = copy.deepcopy(jig) if "same" in case.tags else plain(jig)
    inputs = case.inputs()
    check = check_case(case, jig, twin, inputs, tolerance)
    jig, twin = jig.to(device), twin.to(device)
    inputs = [x.to(device) for x in inputs]
    a, b = Step(jig, inputs, DTYPES[dtype]), Step(twin, inputs, DTYPES[dtype])
    timing = time_pair(a, b, repeats, device)
    mem_a, mem_b = peak_bytes(a, device), peak_bytes(b, device)
    plain_form = {}
    if case.name in PLAIN_FORMS:  # the twin against what a user writes (same weights)
        user = _Form(twin, PLAIN_FORMS[case.name](twin))
        with torch.no_grad():
            if not torch.equal(twin(*inputs), user(*inputs)):
                raise RuntimeError(f"bench {case.name}: the twin differs from the plain form a user writes")
        pair = time_pair(b, Step(user, inputs, DTYPES[dtype]), repeats, device)
        plain_form = {"twin_vs_plain": {"ratio": pair["ratio"], "plain_ms": pair["twin_ms"]}}
    if parts:  # the twin has the jigsaw model's module paths
        paths = layer_paths(jig)
        parts_ms = {
            k: part_times(m, inputs, paths, repeats, DTYPES[dtype], device)
            for k, m in (("jigsaw", jig), ("twin", twin))
        }
    return {
        "name": case.name,
        "note": case.note,
        "grid": list(case.grid),
        **check,
        **timing,
        "memory": {"jigsaw_bytes": mem_a, "twin_bytes": mem_b, "ratio": mem_a / mem_b},
        "meshes": {},
        **plain_form,
        **({"parts": parts_ms} if parts else {}),
    }


class _Form(torch.nn.Module):
    """A plain form (``plain_forms.py``) as a module holding the twin's parameters."""

    def __init__(self, twin: torch.nn.Module, forward):
        super().__init__()
        self.twin, self.form = twin, forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.form(x)


def _mesh_worker(
    mesh: DomainMesh, kind: str, size: str, names: list[str], dtype: str, part_steps: int = 0
) -> list[dict]:
    """On every rank: per case, this rank's peak bytes of one step and the bytes it sent (and, with
    ``part_steps``, its time per part)."""
    out = []
    for case in cases_for(kind, size, names):
        domain = Domain.create(mesh, *case.grid)
        module = init_model(case.jigsaw(domain), 0)
        k = domain.index
        tiles = []
        for x, layout in zip(case.inputs(), case.layouts):
            if layout == "field":
                x = scatter_tile(x, domain.grid, k, "field").contiguous()
            elif layout == "tokens":
                x = scatter_tile(x, domain.grid, k, "tokens")
            elif layout == "static":
                x = scatter_tile(x, domain.grid, k, "field").contiguous()
            tiles.append(x)
        step = Step(module, tiles, DTYPES[dtype])
        step()  # warm-up
        ledger.reset()
        peak = peak_bytes(step)
        out.append({"name": case.name, "peak_bytes": peak, "bytes_sent": ledger.bytes_sent})
        if part_steps:
            out[-1]["parts"] = part_times(module, tiles, layer_paths(module), part_steps, DTYPES[dtype])
    return out


def mesh_figures(
    kind: str, size: str, names: list[str], mesh: str, dtype: str, part_steps: int = 0
) -> dict[str, dict]:
    """``{case: {peak_bytes_max, bytes_sent_max, bytes_sent_total[, parts of rank 0]}}`` over the
    ranks of ``mesh``."""
    ranks = spawn(parse_mesh(mesh), _mesh_worker, kind, size, names, dtype, part_steps)
    figures = {}
    for i, name in enumerate(names):
        per_rank = [r[i] for r in ranks]
        figures[name] = {
            "peak_bytes_max": max(r["peak_bytes"] for r in per_rank),
            "peak_bytes_mean": sum(r["peak_bytes"] for r in per_rank) / len(per_rank),
            "bytes_sent_max": max(r["bytes_sent"] for r in per_rank),
            "bytes_sent_total": sum(r["bytes_sent"] for r in per_rank),
            **({"parts": per_rank[0]["parts"]} if part_steps else {}),
        }
    return figures


def run_cases(
    kind: str,
    size: str,
    only: list[str] | None,
    repeats: int,
    device: str,
    dtype: str,
    meshes: list[str],
    tolerance: float,
    parts: bool = False,
) -> list[dict]:
    """Every case of ``kind``; ``parts``: also each case's time per layer (``bench/parts.py``)."""
    results = []
    for case in cases_for(kind, size, only):
        log.info("bench %s: %s (%s)", kind, case.name, case.note)
        results.append(run_case(case, repeats, device, dtype, tolerance, parts))
    names = [c.name for c in cases_for(kind, size, only) if "serial" not in c.tags]
    one_rank = {}
    for mesh in meshes if names else []:
        log.info("bench %s: per-rank memory and bytes on %s", kind, mesh)
        figures = mesh_figures(kind, size, names, mesh, dtype, repeats if parts else 0)
        for r in results:
            if r["name"] not in figures:
                continue
            f = figures[r["name"]]
            if parts:
                r["parts"][f"{mesh} rank 0"] = f.pop("parts")
            if r["name"] not in one_rank:  # the one-rank figure on CPU, measured like the ranks'
                one_rank[r["name"]] = mesh_figures(kind, size, [r["name"]], "1x1", dtype)[r["name"]]
            base = one_rank[r["name"]]["peak_bytes_max"]
            r["meshes"][mesh] = {
                **f,
                "one_rank_peak_bytes": base,
                "peak_fraction": f["peak_bytes_max"] / base,
                "peak_fraction_of_twin": f["peak_bytes_max"] / r["memory"]["twin_bytes"],
            }
    return results
