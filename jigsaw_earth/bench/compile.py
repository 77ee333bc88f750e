"""``bench compile``: the trainer compiled against the trainer eager, step by step, on each mesh.

On every rank of a mesh (``compile_worker``), two ``Trainer``s of one config start from the same
weights: one eager, one whose model is compiled in place (``torch.compile``, the backend asked
for; the trainer's ``training.compile`` uses inductor). Their steps are interleaved, the order
swapped every step (eager first on odd steps), so both see the same load. Per step come back
both losses and step times and what Dynamo compiled during the compiled step
(``training.compile_report.CompileWatch``: graphs, graph breaks with reason and place,
recompiles).

``summarize_mesh`` reduces a mesh's ranks to: the largest |compiled − eager| loss difference,
compiled ÷ eager step time (median of the steps after ``warmup``, the slowest rank per step),
the graph-break places and the last step that compiled anything on any rank.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import warnings
from typing import Any

import torch

from ..distributed.mesh import DomainMesh, MeshShape
from ..distributed.spawn import spawn
from ..models.run import compile_model
from ..training.compile_report import CompileWatch, summarize

__all__ = ["compile_worker", "format_compile_bench", "run_compile_bench", "summarize_mesh"]

KINDS = ("eager", "compiled")


def _config(raw: dict, mesh: tuple[int, int], run_dir: str, steps: int) -> dict:
    """``raw`` for one trainer: the mesh, a scratch run dir, no checkpoints, validation, progress
    bar or wandb, the model left eager (the worker compiles it with the backend asked for)."""
    out = json.loads(json.dumps(raw))
    out["mesh"] = {"data": 1, "lat": mesh[0], "lon": mesh[1]}
    out["run"]["dir"] = run_dir
    out["training"].update(steps=steps, compile=False)
    out["optim"]["warmup_steps"] = min(out["optim"].get("warmup_steps", 0), steps - 1)
    out["checkpoint"].update(every=0, resume="never")
    out["validation"]["every"] = 0
    out["logging"].update(progress=False, every=steps, profile_step=0, compile_report=False)
    out["logging"]["wandb"]["mode"] = "disabled"
    return out


def compile_worker(mesh: DomainMesh, raw: dict, steps: int, backend: str, grid: list[int] | None) -> dict:
    """On one rank: ``steps`` interleaved steps of an eager and a compiled trainer (module
    docstring); ``grid``: random in-memory data on that grid instead of the config's store."""
    from ..config import parse_config
    from ..training.loop import Trainer

    torch.set_num_threads(1)
    shape = (mesh.shape.lat, mesh.shape.lon)
    trainers = {}
    with tempfile.TemporaryDirectory(prefix="jigsaw-compile-") as tmp:
        for kind in KINDS:
            cfg = parse_config(_config(raw, shape, f"{tmp}/{kind}", steps))
            trainers[kind] = Trainer(cfg, mesh, data=_data(cfg, raw, mesh, grid), new_run=True)
        watch = CompileWatch()
        compile_model(trainers["compiled"].model, backend)
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                rows = [_step_both(trainers, s, watch) for s in range(1, steps + 1)]
        finally:
            for t in trainers.values():
                t.close()
    said = sorted({str(w.message).split("\n")[0][:300] for w in seen})
    return {"steps": rows, "threads": torch.get_num_threads(), "warnings": said}


def _step_both(trainers: dict, step: int, watch: CompileWatch) -> dict[str, Any]:
    """Step ``step`` of both trainers (eager first on odd steps) and what the compiled one compiled."""
    row: dict[str, Any] = {"step": step}
    for kind in KINDS if step % 2 else reversed(KINDS):
        t0 = time.perf_counter()
        m = trainers[kind].train_step(step)
        trainers[kind].step = step
        row[kind] = {"loss": m["loss"], "step_s": m["step_time_s"], "wall_s": time.perf_counter() - t0}
        if kind == "compiled":
            row["compile"] = {"label": f"step {step}", "step": step, **watch.take()}
    return row


def _data(cfg, raw: dict, mesh: DomainMesh, grid: list[int] | None):
    if grid is None:
        from ..data.sources import build_data

        return build_data(cfg, mesh)
    from .scaling import memory_data

    times = 2 * cfg.training.batch_size * cfg.training.steps + cfg.training.rollout_steps + 4
    return memory_data(raw, mesh, tuple(grid), times)


def summarize_mesh(ranks: list[dict], warmup: int) -> dict[str, Any]:
    """One mesh's ranks → loss agreement, compiled ÷ eager step time and the compile summary."""
    n = len(ranks[0]["steps"])
    diff = max(abs(row["compiled"]["loss"] - row["eager"]["loss"]) for r in ranks for row in r["steps"])
    timed = range(min(warmup, n - 1), n)
    step = {k: [max(r["steps"][i][k]["step_s"] for r in ranks) for i in timed] for k in KINDS}
    per_rank = [summarize([row["compile"] for row in r["steps"]]) for r in ranks]
    return {
        "steps": n,
        "max_loss_diff": diff,
        "losses": {k: [row[k]["loss"] for row in ranks[0]["steps"]] for k in KINDS},
        "eager_step_s": statistics.median(step["eager"]),
        "compiled_step_s": statistics.median(step["compiled"]),
        "ratio": statistics.median(step["compiled"]) / statistics.median(step["eager"]),
        "timed_steps": len(timed),
        "first_step_s": {k: max(r["steps"][0][k]["wall_s"] for r in ranks) for k in KINDS},
        "last_step_compiling": max(s["last_step_compiling"] for s in per_rank),
        "recompiles": [s["recompile_list"] for s in per_rank],
        "compile": per_rank[0],
        "rank_breaks": [s["breaks"] for s in per_rank],
        "warnings": sorted({w for r in ranks for w in r["warnings"]}),
    }


def run_compile_bench(
    raw: dict,
    meshes: list[tuple[int, int]],
    steps: int,
    warmup: int,
    backend: str = "inductor",
    grid: list[int] | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """Every mesh in turn (its ranks spawned, one thread each, on ``device``: ``cuda`` gives each
    rank a GPU): ``{"LATxLON": summarize_mesh}``."""
    out = {}
    for lat, lon in meshes:
        shape = MeshShape(1, lat, lon)
        if shape.world_size == 1:  # in this process, on the device asked for; its threads kept
            threads = torch.get_num_threads()
            try:
                mesh = DomainMesh(shape, device=torch.device(device))
                ranks = [compile_worker(mesh, raw, steps, backend, grid)]
            finally:
                torch.set_num_threads(threads)
        else:
            ranks = spawn(shape, compile_worker, raw, steps, backend, grid, device=device)
        out[f"{lat}x{lon}"] = summarize_mesh(ranks, warmup)
    return out


def format_compile_bench(result: dict[str, Any]) -> str:
    """The table ``bench compile`` prints, then each mesh's graph-break places."""
    head = (
        f"{'mesh':<6} {'eager ms':>9} {'compiled ms':>12} {'ratio':>6} {'max |Δloss|':>12} "
        f"{'graphs':>7} {'breaks':>7} {'recompiles':>10} {'last compiling step':>20}"
    )
    lines = [head, "-" * len(head)]
    for mesh, r in result.items():
        c = r["compile"]
        lines.append(
            f"{mesh:<6} {1e3 * r['eager_step_s']:>9.1f} {1e3 * r['compiled_step_s']:>12.1f} "
            f"{r['ratio']:>6.2f} {r['max_loss_diff']:>12.2e} {c['graphs']:>7} {c['breaks']:>7} "
            f"{c['recompiles']:>10} {r['last_step_compiling']:>20}"
        )
    for mesh, r in result.items():
        places = r["compile"]["break_places"]
        lines.append(f"\n{mesh}: {len(places)} graph-break places (rank 0)")
        lines += [f"  {p['place']} — {p['reason']} (compiled {p['compiled']}x)" for p in places]
        lines += [f"  warning: {w}" for w in r["warnings"]]
    return "\n".join(lines)
