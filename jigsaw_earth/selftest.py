"""``jigsaw-earth selftest``: is this machine ready? The first thing to run on a new node or cluster.

It prints the versions (Python, torch, CUDA, NCCL, zarr, xarray, numpy), the devices and their
measured matrix-product rate, then runs a tiny forecaster end to end in a temporary directory (a
synthetic store, training with validation and checkpoints, a resume, ``predict --score``) on the
device asked for and the same steps on one CPU process, and compares them. ``--nproc N``: N
processes on the squarest ``lat × lon`` mesh (or ``--mesh``), one GPU each with NCCL, or ranks sharing
the GPUs with their messages staged through host memory when they outnumber them
(``distributed/transport.py``), gloo and shared memory on CPU; each rank's transport is printed.
Several ranks run three models, so every kind of exchange crosses the ranks on uneven tiles (13 ×
28 points): the WeatherMixer (patch embedding, token mixing's weight ring and activation exchange),
a UNet (convolutions, down- and up-sampling, group norm: halos) and a ViT with local attention
(patch embedding and attention windows across tile edges). Compared, per model:

* the training losses of every step and the validation RMSE;
* a resume from the device's mid-run checkpoint on the CPU (a checkpoint moves between devices and
  meshes and continues the same run);
* ``predict --score`` from the device's final checkpoint, on the device and on the CPU: the scores
  and the forecast fields.

The run passes when every difference is within its tolerance (float32 rounding of a different
device and reduction order; 0 for the same device and mesh).
"""

from __future__ import annotations

import copy
import importlib.metadata
import logging
import platform
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .device import device_count, device_name, resolve_device, synchronize
from .distributed.mesh import MeshShape

__all__ = [
    "MODELS",
    "Check",
    "default_models",
    "gemm_rate",
    "run_selftest",
    "tiny_config",
    "tiny_store",
    "versions",
]

log = logging.getLogger(__name__)

STEPS, CHECKPOINT_AT = 8, 4
GRID = (13, 28)  # 7 / 6 rows on two latitude ranks; 7-column tiles on four longitude ranks cut patches
# the variables of the synthetic store: z and t at 2 levels, t2m
FIELDS: dict[str, tuple] = {
    "upper_air": ("geopotential", "temperature"),
    "levels": (500, 850),
    "surface": ("2m_temperature",),
}
# the models of the comparison (tiny presets) and what they send across tile edges
MODELS: dict[str, dict[str, Any]] = {
    "weathermixer": {"patch": 2, "embed_dim": 32},  # patch embedding, token mixing's ring / exchange
    "unet": {},  # convolutions, strided down-sampling, transposed up-sampling, group norm
    "vit": {"patch": 2},  # patch embedding, local attention windows (every second block)
}
# relative differences allowed between a device and the CPU (float32 rounding, other kernel orders)
TOLERANCE = {"losses": 1e-4, "validation": 1e-4, "resume": 1e-4, "scores": 1e-4, "fields": 1e-4}


@dataclass(frozen=True)
class Check:
    """One comparison: what, the figure on the device and on the CPU, their relative difference."""

    name: str
    device: str
    cpu: str
    difference: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return bool(np.isfinite(self.difference)) and self.difference <= self.tolerance


def versions() -> dict[str, str]:
    """The versions that decide whether a run works: Python, torch and its CUDA/NCCL, the data stack."""
    out = {"python": platform.python_version(), "torch": torch.__version__}
    out["cuda"] = torch.version.cuda or "none (CPU build)"
    if torch.cuda.is_available():
        try:
            out["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except (AttributeError, RuntimeError):
            out["nccl"] = "unavailable"
    for package in ("zarr", "xarray", "numpy", "dask"):
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            out[package] = "missing"
    return out


def gemm_rate(device: torch.device, dtype: torch.dtype, n: int | None = None, repeats: int = 5) -> float:
    """Measured TFLOP/s of an ``n × n × n`` matrix product (the median of ``repeats`` after a warm-up)."""
    n = n or (8192 if device.type == "cuda" else 512)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    times = []
    for k in range(repeats + 1):
        synchronize(device)
        t0 = time.perf_counter()
        a @ b
        synchronize(device)
        if k:
            times.append(time.perf_counter() - t0)
    return 2 * n**3 / sorted(times)[len(times) // 2] / 1e12


def tiny_store(path: Path) -> None:
    """The synthetic store of the comparison: 13 × 28 points, 16 days, z and t at 2 levels, t2m."""
    from .data.synth import SynthConfig, synth_store

    synth_store(
        path, SynthConfig(n_lat=GRID[0], n_lon=GRID[1], start="2020-01-01", end="2020-01-16", **FIELDS)
    )


def default_models(nproc: int) -> tuple[str, ...]:
    """The WeatherMixer on one process; every model of ``MODELS`` on several (each kind of exchange)."""
    return ("weathermixer",) if nproc == 1 else tuple(MODELS)


def tiny_config(
    root: Path, run: str, device: str, nproc: int, model: str = "weathermixer", mesh: MeshShape | None = None
) -> dict[str, Any]:
    """The run of the comparison: a small ``model`` on ``tiny_store``, on ``mesh`` (default 1 × ``nproc``)."""
    mesh = mesh or MeshShape(1, 1, nproc)
    return {
        "run": {"dir": str(root / run), "seed": 5, "name": f"selftest-{run}"},
        "mesh": {"data": mesh.data, "ensemble": mesh.ensemble, "lat": mesh.lat, "lon": mesh.lon},
        "data": {
            "store": str(root / "data.zarr"),
            **{name: list(values) for name, values in FIELDS.items()},
            "train_period": ["2020-01-01", "2020-01-10"],
            "val_period": ["2020-01-11", "2020-01-14"],
            "read_threads": 1,
        },
        "model": {"name": model, "preset": "tiny", "overrides": dict(MODELS[model])},
        "optim": {"lr": 3e-3, "warmup_steps": 2},
        "training": {"steps": STEPS, "batch_size": 2},
        "validation": {"lead_hours": [6, 12], "max_samples": 4, "batch_size": 2,
                       "variables": ["geopotential@500", "temperature@850", "2m_temperature"]},
        "checkpoint": {"every": CHECKPOINT_AT, "keep": 4, "resume": "auto"},
        "logging": {"every": 1, "progress": False, "wandb": {"mode": "disabled"}},
        "distributed": {"device": device},
    }  # fmt: skip


def _train(mesh: Any, raw: dict[str, Any], on_mesh: bool = False) -> dict[str, Any]:
    """Train ``raw`` on this process's rank (on ``mesh`` when ``on_mesh``, else on the config's own);
    rank 0's losses per step and validation."""
    from .config import parse_config
    from .mesh_setup import setup_mesh
    from .training.loop import Trainer

    cfg = parse_config(raw)
    trainer = Trainer(cfg, mesh if on_mesh else setup_mesh(cfg))
    summary = trainer.fit()
    return {
        "steps": [int(h["step"]) for h in trainer.history],
        "losses": [float(h["loss"]) for h in trainer.history],
        "validation": {k: float(v) for k, v in summary["validation"].items()},
    }


def _predict(mesh: Any, raw: dict[str, Any], out: str, on_mesh: bool = False) -> dict[str, Any]:
    """``predict --score`` of ``raw``'s run into ``out`` (on ``mesh`` when ``on_mesh``): rank 0's score
    rows."""
    from .config import parse_config
    from .inference.predict import PredictRequest, run_prediction
    from .inference.scoring import ScoreRequest

    request = PredictRequest(out=out, first_init="2020-01-11", last_init="2020-01-13", steps=2, max_inits=3,
                             score=ScoreRequest(), overwrite=True)  # fmt: skip
    result = run_prediction(parse_config(raw), request, mesh if on_mesh else None)
    return {"rows": [_json_row(r) for r in result.rows]}


def _json_row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (float(v) if isinstance(v, (float, np.floating)) else str(v)) for k, v in row.items()}


def _on(device: str, world_size: int, fn: Any, *args: Any) -> list[dict[str, Any]]:
    """``fn`` on ``world_size`` processes of ``device`` (this process when 1); every rank's result."""
    from .distributed.spawn import spawn

    return spawn(MeshShape(1, 1, world_size), fn, *args, device=device)


def _device_runs(mesh: Any, raws: dict[str, dict[str, Any]], root: str) -> dict[str, Any]:
    """Each model of ``raws`` trained, then forecast with ``predict --score`` into
    ``root/forecast-device-MODEL.zarr``, on one mesh of the configs' shape and device; and this rank's
    transport."""
    from .config import parse_config
    from .mesh_setup import setup_mesh

    mesh = setup_mesh(parse_config(next(iter(raws.values()))))
    out: dict[str, Any] = {"transport": mesh.transport}
    for name, raw in raws.items():
        out[name] = _train(mesh, raw, on_mesh=True)
        out[name].update(_predict(mesh, raw, str(Path(root) / f"forecast-device-{name}.zarr"), on_mesh=True))
    return out


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("inf")
    scale = np.maximum(np.abs(b), 1e-12)
    return float(np.max(np.abs(a - b) / scale)) if a.size else 0.0


def _fields(path: Path) -> np.ndarray:
    import xarray as xr

    with xr.open_zarr(path) as ds:
        return np.concatenate([ds[v].values.ravel() for v in sorted(ds.data_vars)])


def _score_values(rows: list[dict[str, Any]]) -> np.ndarray:
    keys = sorted(rows[0]) if rows else []
    ordered = sorted(rows, key=lambda r: tuple(str(r[k]) for k in keys if k != "value"))
    return np.array([r["value"] for r in ordered], np.float64)


def compare_runs(
    device: str, nproc: int, root: Path, mesh: MeshShape | None = None, models: tuple[str, ...] | None = None
) -> tuple[list[Check], list[str]]:
    """The end-to-end comparison (see the module docstring) in ``root`` on ``mesh`` (default: 1 ×
    ``nproc``): one ``Check`` per row, and how each rank's messages travelled."""
    mesh = mesh or MeshShape(1, 1, nproc)
    models = models or default_models(mesh.world_size)
    tiny_store(root / "data.zarr")
    raws = {m: tiny_config(root, f"device-{m}", device, mesh.world_size, m, mesh) for m in models}
    ranks = _on(device, mesh.world_size, _device_runs, raws, str(root))
    checks = [c for m in models for c in _compare_model(m, ranks[0][m], raws[m], root)]
    return checks, [r["transport"] for r in ranks]


def _compare_model(name: str, a: dict[str, Any], on_device: dict[str, Any], root: Path) -> list[Check]:
    """``name``'s device run ``a`` against the same steps on one CPU process: training, validation, a
    resume on the CPU from the device's checkpoint (another device and mesh), ``predict --score``."""
    b = _on("cpu", 1, _train, tiny_config(root, f"cpu-{name}", "cpu", 1, name))[0]
    checks = [_check(f"{name}: train: loss of steps 1-{STEPS}", "losses", a["losses"], b["losses"])]
    keys = sorted(k for k in b["validation"] if k != "n_inits")
    checks.append(_check(f"{name}: validation RMSE / ACC", "validation", [a["validation"][k] for k in keys],
                         [b["validation"][k] for k in keys]))  # fmt: skip

    # the device's checkpoint of step CHECKPOINT_AT continues on the CPU (another device, one rank)
    resume = tiny_config(root, f"resumed-{name}", "cpu", 1, name)
    resume["checkpoint"]["resume"] = str(
        Path(on_device["run"]["dir"]) / "checkpoints" / f"step_{CHECKPOINT_AT:09d}"
    )
    c = _on("cpu", 1, _train, resume)[0]
    later = dict(zip(a["steps"], a["losses"]))
    checks.append(_check(f"{name}: resume on CPU from the device's step {CHECKPOINT_AT}", "resume",
                         c["losses"], [later[s] for s in c["steps"]]))  # fmt: skip

    scored_cpu = copy.deepcopy(on_device)
    scored_cpu["mesh"] = {"data": 1, "ensemble": 1, "lat": 1, "lon": 1}
    scored_cpu["distributed"]["device"] = "cpu"
    e = _on("cpu", 1, _predict, scored_cpu, str(root / f"forecast-cpu-{name}.zarr"))[0]
    checks.append(_check(f"{name}: predict --score: scores", "scores", _score_values(a["rows"]),
                         _score_values(e["rows"])))  # fmt: skip
    checks.append(_check(f"{name}: predict: forecast fields", "fields",
                         _fields(root / f"forecast-device-{name}.zarr"),
                         _fields(root / f"forecast-cpu-{name}.zarr")))  # fmt: skip
    return checks


def _check(name: str, kind: str, on_device: Any, on_cpu: Any) -> Check:
    a, b = np.asarray(on_device, np.float64), np.asarray(on_cpu, np.float64)
    return Check(name, _brief(a), _brief(b), _relative(a, b), TOLERANCE[kind])


def _brief(x: np.ndarray) -> str:
    if x.size == 0:
        return "-"
    return f"{x.ravel()[-1]:.6g}" if x.size < 4 else f"{x.size} values, last {x.ravel()[-1]:.6g}"


def run_selftest(
    device: str = "auto",
    nproc: int = 1,
    workdir: str | None = None,
    mesh: MeshShape | None = None,
    models: tuple[str, ...] | None = None,
) -> tuple[list[str], bool]:
    """Everything ``selftest`` prints, and whether every check passed. ``mesh``: the device runs'
    (default ``MeshShape.squarest(nproc)``); ``models``: default ``default_models``."""
    mesh = mesh or MeshShape.squarest(nproc)
    dev = resolve_device(device)
    lines = ["versions: " + ", ".join(f"{k} {v}" for k, v in versions().items())]
    rates = []
    dtypes = (torch.bfloat16, torch.float32) if dev.type == "cuda" else (torch.float32,)
    for dtype in dtypes:
        rates.append(f"{str(dtype).removeprefix('torch.')} {gemm_rate(dev, dtype):.3g} TFLOP/s")
    count = max(1, device_count(dev.type))
    lines.append(f"device: {dev} ({device_name(dev)}), {count} visible; matrix product: {', '.join(rates)}")
    with tempfile.TemporaryDirectory(prefix="jigsaw-selftest-", dir=workdir) as tmp:
        t0 = time.perf_counter()
        package = logging.getLogger("jigsaw_earth")
        level = package.level
        if not log.isEnabledFor(logging.DEBUG):  # the runs' own progress lines would bury the table
            package.setLevel(logging.ERROR)
        try:
            runs_on = str(dev.type if mesh.world_size > 1 else dev)
            checks, transports = compare_runs(runs_on, mesh.world_size, Path(tmp), mesh, models)
        finally:
            package.setLevel(level)
        took = time.perf_counter() - t0
    lines += _transport_lines(transports)
    head = f"{'check':<56} {'device':>24} {'cpu':>24} {'rel. diff':>10} {'allowed':>8}  verdict"
    lines += [head, "-" * len(head)]
    for c in checks:
        lines.append(f"{c.name:<56} {c.device:>24} {c.cpu:>24} {c.difference:>10.2e} {c.tolerance:>8.0e}  "
                     f"{'PASS' if c.ok else 'FAIL'}")  # fmt: skip
    ok = all(c.ok for c in checks)
    shape = f"{mesh.lat}x{mesh.lon}" if mesh.replicas == 1 else str(mesh)
    ranks = f"mesh {shape}, {mesh.world_size} process{'es' if mesh.world_size > 1 else ''}"
    lines.append(f"{'PASS' if ok else 'FAIL'}: {dev.type} ({ranks}) against one CPU process, {took:.0f} s")
    return lines, ok


def _transport_lines(transports: list[str]) -> list[str]:
    """How each rank's messages travelled (one line per rank; none for a single process)."""
    if len(transports) < 2:
        return []
    return [f"rank {r}: {t}" for r, t in enumerate(transports)]
