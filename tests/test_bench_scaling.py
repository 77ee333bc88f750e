"""``bench scaling``: the runs it makes, what one run measures, and the command end to end (slow)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from jigsaw_earth.bench.scaling import config_for, scaling_runs, scaling_worker, summarize_run, tile_grid
from jigsaw_earth.cli import main
from jigsaw_earth.config import load_config
from jigsaw_earth.config.parse import to_dict
from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape

CONFIG = Path(__file__).parent.parent / "configs" / "demo.yaml"
TINY = ["model.preset=tiny", "model.overrides={}", "training.batch_size=4"]


def test_runs_of_four_ranks() -> None:
    runs = {r.name: (r.mesh, r.threads) for r in scaling_runs(4)}
    assert runs == {
        "1 rank, 1 thread": ((1, 1, 1), 1),
        "1 rank, 4 threads": ((1, 1, 1), 4),
        "jigsaw 1x4": ((1, 1, 4), 1),
        "jigsaw 2x2": ((1, 2, 2), 1),
        "jigsaw 4x1": ((1, 4, 1), 1),
        "jigsaw 1x2 x DDP 2": ((2, 1, 2), 1),
        "jigsaw 2x1 x DDP 2": ((2, 2, 1), 1),
        "DDP x4": ((4, 1, 1), 1),
    }


def test_summary_takes_the_slowest_rank_and_sums_cpu() -> None:
    def step(wall: float, cpu: float) -> dict:
        return {"step_time_s": wall, "cpu_s": cpu, "compute_s": wall / 2, "comm_s": wall / 4,
                "data_s": 0.0, "other_s": wall / 4, "unaccounted_s": 0.0, "tflops": 1.0}  # fmt: skip

    ranks = [{"steps": [step(1.0, 0.5), step(3.0, 0.5), step(2.0, 0.5)], "flops": 1e9},
             {"steps": [step(2.0, 1.0), step(1.0, 1.0), step(1.0, 1.0)], "flops": 1e9}]  # fmt: skip
    s = summarize_run(ranks, global_batch=8)
    assert s["step_s"] == 2.0  # slowest rank per step: 2, 3, 2
    assert s["cpu_s"] == 1.5 and s["samples_per_s"] == 4.0


def test_one_run_measures_every_step_part() -> None:
    """The worker of one run (here one rank, in this process): the trainer's step accounting."""
    cfg = load_config(CONFIG, TINY)
    with tempfile.TemporaryDirectory() as tmp:
        run = scaling_runs(2)[0]
        raw = config_for(to_dict(cfg), run, f"{tmp}/run", 1, 2)
        out = scaling_worker(DomainMesh(MeshShape(1, 1, 1)), raw, [16, 32], 1, 2)
    assert len(out["steps"]) == 2 and out["flops"] > 0
    for h in out["steps"]:
        assert h["comm_s"] == 0 and h["cpu_s"] > 0
    parts = sum(h[f"{k}_s"] for h in out["steps"] for k in ("compute", "comm", "data", "other"))
    total = sum(h["step_time_s"] for h in out["steps"])
    assert abs(parts - total) <= 0.1 * total


def test_tile_grid_splits_longitudes_first() -> None:
    assert tile_grid((64, 128), 2) == (64, 64)
    assert tile_grid((64, 128), 4) == (64, 32)
    assert tile_grid((64, 6), 4) == (32, 3)
    assert tile_grid((17, 3), 2) == (17, 1)


def test_bad_batch_and_world_size(capsys: pytest.CaptureFixture) -> None:
    assert main(["bench", "scaling", str(CONFIG), "--world-size", "1"]) != 0
    assert "--world-size 1" in capsys.readouterr().err
    bad = ["--set", "training.batch_size=3", "--grid", "16x32"]
    assert main(["bench", "scaling", str(CONFIG), "--world-size", "2", *bad]) != 0
    assert "training.batch_size=3" in capsys.readouterr().err


@pytest.mark.slow
def test_command_on_a_tiny_config() -> None:
    """Every run of 2 ranks on a tiny config: table, JSON, plan beside each multi-rank run, report."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "scaling.json")
        sets = [a for s in TINY for a in ("--set", s)]
        args = ["bench", "scaling", str(CONFIG), "--world-size", "2", "--grid", "16x32", *sets,
                "--steps", "2", "--warmup", "1", "--repeats", "1", "--json", str(out)]  # fmt: skip
        assert main(args) == 0
        data = json.loads(out.read_text())
        rows = {r["name"]: r for r in data["result"]["rows"]}
        assert list(rows) == ["1 rank, 1 thread", "1 rank, 2 threads", "jigsaw 1x2", "jigsaw 2x1", "DDP x2"]
        assert rows["1 rank, 1 thread"]["speedup"] == 1.0
        for name, r in rows.items():
            # the parts are the ranks' mean, the step the slowest rank's: each rank's gap is small
            assert abs(r["unaccounted_s"]) <= 0.1 * r["step_s"], name
            assert (r["comm_s"] > 0) == (r["processes"] > 1), name
            assert (r["plan"] is None) == (r["kind"] == "threads"), name
        assert data["result"]["link_bytes_per_s"] > 0 and data["result"]["gemm_tflops"] > 0
        # plan's rate curve: the serial run's rate at its work, the 1/N-tile run's at half of it
        assert data["result"]["tile_grid"] == [16, 16]
        (w_full, _), (w_tile, r_tile) = data["result"]["rate_curve"]
        assert 0.4 < w_tile / w_full < 0.6 and r_tile > 0
        # the crowded rate: 2 tile runs at once against the lone one, applied to multi-rank plans
        res = data["result"]
        assert 0 < res["crowded_rate"] <= 1 and res["crowded_gemm_tflops"] > 0
        assert rows["1 rank, 1 thread"]["plan"]["rate_tflops"] == pytest.approx(res["gemm_tflops"])
        md = Path(tmp, "bench.md")
        assert main(["bench", "report", str(out), "--out", str(md)]) == 0
        assert "| jigsaw 1x2 |" in md.read_text()
