"""Bring your own model: models defined outside the package, through the real command line.

* ``examples/jigsaw_examples`` (a conv net with a replicated gain, a transformer), named in the
  YAML as ``package.module:Class``, train with ``jigsaw-earth train`` on 1 rank and on a 2 × 2
  mesh (one process per rank, as ``srun`` starts them) with the same losses; the 2 × 2 run's
  step-4 checkpoint resumes on 1 rank with the 2 × 2 run's steps 5 and 6; the run records name the
  model; ``predict`` loads the 2 × 2 checkpoint on 1 rank and ``score`` scores its forecast.
* ``validate --model`` passes the examples, and on ``tests.byo_models:TileMeanNet`` (a
  tile-local ``torch.mean``) fails and names the op and the module that holds it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from jigsaw_earth.cli import main
from jigsaw_earth.config import parse_config
from jigsaw_earth.distributed.spawn import free_port

from .train_helpers import TINY_YAML, merge_sections, rank_env

EXAMPLES = Path(__file__).parents[1] / "examples"
CONVNET = "jigsaw_examples.convnet:ConvNet"
TRANSFORMER = "jigsaw_examples.transformer:Transformer"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from jigsaw_earth.data.synth import SynthConfig, synth_store

    path = tmp_path_factory.mktemp("store") / "data.zarr"
    synth_store(path, SynthConfig(n_lat=16, n_lon=32, start="2020-01-01T00", end="2020-02-12T18"))
    return path


@pytest.fixture()
def examples_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))


def _config(path: Path, store: Path, model: str, lat: int, lon: int) -> Path:
    raw = merge_sections(
        TINY_YAML,
        {
            "run": {"dir": str(path.parent / "run"), "name": "byo"},
            "mesh": {"lat": lat, "lon": lon},
            "data": {"store": str(store)},
            "model": {"name": model, "preset": "tiny"},
            "training": {"steps": 6},
            "checkpoint": {"every": 2, "keep": 3, "resume": "auto"},
            "distributed": {"timeout_s": 120},
        },
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw))
    return path


def _train(config: Path, world: int, *overrides: str) -> None:
    """``jigsaw-earth train`` on ``world`` processes started as srun starts them."""
    port, procs = free_port(), []
    path = os.pathsep.join([str(EXAMPLES), os.environ.get("PYTHONPATH", "")])
    for rank in range(world):
        env = rank_env(rank, world, port, PYTHONPATH=path)
        cmd = [sys.executable, "-m", "jigsaw_earth", "train", str(config), *overrides]
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    for rank, proc in enumerate(procs):
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"rank {rank} of {config} exited {proc.returncode}:\n{out[-3000:]}"


def _losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {r["step"]: r["loss"] for r in rows if r["kind"] == "train"}


def _train_resume_predict(tmp_path: Path, store: Path, model: str) -> None:
    serial = _config(tmp_path / "1x1" / "config.yaml", store, model, 1, 1)
    mesh = _config(tmp_path / "2x2" / "config.yaml", store, model, 2, 2)
    resumed = _config(tmp_path / "resumed" / "config.yaml", store, model, 1, 1)
    _train(serial, 1)
    _train(mesh, 4)
    run_dir = mesh.parent / "run"
    _train(resumed, 1, f"checkpoint.resume={run_dir / 'checkpoints' / 'step_000000004'}")
    ref, got = _losses(serial.parent / "run"), _losses(run_dir)
    assert sorted(got) == sorted(ref) == list(range(1, 7)), (ref, got)
    steps = sorted(ref)
    np.testing.assert_allclose([got[s] for s in steps], [ref[s] for s in steps], rtol=1e-4)
    again = _losses(resumed.parent / "run")
    assert sorted(again) == [5, 6], again
    np.testing.assert_allclose([again[5], again[6]], [got[5], got[6]], rtol=1e-4)
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["name"] == model
    assert model in (run_dir / "history.jsonl").read_text()

    forecast = tmp_path / "forecast.zarr"
    args = ["predict", str(mesh), "mesh.lat=1", "mesh.lon=1", "--out", str(forecast), "--steps", "2"]
    assert main([*args, "--max-inits", "2"]) == 0
    assert main(["score", str(forecast), "--truth", str(store)]) == 0

    # export: the canonical full tensors, loadable into the model built on one rank
    from jigsaw_earth.models import model_from_config

    from jigsaw_earth.checkpoint.export import load_full_tensors
    from jigsaw_earth.layers import local_domain

    cfg = parse_config(yaml.safe_load((run_dir / "config.yaml").read_text()))
    tensors = load_full_tensors(run_dir / "checkpoints" / "step_000000006")
    one_rank = model_from_config(cfg.model, local_domain(16, 32), 5, 6)
    assert one_rank.load_state_dict(tensors, strict=True) is not None


def test_convnet_trains_resumes_predicts_and_scores_from_the_cli(
    tmp_path: Path, store: Path, examples_on_path: None
) -> None:
    _train_resume_predict(tmp_path, store, CONVNET)


@pytest.mark.slow
def test_transformer_trains_resumes_predicts_and_scores_from_the_cli(
    tmp_path: Path, store: Path, examples_on_path: None
) -> None:
    _train_resume_predict(tmp_path, store, TRANSFORMER)


def test_validate_names_the_tile_local_module(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["validate", "--model", "tests.byo_models:TileMeanNet", "--mesh", "1x1", "--mesh", "1x2"]) == 1
    )
    out = capsys.readouterr().out
    assert "1 passed, 1 failed" in out, out
    assert (
        "on 1x2: the first value that diverges from the serial run is op Tensor.mean at "
        "tests/byo_models.py:" in out
    ), out
    assert "in Centre.forward (inside module 'centre', Centre)" in out, out
    assert "it reduces over this rank's tile only" in out, out


def test_validate_passes_the_example_convnet(
    examples_on_path: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", "--model", CONVNET, "--mesh", "1x2"]) == 0, capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("model", [CONVNET, TRANSFORMER])
def test_validate_passes_the_examples_on_the_default_meshes(
    model: str, examples_on_path: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", "--model", model]) == 0, capsys.readouterr().out


def test_plan_refuses_a_layer_without_a_cost_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    main(
        [
            "plan",
            "--model",
            "tests.test_replicated_params:ReplicatedNet",
            "--world-size",
            "2",
            "--grid",
            "16x32",
        ]
    )
    out = capsys.readouterr().out
    assert "impossible: parameter bias belongs to ReplicatedNet, which declares no cost(" in out, out


def test_an_entry_point_registers_a_model(monkeypatch: pytest.MonkeyPatch, examples_on_path: None) -> None:
    from importlib.metadata import EntryPoint

    from jigsaw_earth.models import registry

    ep = EntryPoint("example-convnet", CONVNET, registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(
        registry, "entry_points", lambda group: [ep] if group == registry.ENTRY_POINT_GROUP else []
    )
    monkeypatch.setattr(registry, "_ENTRY_POINTS_LOADED", False)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    assert registry.model_names()[-1] == "example-convnet"
    entry = registry.model_entry("example-convnet")
    assert entry.cls().__name__ == "ConvNet" and list(entry.presets) == ["tiny", "small"]
    assert entry.config("small", depth=3).channels == 64
    assert registry.model_entry(CONVNET) is entry  # the path finds the registered name's entry
