"""The ensemble recipes (configs/ensemble-*.yaml) parse, fit their mesh, and the demo's model, loss
and members train on a small stochastic synthetic store (the grid, periods and steps shrunk)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from jigsaw_earth.data.synth import SynthConfig, synth_store

from jigsaw_earth.cli import main
from jigsaw_earth.config import parse_config
from jigsaw_earth.training import run_training

CONFIGS = Path(__file__).parents[1] / "configs"
RECIPES = {"ensemble-demo": 4, "ensemble-1p5deg": 16}  # recipe: world size


@pytest.mark.parametrize("name", list(RECIPES))
def test_recipe_is_valid_on_its_mesh(name: str, capsys) -> None:
    raw = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    cfg = parse_config(raw)
    cfg.check(world_size=RECIPES[name])
    assert cfg.mesh.ensemble == 2 and cfg.training.members % 2 == 0 and cfg.model.noise_channels > 0
    assert cfg.loss.kind in ("fair_crps", "almost_fair_crps")
    assert main(["config", "validate", str(CONFIGS / f"{name}.yaml"), "--world-size", str(RECIPES[name]),
                 "--quiet"]) == 0  # fmt: skip
    assert f"{cfg.training.members} members per sample" in capsys.readouterr().out


def test_demo_recipe_trains_on_a_stochastic_store(tmp_path: Path) -> None:
    store = tmp_path / "data.zarr"
    synth_store(
        store, SynthConfig(n_lat=16, n_lon=32, start="2019-12-01", end="2020-01-10T18", stochastic=1.0)
    )
    raw = yaml.safe_load((CONFIGS / "ensemble-demo.yaml").read_text())
    raw["run"]["dir"] = str(tmp_path / "run")
    raw["mesh"] = {"data": 1, "ensemble": 1, "lat": 1, "lon": 1}  # the members batched on one process
    raw["data"].update(store=str(store), train_period=["2019-12-01", "2019-12-31T18"],
                       val_period=["2020-01-01", "2020-01-08"])  # fmt: skip
    raw["training"].update(steps=3)
    raw["validation"].update(max_samples=2)
    raw["checkpoint"].update(every=0)
    raw["logging"] = {"every": 1, "progress": False, "wandb": {"mode": "disabled"}}
    summary = run_training(parse_config(raw))
    assert summary["steps"] == 3 and math.isfinite(summary["final_loss"])
    assert math.isfinite(summary["validation"]["z500@24h/model"])
