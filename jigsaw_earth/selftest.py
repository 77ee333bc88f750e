"""``jigsaw-earth selftest``: is this machine ready? The first thing to run on a new node or cluster.

It prints the versions (Python, torch, CUDA, NCCL, zarr, xarray, numpy), the devices and their
measured matrix-product rate, then runs a tiny forecaster end to end in a temporary directory (a
synthetic store, training with validation and checkpoints, a resume, ``predict --score``) on the
device asked for (``--nproc N``: N processes, mesh 1 × N, NCCL between GPUs, gloo on CPU) and the
same steps on one CPU process, and compares them:

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

from .device import device_name, resolve_device, synchronize

__all__ = ["Check", "gemm_rate", "run_selftest", "tiny_config", "tiny_store", "versions"]

log = logging.getLogger(__name__)

STEPS, CHECKPOINT_AT = 8, 4
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
    """The synthetic store of the comparison: 12 × 24 points, 16 days, z and t at 2 levels, t2m."""
    from .data.synth import SynthConfig, synth_store

    fields = dict(levels=(500, 850), upper_air=("geopotential", "temperature"), surface=("2m_temperature",))
    synth_store(path, SynthConfig(n_lat=12, n_lon=24, start="2020-01-01", end="2020-01-16", **fields))


def tiny_config(root: Path, run: str, device: str, nproc: int) -> dict[str, Any]:
    """The run of the comparison: a small WeatherMixer on ``tiny_store``, mesh 1 × ``nproc``."""
    return {
        "run": {"dir": str(root / run), "seed": 5, "name": f"selftest-{run}"},
        "mesh": {"data": 1, "lat": 1, "lon": nproc},
        "data": {
            "store": str(root / "data.zarr"),
            "upper_air": ["geopotential", "temperature"],
            "levels": [500, 850],
            "surface": ["2m_temperature"],
            "train_period": ["2020-01-01", "2020-01-10"],
            "val_period": ["2020-01-11", "2020-01-14"],
            "read_threads": 1,
        },
        "model": {"name": "weathermixer", "preset": "tiny", "overrides": {"patch": 2, "embed_dim": 32}},
        "optim": {"lr": 3e-3, "warmup_steps": 2},
        "training": {"steps": STEPS, "batch_size": 2},
        "validation": {"lead_hours": [6, 12], "max_samples": 4, "batch_size": 2,
                       "variables": ["geopotential@500", "temperature@850", "2m_temperature"]},
        "checkpoint": {"every": CHECKPOINT_AT, "keep": 4, "resume": "auto"},
        "logging": {"every": 1, "progress": False, "wandb": {"mode": "disabled"}},
        "distributed": {"device": device},
    }  # fmt: skip


def _train(mesh: Any, raw: dict[str, Any]) -> dict[str, Any]:
    """Train ``raw`` on this process's rank; rank 0's losses per step and validation."""
    from .config import parse_config
    from .launch import setup_mesh
    from .training.loop import Trainer

    cfg = parse_config(raw)
    mesh = setup_mesh(cfg)
    trainer = Trainer(cfg, mesh)
    summary = trainer.fit()
    return {
        "steps": [int(h["step"]) for h in trainer.history],
        "losses": [float(h["loss"]) for h in trainer.history],
        "validation": {k: float(v) for k, v in summary["validation"].items()},
    }


def _predict(mesh: Any, raw: dict[str, Any], out: str) -> dict[str, Any]:
    """``predict --score`` of ``raw``'s run into ``out``: rank 0's score rows."""
    from .config import parse_config
    from .inference.predict import run_prediction
    from .inference.scoring import ScoreRequest

    cfg = parse_config(raw)
    result = run_prediction(cfg, out, start="2020-01-11", end="2020-01-13", steps=2, max_inits=3,
                            score=ScoreRequest(), overwrite=True)  # fmt: skip
    return {"rows": [_json_row(r) for r in result.rows]}


def _json_row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (float(v) if isinstance(v, (float, np.floating)) else str(v)) for k, v in row.items()}


def _on(device: str, nproc: int, fn: Any, *args: Any) -> dict[str, Any]:
    """``fn`` on ``nproc`` processes of ``device`` (this process when 1); rank 0's result."""
    from .distributed.mesh import MeshShape
    from .distributed.spawn import spawn

    return spawn(MeshShape(1, 1, nproc), fn, *args, device=device)[0]


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


def compare_runs(device: str, nproc: int, root: Path) -> list[Check]:
    """The end-to-end comparison (see the module docstring) in ``root``; one ``Check`` per row."""
    tiny_store(root / "data.zarr")
    on_device = tiny_config(root, "device", device, nproc)
    on_cpu = tiny_config(root, "cpu", "cpu", 1)
    a = _on(device, nproc, _train, on_device)
    b = _on("cpu", 1, _train, on_cpu)
    checks = [_check(f"train: loss of steps 1-{STEPS}", "losses", a["losses"], b["losses"])]
    keys = sorted(k for k in b["validation"] if k != "n_inits")
    checks.append(_check("validation RMSE / ACC", "validation", [a["validation"][k] for k in keys],
                         [b["validation"][k] for k in keys]))  # fmt: skip

    # the device's checkpoint of step CHECKPOINT_AT continues on the CPU (another device, one rank)
    resume = tiny_config(root, "resumed", "cpu", 1)
    resume["checkpoint"]["resume"] = str(root / "device" / "checkpoints" / f"step_{CHECKPOINT_AT:09d}")
    c = _on("cpu", 1, _train, resume)
    later = dict(zip(a["steps"], a["losses"]))
    checks.append(_check(f"resume on CPU from the device's step {CHECKPOINT_AT}", "resume", c["losses"],
                         [later[s] for s in c["steps"]]))  # fmt: skip

    scored = copy.deepcopy(on_device)
    scored_cpu = copy.deepcopy(on_device)
    scored_cpu["mesh"]["lon"], scored_cpu["distributed"]["device"] = 1, "cpu"
    d = _on(device, nproc, _predict, scored, str(root / "forecast-device.zarr"))
    e = _on("cpu", 1, _predict, scored_cpu, str(root / "forecast-cpu.zarr"))
    scores = _score_values(d["rows"]), _score_values(e["rows"])
    checks.append(_check("predict --score: scores", "scores", *scores))
    checks.append(_check("predict: forecast fields", "fields", _fields(root / "forecast-device.zarr"),
                         _fields(root / "forecast-cpu.zarr")))  # fmt: skip
    return checks


def _check(name: str, kind: str, on_device: Any, on_cpu: Any) -> Check:
    a, b = np.asarray(on_device, np.float64), np.asarray(on_cpu, np.float64)
    return Check(name, _brief(a), _brief(b), _relative(a, b), TOLERANCE[kind])


def _brief(x: np.ndarray) -> str:
    if x.size == 0:
        return "-"
    return f"{x.ravel()[-1]:.6g}" if x.size < 4 else f"{x.size} values, last {x.ravel()[-1]:.6g}"


def run_selftest(device: str = "auto", nproc: int = 1, workdir: str | None = None) -> tuple[list[str], bool]:
    """Everything ``selftest`` prints, and whether every check passed."""
    dev = resolve_device(device)
    lines = ["versions: " + ", ".join(f"{k} {v}" for k, v in versions().items())]
    rates = []
    dtypes = (torch.bfloat16, torch.float32) if dev.type == "cuda" else (torch.float32,)
    for dtype in dtypes:
        rates.append(f"{str(dtype).removeprefix('torch.')} {gemm_rate(dev, dtype):.3g} TFLOP/s")
    count = torch.cuda.device_count() if dev.type == "cuda" else 1
    lines.append(f"device: {dev} ({device_name(dev)}), {count} visible; matrix product: {', '.join(rates)}")
    with tempfile.TemporaryDirectory(prefix="jigsaw-selftest-", dir=workdir) as tmp:
        t0 = time.perf_counter()
        package = logging.getLogger("jigsaw_earth")
        level = package.level
        if not log.isEnabledFor(logging.DEBUG):  # the runs' own progress lines would bury the table
            package.setLevel(logging.ERROR)
        try:
            checks = compare_runs(str(dev.type if nproc > 1 else dev), nproc, Path(tmp))
        finally:
            package.setLevel(level)
        took = time.perf_counter() - t0
    head = f"{'check':<44} {'device':>24} {'cpu':>24} {'rel. diff':>10} {'allowed':>8}  verdict"
    lines += [head, "-" * len(head)]
    for c in checks:
        lines.append(f"{c.name:<44} {c.device:>24} {c.cpu:>24} {c.difference:>10.2e} {c.tolerance:>8.0e}  "
                     f"{'PASS' if c.ok else 'FAIL'}")  # fmt: skip
    ok = all(c.ok for c in checks)
    mesh = f"mesh 1x{nproc}, {nproc} process{'es' if nproc > 1 else ''}"
    lines.append(f"{'PASS' if ok else 'FAIL'}: {dev.type} ({mesh}) against one CPU process, {took:.0f} s")
    return lines, ok
