"""torch.compile across exchanges: compiled training equals eager step for step, the graphs break
only at the exchanges, nothing compiles after the first steps, Dynamo never traces a cached
function (its "Silent incorrectness" warning), and the trainer's compile report.

The compiled runs use the ``aot_eager`` backend (Dynamo's graphs and breaks, AOTAutograd's
forward/backward split, no code generation: seconds, where inductor takes minutes on 2 cores);
``bench compile`` measures inductor (docs/layers.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from jigsaw_earth.models import build_model
from jigsaw_earth.models import run as run_module
from jigsaw_earth.models.run import compile_model

from jigsaw_earth.bench.compile import compile_worker, summarize_mesh
from jigsaw_earth.cli import main
from jigsaw_earth.config import parse_config
from jigsaw_earth.config.parse import to_dict
from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.layers import init_model, local_domain

from .train_helpers import tiny_config, tiny_data

DEMO = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"

# the demo's WeatherMixer at one block, and the UNet (halos, weight rings, group norms; zeros
# beyond the poles: across them needs an even number of longitudes at every level)
MODELS = {
    "weathermixer": {"name": "weathermixer", "preset": "tiny", "overrides": {"patch": 2, "depth": 1}},
    "unet": {"name": "unet", "preset": "tiny", "overrides": {"lat_mode": "zeros"}},
}
GRID = [16, 34]  # 17 and 9 | 8 columns on 1 × 2: uneven tiles


def _raw(model: dict[str, Any]) -> dict:
    cfg = tiny_config("unused", (1, 1, 2), model=model, training={"steps": 4, "batch_size": 2})
    return to_dict(cfg)


def _both(mesh: DomainMesh, raws: dict[str, dict], steps: int) -> dict:
    return {name: compile_worker(mesh, raw, steps, "aot_eager", GRID) for name, raw in raws.items()}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[] if n == "weathermixer" else [pytest.mark.slow]) for n in MODELS]
)
def test_compiled_training_equals_eager_and_settles_after_the_first_step(name: str) -> None:
    """1 × 2, uneven tiles: four interleaved steps of an eager and a compiled trainer of the model;
    the same losses, every graph break at an exchange, nothing compiled after step 2 on any rank,
    no warning about a cached function (the U-Net: slow)."""
    ranks = spawn(MeshShape(1, 1, 2), _both, {name: _raw(MODELS[name])}, 4)
    got = summarize_mesh([r[name] for r in ranks], warmup=2)
    assert got["max_loss_diff"] <= 1e-6, (name, got["losses"])
    assert got["last_step_compiling"] <= 2, (name, got["recompiles"])
    places = got["compile"]["break_places"]
    assert places and all("exchange" in p["reason"] for p in places), (name, places)
    assert not [w for w in got["warnings"] if "lru_cache" in w], (name, got["warnings"])


def test_compile_traces_no_cached_function() -> None:
    """One rank: the halo's window plan and checks are cached functions; Dynamo must not trace
    them (it warns "Silent incorrectness … functools.lru_cache")."""
    torch._dynamo.reset()
    torch._dynamo.utils.warn_once_cache.clear()
    grid = (16, 32)
    model = init_model(build_model("unet", local_domain(*grid), 3, 2, 4, "tiny"), seed=1)
    compile_model(model, "eager")
    gen = torch.Generator().manual_seed(0)
    state, static, time = torch.randn(2, 3, *grid, generator=gen), torch.randn(2, *grid), torch.randn(2, 4)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model(state, static, time).sum().backward()
    torch._dynamo.reset()
    cached = [str(w.message)[:200] for w in seen if "lru_cache" in str(w.message)]
    assert not cached, cached


def test_compile_report_of_a_training_run(tmp_path, monkeypatch, caplog) -> None:
    """``logging.compile_report``: a record per step and validation in compile-report-rank0.json,
    a line for the step that compiled, nothing compiled after it (one rank: no graph break)."""
    monkeypatch.setattr(run_module, "compile_model", lambda model: compile_model(model, "aot_eager"))
    cfg = tiny_config(
        str(tmp_path / "run"),
        (1, 1, 1),
        model=MODELS["weathermixer"],
        training={"steps": 3, "batch_size": 2, "compile": True},
        logging={"compile_report": True},
    )
    from jigsaw_earth.training.loop import Trainer

    mesh = DomainMesh(cfg.mesh.shape)
    caplog.set_level("INFO", logger="jigsaw_earth.training.compile_report")
    Trainer(cfg, mesh, data=tiny_data(cfg, mesh)).fit()
    report = json.loads((tmp_path / "run" / "compile-report-rank0.json").read_text())
    labels = [r["label"] for r in report["records"]]
    assert labels == ["step 1", "step 2", "step 3", "validation at step 3"], labels
    summary = report["summary"]
    assert summary["graphs"] >= 1 and summary["breaks"] == 0, summary
    assert summary["last_step_compiling"] == 1, report["records"]
    assert "compile step 1:" in caplog.text and "torch.compile:" in caplog.text


def test_compile_report_needs_compile() -> None:
    raw = to_dict(tiny_config("unused", (1, 1, 1)))
    raw["logging"]["compile_report"] = True
    with pytest.raises(ValueError, match=r"logging.compile_report=true .* set training.compile=true"):
        parse_config(raw).check()


def test_bench_compile_command_on_one_rank(tmp_path, capsys) -> None:
    """``bench compile``: the table and the JSON (one rank, in this process; Dynamo only)."""
    out = tmp_path / "compile.json"
    args = ["bench", "compile", str(DEMO), "--meshes", "1x1", "--steps", "3", "--warmup", "1",
            "--backend", "eager", "--grid", "16x32", "--set", "model.overrides={patch: 2, depth: 1}",
            "--json", str(out)]  # fmt: skip
    threads = torch.get_num_threads()
    assert main(args) == 0
    assert torch.get_num_threads() == threads
    got = json.loads(out.read_text())["result"]["1x1"]
    assert got["max_loss_diff"] <= 1e-6 and got["compile"]["breaks"] == 0 and got["timed_steps"] == 2, got
    assert "compiled ms" in capsys.readouterr().out


@pytest.mark.parametrize(
    "bad, said",
    [
        (["--steps", "1"], "--steps 1"),
        (["--steps", "3", "--warmup", "3"], "--warmup 3"),
        (["--meshes", "2x1x2"], "LATxLON"),
        (["--meshes", "2y2"], "mesh"),
    ],
)
def test_bench_compile_refuses(bad: list[str], said: str, capsys) -> None:
    assert main(["bench", "compile", str(DEMO), *bad]) != 0
    assert said in capsys.readouterr().err


def test_dynamo_is_loaded_only_to_compile() -> None:
    """Importing the commands, the trainer and predict leaves Dynamo unloaded (about a second more
    of every process's start); ``Forecaster.compile`` arms the exchanges like ``compile_model``."""
    code = (
        "import sys, jigsaw_earth.cli, jigsaw_earth.training.loop, jigsaw_earth.inference.predict\n"
        "print('torch._dynamo' in sys.modules)\n"
        "from jigsaw_earth.distributed import comm\n"
        "from jigsaw_earth.models import build_model\n"
        "from jigsaw_earth.layers import local_domain\n"
        "build_model('weathermixer', local_domain(16, 32), 3, 2, 4, 'tiny').compile(backend='eager')\n"
        "print(bool(comm._EAGER))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True"], out.stdout
