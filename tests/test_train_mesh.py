"""Mesh invariance of training, checkpoints that resume on another mesh, and the step accounting.

One spawn per mesh. On every mesh the same seed and global batch must give the same 20-step
loss and grad-norm trajectory as one process (within 1e-4 relative). The 2×2 run saves a
checkpoint at step 10; the 1×4 and 1×1 runs also resume from it and must
continue with the 2×2 run's steps 11…20.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import numpy as np
import pytest

from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.training import Trainer

from .train_helpers import tiny_config, tiny_data, tiny_model

MESHES = {"1x1x1": (1, 1, 1), "1x2x2": (1, 2, 2), "1x1x4": (1, 1, 4), "2x1x2": (2, 1, 2)}
RESUME_ON = ("1x1x1", "1x1x4")


def _train(mesh: DomainMesh, run_dir: str, resume: str, sections: dict) -> dict:
    shape = (mesh.shape.data, mesh.shape.lat, mesh.shape.lon)
    cfg = tiny_config(run_dir, shape, checkpoint={"every": 10, "resume": resume, "keep": 3}, **sections)
    data = tiny_data(cfg, mesh)
    trainer = Trainer(cfg, mesh, data=data, model=tiny_model(data, mesh))
    start = trainer.step
    summary = trainer.fit()
    return {
        "start": start,
        "loss": [h["loss"] for h in trainer.history],
        "grad_norm": [h["grad_norm"] for h in trainer.history],
        "val": {k: v for k, v in summary["validation"].items() if k.endswith("/model")},
        "steps": [{k: v for k, v in h.items() if k.endswith("_s") or k == "tflops"} for h in trainer.history],
        "breakdown": summary["step_breakdown"],
    }


def _nan_in_one_tile(mesh: DomainMesh, run_dir: str) -> str:
    """Train with one NaN in the east tile of a sample of replica 1 at step 3: the error."""
    cfg = tiny_config(run_dir, (2, 1, 2), training={"nan_policy": "skip"})
    data = tiny_data(cfg, mesh)
    data.source.fields[int(data.global_indices(2)[2]), 2, 0, -1] = float("nan")
    try:
        Trainer(cfg, mesh, data=data, model=tiny_model(data, mesh)).fit()
    except ValueError as err:
        return str(err)
    return "no error"


def _cases(mesh: DomainMesh, base: str, reference_ckpt: str | None) -> dict:
    name = f"{mesh.shape.data}x{mesh.shape.lat}x{mesh.shape.lon}"
    out = {"fresh": _train(mesh, f"{base}/{name}", "never", {})}
    if reference_ckpt:
        out["resumed"] = _train(mesh, f"{base}/{name}-resumed", reference_ckpt, {})
    if name == "2x1x2":
        out["nan"] = _nan_in_one_tile(mesh, f"{base}/{name}-nan")
    return out


@pytest.fixture(scope="module")
def runs() -> dict:
    with tempfile.TemporaryDirectory(prefix="jigsaw-train-mesh-") as base:
        results = {"1x2x2": spawn(MeshShape(1, 2, 2), _cases, base, None)}
        ckpt = str(Path(base, "1x2x2", "checkpoints", "step_000000010"))
        assert Path(ckpt, "meta.json").is_file(), "the 2x2 run did not write its step-10 checkpoint"
        for name, shape in MESHES.items():
            if name != "1x2x2":
                results[name] = spawn(MeshShape(*shape), _cases, base, ckpt if name in RESUME_ON else None)
        yield results


def _rel(a: list[float], b: list[float]) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12)))


@pytest.mark.parametrize("name", [m for m in MESHES if m != "1x1x1"])
def test_same_trajectory_on_every_mesh(runs: dict, name: str) -> None:
    ref = runs["1x1x1"][0]["fresh"]
    for rank, result in enumerate(runs[name]):
        got = result["fresh"]
        assert len(got["loss"]) == 20
        assert _rel(got["loss"], ref["loss"]) < 1e-4, (name, rank, got["loss"], ref["loss"])
        assert _rel(got["grad_norm"], ref["grad_norm"]) < 1e-4, (name, rank)
        for key, value in ref["val"].items():
            assert abs(got["val"][key] - value) <= 1e-4 * abs(value), (name, key)


def test_loss_decreases(runs: dict) -> None:
    loss = runs["1x1x1"][0]["fresh"]["loss"]
    assert np.mean(loss[-5:]) < 0.8 * np.mean(loss[:3]), loss


@pytest.mark.parametrize("name", RESUME_ON)
def test_resume_on_another_mesh(runs: dict, name: str) -> None:
    """A 2×2 checkpoint (step 10) continues on ``name`` exactly like the 2×2 run did."""
    ref = runs["1x2x2"][0]["fresh"]
    got = runs[name][0]["resumed"]
    assert got["start"] == 10
    assert _rel(got["loss"], ref["loss"][10:]) < 1e-4, (got["loss"], ref["loss"][10:])


def test_nan_in_one_tile_stops_every_rank_naming_it(runs: dict) -> None:
    """Only the rank holding the NaN finds it; every rank stops at that step with its report."""
    errors = {r["nan"] for r in runs["2x1x2"]}
    assert len(errors) == 1, errors
    error = errors.pop()
    assert re.search(r"step [1-3] holds NaN", error) and error.count("rank ") == 1, error
    assert re.search(r"rank \d: .*lon_start=6.*'2m_temperature' \(1 values\)", error), error


def test_report_trajectory_differences(runs: dict, capsys: pytest.CaptureFixture) -> None:
    ref = runs["1x1x1"][0]["fresh"]["loss"]
    with capsys.disabled():
        for name in MESHES:
            diff = max(_rel(r["fresh"]["loss"], ref) for r in runs[name])
            print(f"\nmesh {name}: max relative loss difference vs 1x1x1 over 20 steps = {diff:.2e}")


PARTS = ("compute_s", "comm_s", "data_s", "other_s")


@pytest.mark.parametrize("name", MESHES)
def test_step_parts_sum_to_step_time(runs: dict, name: str) -> None:
    """The measured compute, exposed communication, data wait and other add up to the step time
    within 10 % on every rank (over the run's steps: a step of a few ms here can lose a whole
    scheduler slice of a loaded machine between two phases); ranks of a multi-rank mesh block on
    communication, one rank never."""
    for rank, result in enumerate(runs[name]):
        steps = result["fresh"]["steps"]
        assert len(steps) == 20
        for i, h in enumerate(steps):
            assert min(h[k] for k in PARTS) >= 0, (name, rank, i, h)
            assert h["tflops"] > 0
        parts = sum(h[k] for h in steps for k in PARTS)
        total = sum(h["step_time_s"] for h in steps)
        assert abs(parts - total) <= 0.1 * total, (name, rank, parts, total)
        comm = sum(h["comm_s"] for h in steps)
        assert (comm > 0) if name != "1x1x1" else (comm == 0), (name, rank, comm)
        b = result["fresh"]["breakdown"]
        assert b["steps"] == 19  # the first step is the warm-up
        shares = sum(b[f"{k}_fraction"] for k in ("compute", "comm", "data", "other", "unaccounted"))
        assert abs(shares - 1) < 1e-9
