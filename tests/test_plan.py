"""``plan`` against measurements: per-rank memory and bytes of a real training step.

Each case runs one training step (forward, weighted loss, backward, AdamW) on every rank of a
mesh (``bench.train_step``) and compares rank 0's allocator peak with ``plan``'s memory, and
the bytes the comm ledger saw all ranks send with ``plan``'s communication (fp32, CPU).
"""

from __future__ import annotations

import json

import pytest
from jigsaw_earth.models.plan import Hardware, factorisations, plan_mesh, plan_meshes, recommend

from jigsaw_earth.bench.train_step import measure_train_step
from jigsaw_earth.cli import main
from jigsaw_earth.distributed.mesh import MeshShape, parse_mesh
from jigsaw_earth.distributed.spawn import spawn

CHANNELS = (5, 2, 4)
CASES = {  # mesh: (model, preset, grid, channels, batch)
    "1x1": [
        ("weathermixer", "tiny", (32, 64), CHANNELS, 2),
        ("weathermixer", "small", (64, 128), CHANNELS, 2),
        ("vit", "tiny", (32, 64), CHANNELS, 2),
        ("unet", "tiny", (32, 64), CHANNELS, 2),
    ],
    "2x2": [
        ("weathermixer", "tiny", (33, 64), CHANNELS, 2),
        ("vit", "tiny", (33, 64), CHANNELS, 2),
        ("unet", "tiny", (33, 64), CHANNELS, 2),
    ],
}
SMALL = {  # the small presets on four ranks (slow: about a minute more)
    "2x2": [
        ("weathermixer", "small", (64, 128), CHANNELS, 2),
        ("vit", "small", (64, 128), CHANNELS, 2),
        ("unet", "small", (64, 128), CHANNELS, 1),
    ],
}


@pytest.fixture(scope="module")
def measured() -> dict[str, list[dict]]:
    return {mesh: spawn(parse_mesh(mesh), measure_train_step, cases) for mesh, cases in CASES.items()}


def _check(mesh: str, cases: list, measured: list[list[dict]]) -> None:
    shape = parse_mesh(mesh)
    for i, (name, preset, grid, channels, batch) in enumerate(cases):
        ranks = [r[i] for r in measured]
        plan = plan_mesh(name, preset, grid, shape, channels, Hardware(), batch)
        case = f"{name} {preset} {grid} on {mesh}"
        memory = plan.memory["total"] / ranks[0]["peak_bytes"]
        assert 0.9 <= memory <= 1.1, f"{case}: plan memory / measured peak = {memory:.3f}"
        sent = sum(r["bytes_sent"] for r in ranks)
        assert sum(plan.comm.values()) * shape.domain_size == pytest.approx(sent, rel=0.1), case


@pytest.mark.parametrize("mesh", list(CASES))
def test_plan_within_ten_percent_of_a_measured_step(measured, mesh: str) -> None:
    _check(mesh, CASES[mesh], measured[mesh])


@pytest.mark.slow
def test_plan_within_ten_percent_on_the_small_presets() -> None:
    for mesh, cases in SMALL.items():
        _check(mesh, cases, spawn(parse_mesh(mesh), measure_train_step, cases))


def test_factorisations_and_recommendation() -> None:
    assert factorisations(4) == [(1, 1, 4), (1, 2, 2), (1, 4, 1), (2, 1, 2), (2, 2, 1), (4, 1, 1)]
    plans = plan_meshes("weathermixer", "tiny", (33, 64), 4, CHANNELS, Hardware(memory=10**9))
    best, why = recommend(plans)
    assert best is not None and best.fits and best is plans[0]
    assert "headroom" in why[0]
    small = plan_meshes("weathermixer", "tiny", (33, 64), 4, CHANNELS, Hardware(memory=10**5))
    best, why = recommend(small)
    assert best is None and "GB more per GPU" in why[1]
    bad = plan_mesh("weathermixer", "tiny", (33, 64), MeshShape(1, 16, 1), CHANNELS, Hardware())
    assert bad.error  # 9 token rows cannot go to 16 ranks: the layer's own error


def test_plan_command_prints_a_recommendation_and_json(tmp_path, capsys) -> None:
    out = tmp_path / "plan.json"
    argv = ["plan", "--model", "weathermixer", "--grid", "33x64", "--world-size", "4", "--channels", "5,2,4"]
    assert main([*argv, "--gpu-memory", "1GB", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "recommended: " in text and "headroom" in text and "impossible" not in text
    doc = json.loads(out.read_text())
    assert doc["recommended"] == text.split("recommended: ")[1].split()[0]
    assert len(doc["meshes"]) == len(factorisations(4))


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--preset", "huge"], ["preset 'huge'", "use one of"]),
        (["--gpu-memory", "lots"], ["--gpu-memory 'lots'", "80GB"]),
        (["--nodes", "3"], ["--nodes 3", "divisor of --world-size 4"]),
        (["--grid", "33"], ["--grid '33'", "2 integers"]),
        (["--efficiency", "2"], ["--efficiency 2.0", "(0, 1]"]),
    ],
)
def test_plan_bad_input_is_one_line(capsys, extra: list[str], words: list[str]) -> None:
    argv = ["plan", "--model", "weathermixer", "--grid", "33x64", "--world-size", "4", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and all(w in err for w in words), err
