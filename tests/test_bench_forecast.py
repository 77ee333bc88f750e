"""``bench forecast``: the runs it makes, its errors, and the command end to end on a tiny config."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from jigsaw_earth.bench.forecast import forecast_runs, format_forecast
from jigsaw_earth.cli import main

CONFIG = Path(__file__).parent.parent / "configs" / "demo.yaml"
TINY = ["model.preset=tiny", "model.overrides={patch: 2}"]


def test_runs_one_rank_then_every_mesh() -> None:
    assert [r.mesh for r in forecast_runs(2)] == [(1, 1), (1, 2), (2, 1)]
    assert [r.mesh for r in forecast_runs(4, [(2, 2)])] == [(1, 1), (2, 2)]
    assert [r.world for r in forecast_runs(4)] == [1, 4, 4, 4]


def test_bad_arguments_name_the_fix(capsys: pytest.CaptureFixture) -> None:
    assert main(["bench", "forecast", str(CONFIG), "--world-size", "1"]) != 0
    assert "--world-size 1: use 2 or more ranks" in capsys.readouterr().err
    assert main(["bench", "forecast", str(CONFIG), "--world-size", "2", "--meshes", "2x2"]) != 0
    assert "--meshes 2x2: 2x2 is not 2 ranks" in capsys.readouterr().err
    assert main(["bench", "forecast", str(CONFIG), "--world-size", "2", "--steps", "0"]) != 0
    assert "--steps 0: use 1 or more" in capsys.readouterr().err


def test_command_on_a_tiny_config(capsys: pytest.CaptureFixture) -> None:
    """1 rank and 1x2 forecasting 3 steps of a tiny WeatherMixer: the table, and where the time went."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "forecast.json")
        sets = [a for s in TINY for a in ("--set", s)]
        args = ["bench", "forecast", str(CONFIG), "--world-size", "2", "--meshes", "1x2", "--grid", "16x32",
                *sets, "--steps", "3", "--repeats", "1", "--json", str(out)]  # fmt: skip
        assert main(args) == 0
        data = json.loads(out.read_text())
    rows = {r["name"]: r for r in data["result"]["rows"]}
    assert list(rows) == ["1 rank", "1x2 (2 ranks)"]
    one, two = rows["1 rank"], rows["1x2 (2 ranks)"]
    assert one["speedup"] == 1.0 and two["speedup"] > 0
    for r in (one, two):
        assert 0 < r["forward_s"] <= r["loop_s"] and r["cpu_s"] > 0
        assert r["written_bytes"] == 3 * 9 * 16 * 32 * 4 / r["processes"], "every lead of the tile written"
    assert one["comm_wait_s"] == 0 < two["comm_wait_s"]
    printed = capsys.readouterr().out
    assert "one init, 3 steps, every lead written" in printed and format_forecast(data["result"]) in printed
