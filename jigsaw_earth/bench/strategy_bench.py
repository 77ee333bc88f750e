"""``bench strategies``: the config's model (and variants) under each strategy, one process group.

Bytes read per sample go through the real ``TileReader`` (``data.report.io_report``) on a small
synthetic store of the model's grid and variables, chunked along the jigsaw tiles (what
``data prepare --for-mesh`` writes): DDP, FSDP2 and TP read whole samples (inputs and one
target), jigsaw ranks their tile. ``--memory-budget``: per strategy, the per-rank peak of one
sample measured on two small grids, extended linearly in the grid's points (parameters of token
mixing and activations both grow so), the largest grid predicted to fit, then a run at that grid
to confirm it (one step smaller while the confirmation exceeds the budget).
"""

from __future__ import annotations

import logging
import math
import statistics
import tempfile
from pathlib import Path
from typing import Any

from ..data.batch import N_GEOMETRY_CHANNELS, VariableSpec
from ..data.report import io_report
from ..data.synth import SynthConfig, synth_store
from ..data.writer import ChunkLayout
from ..distributed.halo import Halo
from ..distributed.mesh import MeshShape
from ..distributed.spawn import spawn
from .strategies import N_TIME, Problem, domain_shape
from .strategy_run import memory_worker, strategies_worker

__all__ = ["largest_grids", "read_bytes", "run_problem"]

log = logging.getLogger(__name__)


def problem_from_config(
    cfg: Any, grid: tuple[int, int], overrides: dict | None = None
) -> tuple[Problem, VariableSpec]:
    d = cfg.data
    spec = VariableSpec(tuple(d.upper_air), tuple(d.levels), tuple(d.surface), tuple(d.static))
    problem = Problem(
        model=cfg.model.name,
        preset=cfg.model.preset,
        overrides={**cfg.model.overrides, **(overrides or {})},
        grid=grid,
        n_state=spec.n_channels,
        n_static=len(spec.static) + N_GEOMETRY_CHANNELS,
        seed=cfg.run.seed,
    )
    return problem, spec


def reader_meshes(world: int) -> dict[str, tuple[int, int]]:
    """``lat × lon`` tiles each strategy reads (whole samples for the twin strategies)."""
    return {
        "jigsaw": domain_shape(world),
        "ddp": (1, 1),
        "fsdp2": (1, 1),
        "tp": (1, 1),
        "jigsaw_ddp": (1, world // 2),
    }


def read_bytes(spec: VariableSpec, grid: tuple[int, int], world: int, names: list[str]) -> dict[str, dict]:
    """Bytes the real tile reader reads for one sample (inputs + one target), most-reading rank."""
    meshes = reader_meshes(world)
    lat, lon = domain_shape(world)
    lon = math.lcm(lon, world // 2)
    layout = ChunkLayout(
        lat_chunk=-(-grid[0] // lat), lon_chunk=-(-grid[1] // lon), time_shard=1, compression="none"
    )
    synth = SynthConfig(n_lat=grid[0], n_lon=grid[1], start="2019-01-01T00", end="2019-01-01T18",
                        levels=spec.levels or (500,), upper_air=spec.upper_air, surface=spec.surface,
                        layout=layout)  # fmt: skip
    out = {}
    with tempfile.TemporaryDirectory(prefix="jigsaw-strategies-") as tmp:
        store = str(Path(tmp, "sample.zarr"))
        synth_store(store, synth, climatology=False)
        reads = VariableSpec(spec.upper_air, spec.levels, spec.surface, ())
        for name in names:
            r = io_report(store, MeshShape(1, *meshes[name]), reads, Halo(), 1)
            out[name] = {
                "bytes_read": max(k["bytes_read"] for k in r["ranks"]),
                "sample_bytes_read": r["sample_bytes_read"],
                "reader_mesh": "x".join(map(str, meshes[name])),
            }
    return out


def _spawn_shape(world: int) -> MeshShape:
    return MeshShape(1, *domain_shape(world))


def _problem_dict(p: Problem) -> dict:
    return dict(vars(p))


def run_problem(problem: Problem, spec: VariableSpec, world: int, names: list[str], repeats: int) -> dict:
    """All figures of ``names`` for one model: one spawned run, plus the reader's bytes."""
    global_batch = world
    ranks = spawn(
        _spawn_shape(world), strategies_worker, _problem_dict(problem), names, global_batch, repeats
    )
    reads = read_bytes(spec, problem.grid, world, names)
    rows = []
    for name in names:
        per = [r[name] for r in ranks]
        top = max(per, key=lambda f: f["memory"]["peak"])
        step_s = max(f["step_s"] for f in per)
        sent = [f["bytes_sent"] for f in per]
        rows.append({
            "strategy": name,
            "loss": per[0]["loss"],
            "grad_norm": per[0]["grad_norm"],
            "memory": top["memory"],
            "bytes_read": reads[name]["bytes_read"],
            "reader_mesh": reads[name]["reader_mesh"],
            "bytes_sent_mean": statistics.mean(sent),
            "bytes_sent_max": max(sent),
            "analytic_bytes_mean": statistics.mean(f["analytic_bytes"] for f in per),
            "step_s": step_s,
            "cpu_s": max(f["cpu_s"] for f in per),
            "samples_per_s": global_batch / step_s,
            "samples_per_rank": per[0]["samples_per_rank"],
        })  # fmt: skip
    for r in rows:
        if r["strategy"] in JIGSAW_SHAPES:
            r["plan"] = plan_figures(problem, JIGSAW_SHAPES[r["strategy"]](world), r["samples_per_rank"])
    base = {r["strategy"]: r for r in rows}.get("ddp")
    for r in rows:
        r["comm_ratio"] = (
            r["bytes_sent_mean"] / r["analytic_bytes_mean"] if r["analytic_bytes_mean"] else None
        )
        if base is not None:
            r["peak_vs_ddp"] = r["memory"]["peak"] / base["memory"]["peak"]
            r["read_vs_ddp"] = r["bytes_read"] / base["bytes_read"]
    return {
        "model": problem.model,
        "preset": problem.preset,
        "overrides": problem.overrides,
        "grid": list(problem.grid),
        "channels": {"state": problem.n_state, "static": problem.n_static, "time": N_TIME},
        "parameters": _parameters(problem),
        "world_size": world,
        "global_batch": global_batch,
        "sample_bytes_read": reads[names[0]]["sample_bytes_read"],
        "repeats": repeats,
        "rows": rows,
    }


JIGSAW_SHAPES = {  # the mesh each jigsaw strategy runs on (strategies.build_runner)
    "jigsaw": lambda world: MeshShape(1, *domain_shape(world)),
    "jigsaw_ddp": lambda world: MeshShape(2, 1, world // 2),
}


def plan_figures(problem: Problem, shape: MeshShape, samples: int) -> dict[str, int]:
    """``jigsaw-earth plan``'s prediction for a measured row: rank 0's peak for one sample per
    replica (the memory the row measures) and its bytes sent per step at the row's batch."""
    from ..models.plan import Hardware, plan_mesh

    args = (problem.model, problem.preset, problem.grid, shape, (problem.n_state, problem.n_static, N_TIME))
    one = plan_mesh(*args, Hardware(), batch=1, **problem.overrides)
    step = plan_mesh(*args, Hardware(), batch=samples, **problem.overrides)
    return {"peak": one.memory["total"], "bytes_sent": sum(step.comm.values())}


def _parameters(problem: Problem) -> int:
    from ..models.summary import summarize

    shape = MeshShape(1, 1, 1)
    s = summarize(problem.model, shape, problem.grid, problem.n_state, problem.n_static, N_TIME,
                  problem.preset, **problem.overrides)  # fmt: skip
    return s.total_params


def _grid(problem: Problem, q: int, unit: int) -> tuple[int, int]:
    h = q * unit
    return h, h * problem.grid[1] // problem.grid[0]


def _peaks(problem: Problem, world: int, jobs: list[tuple[str, tuple[int, int]]]) -> list[int]:
    payload = [(name, {**_problem_dict(problem), "grid": grid}) for name, grid in jobs]
    ranks = spawn(_spawn_shape(world), memory_worker, payload)
    return [max(r[i]["peak"] for r in ranks) for i in range(len(jobs))]


def largest_grids(problem: Problem, world: int, names: list[str], budget: int, unit: int) -> dict[str, dict]:
    """Per strategy: the largest grid (``q·unit × aspect``) whose per-rank peak of one sample is
    within ``budget`` bytes: measured at two small grids, extended linearly, confirmed by a run."""
    q1, q2 = 4, 8
    small = [(n, _grid(problem, q, unit)) for n in names for q in (q1, q2)]
    peaks = _peaks(problem, world, small)
    found: dict[str, dict] = {}
    for i, name in enumerate(names):
        p1, p2 = peaks[2 * i], peaks[2 * i + 1]
        n1, n2 = (math.prod(_grid(problem, q, unit)) for q in (q1, q2))
        slope = (p2 - p1) / (n2 - n1)
        q = q1
        while p1 + slope * (math.prod(_grid(problem, q + 1, unit)) - n1) <= budget and q < 512:
            q += 1
        measured = [[list(_grid(problem, q1, unit)), p1], [list(_grid(problem, q2, unit)), p2]]
        found[name] = {"measured": measured, "bytes_per_point": slope, "q": q}
    tried: dict[str, dict[int, int]] = {n: {} for n in names}
    for _ in range(CONFIRM_ROUNDS):  # run at q; step up while it fits, down while it does not
        pending = [n for n in names if _next_q(tried[n], found[n]["q"], budget) is not None]
        if not pending:
            break
        jobs = [(n, _grid(problem, _next_q(tried[n], found[n]["q"], budget), unit)) for n in pending]
        log.info("bench strategies: confirming %s", ", ".join(f"{n} at {g[0]}x{g[1]}" for n, g in jobs))
        for (name, grid), peak in zip(jobs, _peaks(problem, world, jobs)):
            tried[name][grid[0] // unit] = peak
            found[name]["q"] = grid[0] // unit
    for name in names:
        fits = [q for q, p in tried[name].items() if p <= budget]
        best = max(fits) if fits else min(tried[name])
        found[name].update(
            q=best,
            grid=list(_grid(problem, best, unit)),
            confirmed_peak=tried[name][best],
            fits=bool(fits),
            tried={
                f"{_grid(problem, q, unit)[0]}x{_grid(problem, q, unit)[1]}": p
                for q, p in tried[name].items()
            },
        )
    return found


CONFIRM_ROUNDS = 4


def _next_q(tried: dict[int, int], q: int, budget: int) -> int | None:
    """The next size to run, or None once ``q`` fits and ``q + 1`` does not (or q = 1 does not)."""
    if q not in tried:
        return q
    if tried[q] <= budget:
        return None if q + 1 in tried else q + 1
    if q - 1 in tried or q == 1:
        return None
    return q - 1


def default_unit(problem: Problem, world: int) -> int:
    """Grid rows step: a multiple of the patch and the mesh's lat split (and 2 for U-Net levels)."""
    from ..models import make_config

    cfg = make_config(problem.model, problem.preset, **problem.overrides)
    patch = getattr(cfg, "stride", None) or getattr(cfg, "patch", 1)
    levels = 2 ** (len(getattr(cfg, "channel_mults", (1,))) - 1)
    return math.lcm(patch * domain_shape(world)[0], levels * domain_shape(world)[0], 2 * patch)
