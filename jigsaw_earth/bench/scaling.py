"""``bench scaling``: one model and global batch trained on 1 rank and on every split of N ranks.

Runs (``scaling_runs``): 1 rank with 1 thread, 1 rank with N threads, jigsaw on every
``lat × lon`` mesh of N, data parallelism on N (the trainer's DDP: ``mesh.data = N``) and
jigsaw × data parallelism where N allows it. Each run is its own processes (``python -m
jigsaw_earth.bench.scaling_run``: one process, or N spawned ranks with one thread each) and the
runs are interleaved over repeats (``A B … B A``). Every run trains with the real ``Trainer``
(the config's model, optimizer and loss; ``train_step``, so the step accounting is the one
every training run logs) on a random in-memory data set of the grid, ``warmup`` steps and then
``steps`` measured ones; per step, every rank's wall time, parts and CPU time come back.

``plan``'s prediction beside each run uses this machine's measured rates: the GEMM rate is the
1-rank-1-thread run's declared FLOPs over its compute time, the link rate what ``link_rate``
measures between two gloo ranks (8 MiB messages, both ways at once, as the rings send). A rank
of N multiplies smaller matrices, which run slower per FLOP: one more serial run per repeat, on
a grid of one N-th of the cells (``tile_grid``), gives the rate at that work, and plan takes the
rate at each mesh's work per rank from the two points (``Hardware.rate_curve``). On a CPU host
the ranks share memory bandwidth and the kernel's page-fault path, so a rank computes slower while
its peers compute too: N copies of that tile run at once (independent processes, no messages)
give the rate a rank keeps on a busy node, and plan scales every multi-rank run's rate by its
ratio to the lone tile run's (``Hardware.crowded_rate``).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..data.batch import N_GEOMETRY_CHANNELS, VariableSpec
from ..data.samples import MemorySource, TrainData
from ..data.times import N_TIME_FEATURES
from ..distributed.mesh import DomainMesh
from ..distributed.tiles import TileGrid
from ..sphere import grid_latitudes
from ..training.accounting import PARTS

__all__ = [
    "Run",
    "forward_work",
    "link_rate",
    "run_scaling",
    "scaling_runs",
    "scaling_worker",
    "summarize_run",
    "tile_grid",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Run:
    """One configuration: ``mesh`` (data, lat, lon) of ``world`` processes, ``threads`` each."""

    name: str
    kind: str  # serial, threads, jigsaw, ddp, jigsaw_ddp
    mesh: tuple[int, int, int]
    threads: int

    @property
    def world(self) -> int:
        return self.mesh[0] * self.mesh[1] * self.mesh[2]


def scaling_runs(n: int) -> list[Run]:
    """The runs of ``bench scaling --world-size n`` (see the module docstring)."""
    runs = [
        Run("1 rank, 1 thread", "serial", (1, 1, 1), 1),
        Run(f"1 rank, {n} threads", "threads", (1, 1, 1), n),
    ]
    for data in range(1, n + 1):
        if n % data:
            continue
        rest = n // data
        for lat in range(1, rest + 1):
            if rest % lat:
                continue
            lon = rest // lat
            if data == 1:
                runs.append(Run(f"jigsaw {lat}x{lon}", "jigsaw", (1, lat, lon), 1))
            elif rest == 1:
                runs.append(Run(f"DDP x{n}", "ddp", (n, 1, 1), 1))
            else:
                runs.append(Run(f"jigsaw {lat}x{lon} x DDP {data}", "jigsaw_ddp", (data, lat, lon), 1))
    return runs


def tile_grid(grid: tuple[int, int], n: int) -> tuple[int, int]:
    """A grid of about one ``n``-th of ``grid``'s cells (longitudes divided first): the size of
    the problem one rank of ``n`` has."""
    lat, lon = grid
    for k in range(n, 0, -1):
        if n % k == 0 and lon % k == 0 and lat % (n // k) == 0:
            return lat // (n // k), lon // k
    return lat, max(1, lon // n)


TILE_RUN = Run("1 rank, 1 thread, a 1/N tile", "tile", (1, 1, 1), 1)
CROWD_RUN = Run("N copies of the tile run at once", "crowd", (1, 1, 1), 1)


def memory_data(raw: dict[str, Any], mesh: DomainMesh, grid: tuple[int, int], times: int) -> TrainData:
    """Random fields of the config's variables on ``grid``: this rank's ``TrainData``."""
    d = raw["data"]
    spec = VariableSpec(tuple(d["upper_air"]), tuple(d["levels"]), tuple(d["surface"]), tuple(d["static"]))
    gen = np.random.default_rng(0)
    n_lat, n_lon = grid
    fields = gen.standard_normal((times, spec.n_channels, n_lat, n_lon), dtype=np.float32)
    n_static = len(spec.static) + N_GEOMETRY_CHANNELS
    static = gen.standard_normal((n_static, n_lat, n_lon), dtype=np.float32)
    stamps = np.datetime64(d["train_period"][0], "h") + np.arange(times) * d["step_hours"]
    tiles = TileGrid(n_lat, n_lon, mesh.shape.lat, mesh.shape.lon)
    source = MemorySource(
        fields,
        static,
        stamps,
        grid_latitudes(n_lat),
        list(spec.channels),
        [f"static{i}" for i in range(n_static)],
        tiles.tile_of(mesh.domain.index),
    )
    t = raw["training"]
    return TrainData(
        source,
        mesh,
        tiles,
        mean=np.zeros(spec.n_channels, np.float32),
        std=np.ones(spec.n_channels, np.float32),
        global_batch=t["batch_size"],
        seed=raw["run"]["seed"],
        step_hours=d["step_hours"],
        train_period=d["train_period"],
        val_period=d["val_period"],
        rollout_steps=t["rollout_steps"],
    )


def comm_thread_cpu() -> float:
    """CPU seconds of this process's communication threads so far (gloo's transport loop, NCCL's
    proxy): they run beside the compute thread and take cores from it. 0 where /proc is absent."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return 0.0
    for tid in tids:
        try:
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            if name.startswith(("gloo", "nccl")):
                fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            continue
    return total


def scaling_worker(mesh: DomainMesh, raw: dict, grid: list[int], warmup: int, steps: int) -> dict:
    """On every rank of one run: ``warmup`` + ``steps`` training steps; the measured steps' metrics
    and the CPU time of the communication threads over them."""
    from ..config import parse_config
    from ..training.loop import Trainer

    cfg = parse_config(raw)
    times = 2 * cfg.training.batch_size + cfg.training.rollout_steps + 4
    data = memory_data(raw, mesh, tuple(grid), times)
    trainer = Trainer(cfg, mesh, data=data, new_run=True)
    rows = []
    comm_cpu = 0.0
    for s in range(1, warmup + steps + 1):
        if s == warmup + 1:
            comm_cpu = comm_thread_cpu()
        c0 = time.process_time()
        m = trainer.train_step(s)
        m["cpu_s"] = time.process_time() - c0
        trainer.step = s
        if s > warmup:
            rows.append({k: v for k, v in m.items() if k.endswith("_s") or k in ("loss", "tflops")})
    comm_cpu = (comm_thread_cpu() - comm_cpu) / steps
    threads = torch.get_num_threads()
    return {"steps": rows, "flops": trainer.flops, "comm_thread_cpu_s": comm_cpu, "threads": threads}


def config_for(base: dict, run: Run, run_dir: str, warmup: int, steps: int) -> dict:
    """``base`` (the parsed config as a mapping) set up for ``run``: mesh, a scratch run dir, no
    checkpoints, validation, progress bar or wandb; the training period the random data covers."""
    raw = json.loads(json.dumps(base))
    raw["mesh"] = dict(zip(("data", "lat", "lon"), run.mesh))
    raw["run"]["dir"] = run_dir
    raw["training"]["steps"] = warmup + steps
    raw["checkpoint"].update(every=0, resume="never")
    raw["validation"]["every"] = 0
    raw["logging"].update(progress=False, every=max(1, warmup + steps))
    raw["logging"]["wandb"]["mode"] = "disabled"
    hours = raw["data"]["step_hours"]
    t0 = np.datetime64(raw["data"]["train_period"][0], "h")
    times = 2 * raw["training"]["batch_size"] + raw["training"]["rollout_steps"] + 4
    end = t0 + np.timedelta64((times - 1) * hours, "h")
    raw["data"]["train_period"] = [str(t0), str(end)]
    raw["data"]["val_period"] = [str(t0), str(end)]
    return raw


def _launch(
    run: Run, raw: dict, grid: tuple[int, int], warmup: int, steps: int, timeout_s: float, copies: int = 1
) -> list:
    """One run as its own processes; every rank's result. ``copies`` > 1 starts that many
    independent copies of a one-rank run at once (``CROWD_RUN``) and returns each one's result."""
    with tempfile.TemporaryDirectory(prefix="jigsaw-scaling-") as tmp:
        env = {**os.environ, "OMP_NUM_THREADS": str(run.threads), "MKL_NUM_THREADS": str(run.threads)}
        procs = []
        for i in range(copies):
            spec = {"run": asdict(run), "config": config_for(raw, run, f"{tmp}/run{i}", warmup, steps),
                    "grid": list(grid), "warmup": warmup, "steps": steps}  # fmt: skip
            Path(tmp, f"spec{i}.json").write_text(json.dumps(spec))
            cmd = [sys.executable, "-m", "jigsaw_earth.bench.scaling_run", f"{tmp}/spec{i}.json",
                   f"{tmp}/out{i}.json"]  # fmt: skip
            quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "text": True}
            procs.append(subprocess.Popen(cmd, env=env, **quiet))
        results = []
        for proc in procs:
            try:
                _, err = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                for p in procs:
                    p.kill()
                raise RuntimeError(f"bench scaling: run {run.name!r} took over {timeout_s:g} s") from None
            if proc.returncode != 0:
                tail = "\n".join(err.strip().splitlines()[-15:])
                why = f"failed (exit {proc.returncode})"
                raise RuntimeError(f"bench scaling: run {run.name!r} {why}:\n{tail}")
        for i in range(copies):
            results.extend(json.loads(Path(tmp, f"out{i}.json").read_text()))
        return results


def _rate(summary: dict) -> float:
    """A run's GEMM rate, TFLOP/s: its declared FLOPs over its compute time."""
    return summary["flops"] / summary["compute_s"] / 1e12


def summarize_run(ranks: list[dict], global_batch: int) -> dict[str, float]:
    """One launch: median over its steps of the slowest rank's step; rank-mean parts; CPU summed
    over ranks (a duplicated piece of work shows there even on a loaded machine)."""
    n = len(ranks[0]["steps"])
    step = [max(r["steps"][i]["step_time_s"] for r in ranks) for i in range(n)]
    cpu = [sum(r["steps"][i]["cpu_s"] for r in ranks) for i in range(n)]
    out = {"step_s": statistics.median(step), "cpu_s": statistics.median(cpu)}
    out["comm_thread_cpu_s"] = sum(r.get("comm_thread_cpu_s", 0.0) for r in ranks)
    out["samples_per_s"] = global_batch / out["step_s"]
    for part in (*PARTS, "unaccounted"):
        per_rank = [statistics.median(s[f"{part}_s"] for s in r["steps"]) for r in ranks]
        out[f"{part}_s"] = statistics.mean(per_rank)
    out["comm_max_s"] = max(statistics.median(s["comm_s"] for s in r["steps"]) for r in ranks)
    out["tflops"] = statistics.median(s["tflops"] for s in ranks[0]["steps"])
    out["flops"] = ranks[0]["flops"]
    return out


def link_worker(mesh: DomainMesh, nbytes: int, repeats: int) -> float:
    """Bytes/s one rank sends while receiving as much (two ranks, both directions at once), through
    the distributed core's transport (shared memory or gloo, as training's messages)."""
    import torch.distributed as dist

    from ..distributed.comm import exchange

    buf, axis = torch.ones(nbytes // 4), mesh.axis("lon")
    times = []
    for _ in range(repeats + 1):
        dist.barrier()
        t0 = time.perf_counter()
        exchange(
            axis,
            [(axis.peer(1), buf)],
            [(axis.peer(-1), buf.shape)],
            op="bench.link",
            dtype=buf.dtype,
            device=buf.device,
        ).wait()
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times[1:])


def link_rate(nbytes: int = 8 << 20, repeats: int = 7) -> float:
    """The measured rate between two local processes, bytes/s (``link_worker``)."""
    from ..distributed.mesh import MeshShape
    from ..distributed.spawn import spawn

    return min(spawn(MeshShape(1, 1, 2), link_worker, nbytes, repeats))


def _plan(raw: dict, grid: tuple[int, int], mesh: tuple[int, int, int], hw: Any) -> Any:
    """``plan_mesh`` of the config's model and batch on ``grid`` and ``mesh`` with ``hw``."""
    from ..distributed.mesh import MeshShape
    from ..models.plan import plan_mesh

    m, d = raw["model"], raw["data"]
    spec = VariableSpec(tuple(d["upper_air"]), tuple(d["levels"]), tuple(d["surface"]), tuple(d["static"]))
    chans = (spec.n_channels, len(spec.static) + N_GEOMETRY_CHANNELS, N_TIME_FEATURES)
    batch = raw["training"]["batch_size"] // mesh[0]
    elsize = 2 if raw["training"]["precision"] == "bf16" else 4
    shape = MeshShape(*mesh)
    return plan_mesh(m["name"], m["preset"], grid, shape, chans, hw, batch, elsize, **m["overrides"])


def forward_work(raw: dict, grid: tuple[int, int]) -> float:
    """Forward TFLOP per sample of the config's model on one rank of ``grid`` (``rate_curve``'s x)."""
    from ..models.plan import Hardware

    return _plan(raw, grid, (1, 1, 1), Hardware()).work_tflop


def predicted(
    raw: dict,
    run: Run,
    grid: tuple[int, int],
    gemm_tflops: float,
    link_bps: float,
    rate_curve: tuple[tuple[float, float], ...] = (),
    crowded_rate: float = 1.0,
) -> dict:
    """``plan``'s step for ``run`` on this machine's measured rates (one thread per rank)."""
    from ..models.plan import Hardware

    shared_memory = raw["distributed"].get("transport", "auto") == "auto"  # the copying thread computes too
    hw = Hardware(tflops=gemm_tflops, efficiency=1.0, intra_gbps=link_bps * 8 / 1e9, link_efficiency=1.0,
                  gpus_per_node=max(2, run.world), overlap=not shared_memory,
                  rate_curve=rate_curve, crowded_rate=crowded_rate)  # fmt: skip
    p = _plan(raw, grid, run.mesh, hw)
    return {"step_s": p.step_s, "compute_s": p.compute_s, "exposed_s": p.exposed_s, "error": p.error,
            "rate_tflops": p.rate_tflops or gemm_tflops}  # fmt: skip


def run_scaling(
    raw: dict, n: int, grid: tuple[int, int], repeats: int, warmup: int, steps: int, timeout_s: float = 1800.0
) -> dict:
    """Every run of ``scaling_runs(n)``, interleaved over ``repeats``; speedups per repeat."""
    runs = scaling_runs(n)
    batch = raw["training"]["batch_size"]
    bad = [r.name for r in runs if batch % r.mesh[0]]
    if bad:
        raise ValueError(
            f"training.batch_size={batch} does not split over {', '.join(bad)}; use a multiple of {n}"
        )
    small = tile_grid(grid, n)
    got: dict[str, list[dict]] = {r.name: [] for r in [*runs, TILE_RUN]}
    crowd: list[float] = []  # per repeat: the copies' mean GEMM rate, TFLOP/s
    order = [*runs, TILE_RUN, CROWD_RUN]
    for k in range(repeats):
        for run in order if k % 2 == 0 else order[::-1]:
            log.info("bench scaling: repeat %d/%d, %s", k + 1, repeats, run.name)
            if run is CROWD_RUN:
                copies = _launch(run, raw, small, warmup, steps, timeout_s, n)
                crowd.append(statistics.mean(_rate(summarize_run([r], batch)) for r in copies))
                continue
            at = small if run is TILE_RUN else grid
            got[run.name].append(summarize_run(_launch(run, raw, at, warmup, steps, timeout_s), batch))
    link = link_rate()
    base = got[runs[0].name]
    serial = statistics.median(_rate(r) for r in base)  # the GEMM rate
    tile = statistics.median(_rate(r) for r in got[TILE_RUN.name])
    crowded = min(1.0, statistics.median(crowd) / tile)
    curve = ((forward_work(raw, grid), serial), (forward_work(raw, small), tile))
    rows = []
    for run in runs:
        reps = got[run.name]
        speedups = [r["samples_per_s"] / b["samples_per_s"] for r, b in zip(reps, base)]
        row = {"name": run.name, "kind": run.kind, "mesh": "x".join(map(str, run.mesh)),
               "threads": run.threads, "processes": run.world, "speedup": statistics.median(speedups),
               "speedup_range": [min(speedups), max(speedups)], "repeats": reps}  # fmt: skip
        row.update({key: statistics.median(r[key] for r in reps) for key in reps[0]})
        row["efficiency"] = row["speedup"] / n
        priced = run.kind != "threads"
        row["plan"] = predicted(raw, run, grid, serial, link, curve, crowded) if priced else None
        rows.append(row)
    return {"world_size": n, "grid": list(grid), "global_batch": batch, "link_bytes_per_s": link,
            "gemm_tflops": serial, "tile_grid": list(small), "tile_gemm_tflops": tile,
            "crowded_gemm_tflops": statistics.median(crowd), "crowded_rate": crowded,
            "rate_curve": [list(p) for p in curve], "overlap": raw["distributed"]["overlap"],
            "warmup": warmup, "steps": steps, "rows": rows}  # fmt: skip
