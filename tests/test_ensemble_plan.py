"""``plan`` and ``model summary`` price the ensemble axis: batched members' memory, the members'
gather before the CRPS loss, and the gradient sum over data × ensemble."""

from __future__ import annotations

import json

import pytest
from jigsaw_earth.models.plan import (
    Hardware,
    ensemble_gather_bytes,
    ensemble_loss_bytes,
    plan_mesh,
    plan_meshes,
)
from jigsaw_earth.models.summary import summarize

from jigsaw_earth.cli import main
from jigsaw_earth.distributed.mesh import MeshShape

GRID, CHANNELS, BATCH = (32, 64), (5, 2, 4), 2
ARGS = ("weathermixer", "tiny", GRID)


def _plan(shape: MeshShape, members: int = 1, batch: int = BATCH):
    return plan_mesh(*ARGS, shape, CHANNELS, Hardware(), batch, 4, members)


def test_members_batched_cost_what_a_larger_batch_costs() -> None:
    """4 members batched on one group: the model runs 4 x the rows, plus the loss's fields."""
    one, four = _plan(MeshShape(1, 1, 2), members=4), _plan(MeshShape(1, 1, 2), batch=4 * BATCH)
    field = BATCH * CHANNELS[0] * GRID[0] * GRID[1] // 2  # rank 0's tile of one member's fields
    assert one.memory["activations"] == four.memory["activations"] + ensemble_loss_bytes(4, 4, field)
    assert ensemble_loss_bytes(4, 4, field) == 4 * field * (4 + 8)
    assert one.compute_s == pytest.approx(four.compute_s)
    assert "ensemble.gather" not in one.comm and one.samples_per_s == pytest.approx(1 / one.step_s * BATCH)


def test_ensemble_axis_prices_the_gather_and_the_gradient_sum() -> None:
    spread = _plan(MeshShape(1, 1, 2, ensemble=2), members=4)
    field = BATCH * CHANNELS[0] * GRID[0] * GRID[1] // 2
    assert spread.ensemble == 2 and spread.members == 4 and spread.mesh == "1x2x1x2"
    assert spread.comm["ensemble.gather"] == ensemble_gather_bytes(2, 2, field) == 4 * field * 2 * 1
    assert "data.grad_allreduce" in spread.comm  # the replicas are the ensemble groups
    batched = _plan(MeshShape(1, 1, 2), members=4)
    assert spread.memory["activations"] < batched.memory["activations"]  # half the members per rank
    assert _plan(MeshShape(1, 1, 2, ensemble=2), members=3).error.startswith("3 members do not split")


def test_plan_meshes_choose_between_batching_and_spreading() -> None:
    plans = plan_meshes(*ARGS, 4, CHANNELS, Hardware(), BATCH, 4, None, 4)
    layouts = {p.mesh for p in plans}
    assert {"1x1x4", "1x2x1x2", "1x4x1x1", "2x2x1x1"} <= layouts
    assert all(p.members == 4 for p in plans)
    odd = plan_meshes(*ARGS, 4, CHANNELS, Hardware(), BATCH, 4, None, 3)
    assert {p.ensemble for p in odd} == {1}
    plain = plan_meshes(*ARGS, 4, CHANNELS, Hardware(), BATCH, 4)
    assert {p.mesh for p in plain} == {p.mesh for p in odd}


def test_summary_reports_the_members_and_their_gather() -> None:
    s = summarize("weathermixer", MeshShape(1, 1, 2, ensemble=2), GRID, *CHANNELS, batch=BATCH, members=4)
    assert s.mesh == "1x2x1x2" and s.members == 4
    assert s.ensemble_gather_bytes == ensemble_gather_bytes(2, 2, BATCH * CHANNELS[0] * GRID[0] * GRID[1])
    assert s.step_memory == _plan(MeshShape(1, 1, 2, ensemble=2), members=4).memory
    with pytest.raises(ValueError, match="do not split over 2 ensemble groups"):
        summarize("weathermixer", MeshShape(1, 1, 2, ensemble=2), GRID, *CHANNELS, members=3)


def test_commands_take_members(tmp_path, capsys) -> None:
    out = tmp_path / "plan.json"
    argv = ["plan", "--model", "weathermixer", "--preset", "tiny", "--grid", "32x64", "--world-size", "4",
            "--nodes", "1", "--members", "4", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "4 ensemble members per sample" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["members"] == 4 and any(m["ensemble"] == 2 for m in doc["meshes"])
    summary = ["model", "summary", "--model", "weathermixer", "--preset", "tiny", "--grid", "32x64"]
    assert main([*summary, "--mesh", "1x2x1x2", "--members", "4"]) == 0
    assert "members' gather before the loss" in capsys.readouterr().out
    assert main([*summary, "--mesh", "1x2x1x2", "--members", "3"]) != 0
    assert "--members 3" in capsys.readouterr().err
