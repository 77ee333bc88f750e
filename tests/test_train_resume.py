"""Exact resume, a crash during a save, NaN handling and bad configs (one process, seconds)."""

from __future__ import annotations

import json
import math
import os
import signal
import threading
from pathlib import Path

import pytest
import torch

from jigsaw_earth.checkpoint import latest_checkpoint, list_checkpoints
from jigsaw_earth.checkpoint import manager as ckpt_manager
from jigsaw_earth.config import load_config, parse_config
from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.signals import Preempted
from jigsaw_earth.training import NonFiniteLossError, Trainer

from .train_helpers import tiny_config, tiny_data, tiny_model


class Interrupt(Exception):
    pass


def _trainer(run_dir: Path, **sections: dict) -> Trainer:
    mesh = DomainMesh(MeshShape())
    cfg = tiny_config(str(run_dir), (1, 1, 1), **sections)
    data = tiny_data(cfg, mesh)
    return Trainer(cfg, mesh, data=data, model=tiny_model(data, mesh))


def _fit_until(trainer: Trainer, stop_at: int) -> None:
    """Run ``fit`` but die (like a killed job) when step ``stop_at`` starts."""
    original = trainer.train_step

    def step(s: int) -> dict:
        if s == stop_at:
            raise Interrupt(f"simulated crash at step {s}")
        return original(s)

    trainer.train_step = step  # type: ignore[method-assign]
    with pytest.raises(Interrupt):
        trainer.fit()


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    trainer = _trainer(tmp_path_factory.mktemp("clean"))
    trainer.fit()
    return [h["loss"] for h in trainer.history]


def test_exact_resume(tmp_path: Path, clean: list[float]) -> None:
    ckpt = {"every": 5, "resume": "auto", "keep": 2}
    first = _trainer(tmp_path, checkpoint=ckpt)
    _fit_until(first, 13)
    assert [h["loss"] for h in first.history] == clean[:12]
    second = _trainer(tmp_path, checkpoint=ckpt)
    assert second.step == 10
    second.fit()
    resumed = [h["loss"] for h in second.history]
    assert resumed == clean[10:], (resumed, clean[10:])  # bitwise: same mesh, same ops
    assert len(list_checkpoints(tmp_path)) == 2  # keep: 2


def test_training_goes_on_while_a_checkpoint_is_written(
    tmp_path: Path, clean: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step-5 checkpoint's files are held back until step 7 has started: training goes on
    meanwhile, a crash at step 13 still leaves step 10's (the thread finishes it first), and the
    resume from it is bitwise the uninterrupted run."""
    ckpt = {"every": 5, "resume": "auto", "keep": 2}
    first = _trainer(tmp_path, checkpoint=ckpt)
    step_7, waited = threading.Event(), []
    real_save, real_step = ckpt_manager.dcp.save, first.train_step

    def held_save(*args: object, **kwargs: object) -> object:
        if not waited:
            waited.append(step_7.wait(timeout=30))
        return real_save(*args, **kwargs)

    def step(s: int) -> dict:
        if s == 7:
            step_7.set()
        return real_step(s)

    monkeypatch.setattr(ckpt_manager.dcp, "save", held_save)
    first.train_step = step  # type: ignore[method-assign]
    _fit_until(first, 13)
    monkeypatch.undo()
    assert waited == [True], "training waited for the step-5 checkpoint's files"
    assert [h["loss"] for h in first.history] == clean[:12]
    assert latest_checkpoint(tmp_path).name == "step_000000010"
    second = _trainer(tmp_path, checkpoint=ckpt)
    assert second.step == 10
    second.fit()
    assert [h["loss"] for h in second.history] == clean[10:]  # bitwise


def test_stop_signal_completes_the_background_save_before_exit(tmp_path: Path, clean: list[float]) -> None:
    """SIGUSR1 during step 4, whose periodic checkpoint goes to the background thread: ``fit``
    raises ``Preempted`` (exit 75) only once that checkpoint is complete, and it resumes exactly."""
    ckpt = {"every": 2, "resume": "auto", "keep": 2}
    first = _trainer(tmp_path, checkpoint=ckpt)
    real_step = first.train_step

    def step(s: int) -> dict:
        if s == 4:
            os.kill(os.getpid(), signal.SIGUSR1)
        return real_step(s)

    first.train_step = step  # type: ignore[method-assign]
    with pytest.raises(Preempted, match=r"after step 4 of 20; saved .*step_000000004"):
        first.fit()
    assert first.saver.pending_step is None
    assert latest_checkpoint(tmp_path).name == "step_000000004"
    second = _trainer(tmp_path, checkpoint=ckpt)
    assert second.step == 4
    second.fit()
    assert [h["loss"] for h in second.history] == clean[4:]


def test_resume_after_changing_how_data_are_read(tmp_path: Path, clean: list[float]) -> None:
    """data.prefetch and data.read_threads say how, not what, is read (the data-wait warning asks
    for them): a run resumes after either changes, and one written with the old hash (which
    included them) still resumes."""
    from jigsaw_earth.training.rundir import config_hash, resumes

    ckpt = {"every": 5, "resume": "auto", "keep": 2}
    _fit_until(_trainer(tmp_path, checkpoint=ckpt), 8)
    second = _trainer(tmp_path, checkpoint=ckpt, data={"prefetch": 0, "read_threads": 3})
    assert second.step == 5
    second.fit()
    assert [h["loss"] for h in second.history] == clean[5:]
    cfg = second.cfg
    assert resumes(config_hash(cfg, reading=True), cfg) and not resumes("0" * 16, cfg)


def test_crash_during_save_keeps_previous_checkpoint(
    tmp_path: Path, clean: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = {"every": 5, "resume": "auto", "keep": 3}
    trainer = _trainer(tmp_path, checkpoint=ckpt)
    real_save = ckpt_manager.dcp.save
    calls = {"n": 0}

    def dying_save(*args: object, **kwargs: object) -> object:
        calls["n"] += 1
        if calls["n"] == 2:  # the step-10 save dies half-way: some data written, no metadata
            real_save(*args, **kwargs)
            raise Interrupt("simulated crash during the step-10 save")
        return real_save(*args, **kwargs)

    monkeypatch.setattr(ckpt_manager.dcp, "save", dying_save)
    with pytest.raises(Interrupt):
        trainer.fit()
    monkeypatch.undo()
    assert latest_checkpoint(tmp_path).name == "step_000000005"
    # a save that fails with an exception removes its half-written folder (a killed one leaves it,
    # and the next save removes it: tests/test_checkpoint.py)
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "checkpoints").iterdir())
    resumed = _trainer(tmp_path, checkpoint=ckpt)
    assert resumed.step == 5
    resumed.fit()
    assert [h["loss"] for h in resumed.history] == clean[5:]


def test_nan_loss_stops_naming_the_step(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path)
    forward = trainer.model.forward

    def poisoned(state: torch.Tensor, *args: torch.Tensor) -> torch.Tensor:
        out = forward(state, *args)
        return out * float("nan") if trainer.step + 1 == 4 else out

    trainer.model.forward = poisoned  # type: ignore[method-assign]
    with pytest.raises(NonFiniteLossError, match="at step 4"):
        trainer.fit()


def test_nan_loss_skip_policy(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, training={"nan_policy": "skip"})
    forward = trainer.model.forward

    def poisoned(state: torch.Tensor, *args: torch.Tensor) -> torch.Tensor:
        out = forward(state, *args)
        return out * float("nan") if trainer.step + 1 in (4, 7) else out

    trainer.model.forward = poisoned  # type: ignore[method-assign]
    summary = trainer.fit()
    assert summary["skipped_steps"] == 2
    assert math.isfinite(summary["final_loss"])
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_nan_in_the_data_stops_naming_channel_and_time(tmp_path: Path, policy: str) -> None:
    """Training reads skip the NaN pass; a NaN in a sample still stops the run at its step (skip
    policy or not: bad data is no numerical accident), naming the channel and the time."""
    trainer = _trainer(tmp_path, training={"nan_policy": policy})
    data = trainer.data
    t = int(data.global_indices(5)[1])  # an input of step 6; the first step to read it:
    step, role = next(
        (s, "input" if t in inits else "target")
        for s, inits in ((s, data.global_indices(s - 1)) for s in range(1, 7))
        if t in inits or t in data.target_indices(inits, 1)
    )
    data.source.fields[t, 2, 1, 3] = float("nan")
    when = str(data.times[t].astype("datetime64[m]"))
    with pytest.raises(
        ValueError, match=rf"step {step} holds NaN.*{role} '{data.channels[2]}' \(1 values\) at {when}"
    ):
        trainer.fit()
    assert len(trainer.history) == step - 1


def test_rollout_bf16_and_checkpointing_options_run(tmp_path: Path) -> None:
    trainer = _trainer(
        tmp_path,
        training={"steps": 4, "rollout_steps": 2, "precision": "bf16", "activation_checkpointing": True},
        optim={"warmup_steps": 1},
    )
    summary = trainer.fit()
    assert math.isfinite(summary["final_loss"])
    rows = (tmp_path / "metrics.jsonl").read_text().splitlines()
    kinds = [json.loads(r)["kind"] for r in rows]
    assert kinds == ["train"] * 4 + ["step_summary", "val"]  # 4 steps, the step accounting, validation


BAD = [
    ({"optim": {"lrr": 1e-3}}, "unknown key 'optim.lrr'; did you mean 'lr'"),
    ({"training": {"batch_size": 3}, "mesh": {"data": 2}}, "must split evenly over mesh.data=2"),
    ({"training": {"precision": "fp16"}}, "choose one of 'fp32', 'tf32', 'bf16'"),
    ({"validation": {"lead_hours": [10]}}, "multiples of data.step_hours=6"),
    ({"validation": {"variables": ["z500"]}}, "'z500' is not a trained channel"),
    ({"optim": {"lr": "fast"}}, "optim.lr='fast': expected a number"),
    ({"checkpoint": {"keep": 0}}, "checkpoint.keep=0 must be >= 1"),
]


@pytest.mark.parametrize(("change", "message"), BAD)
def test_bad_configs_have_clear_errors(change: dict, message: str) -> None:
    raw = {"data": {"store": "x"}}
    for k, v in change.items():
        raw.setdefault(k, {}).update(v)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        parse_config(raw).check()
    assert message in str(err.value)


def test_config_file_world_size_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("data: {store: x}\nmesh: {lat: 2, lon: 2}\n")
    with pytest.raises(ValueError, match="= 4 ranks, but the job has 2"):
        load_config(path, world_size=2)
    cfg = load_config(path, ["mesh.lon=1", "optim.lr=3e-4"], world_size=2)
    assert cfg.mesh.lon == 1 and cfg.optim.lr == pytest.approx(3e-4)
    with pytest.raises(ValueError, match=r"unknown key 'mesh\.lom'; did you mean 'lon'"):
        load_config(path, ["mesh.lom=1"])
    path.write_text("data: {store: x}\nrun: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_config(path)  # safe_load: no arbitrary objects
    with pytest.raises(FileNotFoundError, match="not found"):
        load_config(tmp_path / "missing.yaml")
