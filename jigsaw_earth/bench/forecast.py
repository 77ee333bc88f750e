"""``bench forecast``: the latency of one forecast (one init, one member) on 1 rank and on N ranks.

Prepared once in a scratch folder: a synthetic store of the config's variables on the grid
(``data synth``) and a checkpoint of the config's model as initialised (the weights do not change the
time). Each run is ``predict`` itself (``run_prediction``: the forecast loop of ``rollout.py``, every
lead written to a store in the scratch folder, or none with ``write=False``), in its own processes
(``python -m jigsaw_earth.bench.forecast_run``: one rank in that process with one thread, N ranks
spawned with one thread each); the runs interleave over repeats (``A B … B A``) so a neighbour's
load falls on all of them alike. Per run, the slowest rank's account of the loop (``LoopTimes``): the
loop's time and its parts — the forward, the part of it blocked in exchanges with other ranks, the
copy-out, the write and read stalls, the last writes — and the CPU time of the process (every
thread: host work beside the forward, which on a host with a core per rank takes from it).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ForecastRun", "forecast_runs", "forecast_worker", "prepare", "run_forecast_bench"]

log = logging.getLogger(__name__)
START = "2020-01-01"  # the synthetic store's first time; the forecast starts a day later


@dataclass(frozen=True)
class ForecastRun:
    """One configuration: the ``lat × lon`` mesh of its ranks (one thread each)."""

    name: str
    mesh: tuple[int, int]

    @property
    def world(self) -> int:
        return self.mesh[0] * self.mesh[1]


def forecast_runs(n: int, meshes: list[tuple[int, int]] | None = None) -> list[ForecastRun]:
    """1 rank, then every ``lat × lon`` mesh of ``n`` ranks (or ``meshes``)."""
    meshes = meshes or [(lat, n // lat) for lat in range(1, n + 1) if n % lat == 0]
    return [ForecastRun("1 rank", (1, 1))] + [
        ForecastRun(f"{a}x{b} ({a * b} ranks)", (a, b)) for a, b in meshes
    ]


def bench_config(raw: dict, root: Path, steps: int) -> dict:
    """``raw`` (a parsed config as a mapping) pointed at the scratch store and run directory: a
    forecast from ``START`` + 1 day, ``steps`` steps, no progress bar, batch 1 for the training
    forward that predict times at its end."""
    cfg = json.loads(json.dumps(raw))
    hours = cfg["data"]["step_hours"]
    first = np.datetime64(START, "h") + np.timedelta64(24, "h")
    end = first + np.timedelta64((steps + 4) * hours, "h")
    cfg["run"]["dir"] = str(root / "run")
    cfg["data"].update(store=str(root / "data.zarr"), climatology=None, train_period=[START, str(end)],
                       val_period=[str(first), str(end)])  # fmt: skip
    cfg["mesh"] = {"data": 1, "lat": 1, "lon": 1}
    cfg["training"]["batch_size"] = 1
    cfg["logging"].update(progress=False)
    cfg["logging"]["wandb"]["mode"] = "disabled"
    return cfg


def prepare(raw: dict, root: Path, grid: tuple[int, int], steps: int) -> dict:
    """The scratch store and checkpoint; returns the config of the runs."""
    import torch

    from ..checkpoint import SaveRequest, save_checkpoint
    from ..config import parse_config
    from ..data.sources import build_data
    from ..data.synth import SynthConfig, synth_store
    from ..distributed.mesh import DomainMesh, MeshShape
    from ..models.run import build_run_model

    cfg = bench_config(raw, root, steps)
    d = cfg["data"]
    synth = SynthConfig(n_lat=grid[0], n_lon=grid[1], start=START, end=d["train_period"][1],
                        levels=tuple(d["levels"]), upper_air=tuple(d["upper_air"]),
                        surface=tuple(d["surface"]))  # fmt: skip
    synth_store(root / "data.zarr", synth, climatology=False)
    parsed, mesh = parse_config(cfg), DomainMesh(MeshShape(1, 1, 1))
    with torch.no_grad():
        model = build_run_model(parsed, mesh, build_data(parsed, mesh, training=False))
    save_checkpoint(SaveRequest(cfg["run"]["dir"], 0, model, None, mesh))
    return cfg


def forecast_worker(mesh: Any, cfg: dict, out: str | None, steps: int) -> dict:
    """On every rank of one run: predict one init ``steps`` steps; this rank's loop times."""
    from ..config import parse_config
    from ..inference.predict import run_prediction

    cfg = {**cfg, "mesh": {"data": 1, "lat": mesh.shape.lat, "lon": mesh.shape.lon}}
    start = cfg["data"]["val_period"][0]
    result = run_prediction(parse_config(cfg), out, start=start, end=start, steps=steps, max_inits=1,
                            batch_size=1, overwrite=True, score=None, mesh=mesh)  # fmt: skip
    return result.times.as_dict()


def _launch(run: ForecastRun, cfg: dict, root: Path, steps: int, write: bool, timeout_s: float) -> dict:
    """One run in its own processes; the slowest rank's loop times (``LoopTimes.reduce``)."""
    name = "x".join(map(str, run.mesh))
    spec = {"mesh": list(run.mesh), "config": cfg, "steps": steps,
            "out": str(root / f"forecast-{name}.zarr") if write else None}  # fmt: skip
    spec_path, out_path = root / f"spec-{name}.json", root / f"out-{name}.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "jigsaw_earth.bench.forecast_run", str(spec_path), str(out_path)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"bench forecast: run {run.name!r} took over {timeout_s:g} s") from None
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"bench forecast: run {run.name!r} failed (exit {proc.returncode}):\n{tail}")
    return json.loads(out_path.read_text())


def run_forecast_bench(raw: dict, n: int, grid: tuple[int, int], steps: int, repeats: int,
                       write: bool = True, meshes: list[tuple[int, int]] | None = None,
                       timeout_s: float = 1800.0) -> dict:  # fmt: skip
    """Every run of ``forecast_runs(n, meshes)``, interleaved over ``repeats``; speedups per repeat."""
    runs = forecast_runs(n, meshes)
    got: dict[str, list[dict]] = {r.name: [] for r in runs}
    with tempfile.TemporaryDirectory(prefix="jigsaw-forecast-bench-") as tmp:
        root = Path(tmp)
        cfg = prepare(raw, root, grid, steps)
        loads = [list(os.getloadavg())]
        for k in range(repeats):
            for run in runs if k % 2 == 0 else runs[::-1]:
                log.info("bench forecast: repeat %d/%d, %s", k + 1, repeats, run.name)
                got[run.name].append(_launch(run, cfg, root, steps, write, timeout_s))
            loads.append(list(os.getloadavg()))
    base = got[runs[0].name]
    rows = []
    for run in runs:
        reps = got[run.name]
        speedups = [b["loop_s"] / r["loop_s"] for r, b in zip(reps, base)]
        row = {"name": run.name, "mesh": "x".join(map(str, run.mesh)), "processes": run.world,
               "speedup": statistics.median(speedups), "speedup_range": [min(speedups), max(speedups)],
               "repeats": reps}  # fmt: skip
        row.update({key: statistics.median(r[key] for r in reps) for key in reps[0]})
        rows.append(row)
    return {"world_size": n, "grid": list(grid), "steps": steps, "write": write, "repeats": repeats,
            "load_average": loads, "runs": [asdict(r) for r in runs], "rows": rows}  # fmt: skip


def format_forecast(result: dict) -> str:
    """The table ``bench forecast`` prints (and ``docs/scaling.md`` shows)."""
    head = (
        "| run | forecast loop s | speedup over 1 rank (range) | forward s | of it waiting for other "
        "ranks s | write stall s | read stall s | last writes s | CPU s per rank |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lo, hi = r["speedup_range"]
        lines.append(
            f"| {r['name']} | {r['loop_s']:.2f} | **{r['speedup']:.2f}** ({lo:.2f}–{hi:.2f}) | "
            f"{r['forward_s']:.2f} | {r['comm_wait_s']:.2f} | {r['write_stall_s']:.2f} | "
            f"{r['read_stall_s']:.2f} | {r['drain_s']:.2f} | {r['cpu_s']:.2f} |"
        )
    return "\n".join(lines)
