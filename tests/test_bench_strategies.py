"""``bench strategies``: the five strategies train the same model identically (loss, gradient
norm), count the bytes their collectives move as the analytic figures say, and split peak memory
into parts that sum to it. One spawned process group (world size 4) serves the whole module."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from jigsaw_earth.data.batch import VariableSpec
from jigsaw_earth.models.summary import summarize

from jigsaw_earth.argtypes import parse_bytes
from jigsaw_earth.bench.comm_count import ring_bytes
from jigsaw_earth.bench.strategies import STRATEGIES, Problem, domain_shape
from jigsaw_earth.bench.strategy_bench import read_bytes
from jigsaw_earth.bench.strategy_run import strategies_worker
from jigsaw_earth.cli import main
from jigsaw_earth.commands.bench_strategies import parse_variant
from jigsaw_earth.distributed.mesh import MeshShape
from jigsaw_earth.distributed.spawn import spawn

WORLD = 4
PROBLEM = Problem(
    model="weathermixer",
    preset="tiny",
    overrides=dict(embed_dim=16, channel_hidden=32, token_hidden=16, patch=2),
    grid=(16, 32),
    n_state=3,
    n_static=2,
)


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    names = list(STRATEGIES)
    return spawn(MeshShape(1, 2, 2), strategies_worker, dict(vars(PROBLEM)), names, WORLD, 0)


def test_same_loss_and_gradient_under_every_strategy(ranks):
    first = ranks[0]["ddp"]
    for r in ranks:
        for name in STRATEGIES:
            assert r[name]["loss"] == pytest.approx(first["loss"], rel=1e-6), name
            assert r[name]["grad_norm"] == pytest.approx(first["grad_norm"], rel=1e-5), name


def test_bytes_sent_match_the_analytic_figures(ranks):
    for r in ranks:
        for name in ("ddp", "fsdp2", "tp"):  # counted at torch's collectives: exactly the ring volumes
            assert r[name]["bytes_sent"] == r[name]["analytic_bytes"], name
    for name in ("jigsaw", "jigsaw_ddp"):  # the comm ledger against models.summary
        sent = sum(r[name]["bytes_sent"] for r in ranks)
        analytic = sum(r[name]["analytic_bytes"] for r in ranks)
        assert 0.9 * analytic <= sent <= 1.1 * analytic, name


def test_ddp_bytes_are_a_ring_all_reduce_of_the_gradients(ranks):
    s = summarize(PROBLEM.model, MeshShape(1, 1, 1), PROBLEM.grid, 3, 2, 4, "tiny", **PROBLEM.overrides)
    assert ranks[0]["ddp"]["bytes_sent"] == ring_bytes("all_reduce", 4 * s.total_params, WORLD)


def test_memory_split_sums_to_the_peak(ranks):
    s = summarize(PROBLEM.model, MeshShape(1, 2, 2), PROBLEM.grid, 3, 2, 4, "tiny", **PROBLEM.overrides)
    for k, r in enumerate(ranks):
        for name in STRATEGIES:
            m = r[name]["memory"]
            parts = [m["parameters"], m["gradients"], m["optimizer"], m["activations"]]
            assert sum(parts) == m["peak"] and min(parts) > 0, name
            assert m["gradients"] == m["parameters"], name
        assert r["jigsaw"]["memory"]["parameters"] == 4 * s.rank_params[k]
        assert r["ddp"]["memory"]["parameters"] == 4 * s.total_params
        assert r["jigsaw"]["memory"]["peak"] < r["ddp"]["memory"]["peak"]


def test_jigsaw_ranks_read_their_tile_only():
    spec = VariableSpec(("temperature",), (500,), ("2m_temperature",), ())
    reads = read_bytes(spec, PROBLEM.grid, WORLD, ["jigsaw", "ddp", "jigsaw_ddp"])
    assert reads["ddp"]["bytes_read"] == reads["ddp"]["sample_bytes_read"]
    assert reads["jigsaw"]["bytes_read"] <= 0.3 * reads["ddp"]["bytes_read"]
    assert reads["jigsaw_ddp"]["bytes_read"] <= 0.55 * reads["ddp"]["bytes_read"]


def test_helpers():
    assert ring_bytes("all_reduce", 400, 4) == 600
    assert ring_bytes("all_gather", 400, 4) == ring_bytes("reduce_scatter", 400, 4) == 300
    assert ring_bytes("all_reduce", 400, 1) == 0
    assert domain_shape(4) == (2, 2) and domain_shape(8) == (2, 4) and domain_shape(2) == (1, 2)
    assert parse_bytes("64MiB", "--memory-budget") == 64 * 2**20
    assert parse_bytes("1000", "--memory-budget") == 1000
    assert parse_variant("wide:embed_dim=384,patch=2") == ("wide", {"embed_dim": 384, "patch": 2})
    assert math.isclose(parse_bytes("1.5GiB", "--memory-budget"), 1.5 * 2**30)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["bench", "strategies"], "one CONFIG file"),
        (["bench", "strategies", "configs/demo.yaml", "--world-size", "3"], "--world-size 3"),
        (["bench", "strategies", "configs/demo.yaml", "--strategies", "zero3"], "--strategies 'zero3'"),
        (["bench", "strategies", "configs/demo.yaml", "--memory-budget", "lots"], "--memory-budget 'lots'"),
        (["bench", "strategies", "configs/demo.yaml", "--variant", "wide"], "--variant 'wide'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err


def test_budget_search_steps_and_report(tmp_path):
    from jigsaw_earth.bench.report import load_results, markdown
    from jigsaw_earth.bench.strategy_bench import _next_q

    assert _next_q({}, 5, 10) == 5 and _next_q({5: 9}, 5, 10) == 6 and _next_q({5: 9, 6: 11}, 6, 10) is None
    assert _next_q({5: 11}, 5, 10) == 4 and _next_q({5: 11, 4: 9}, 4, 10) is None
    data = load_results(Path(__file__).parents[1] / "docs" / "bench" / "strategies-cpu.json")
    text = markdown([("strategies-cpu.json", data)], "jigsaw-earth bench report")
    assert "### demo" in text and "Largest grid trained within" in text
    assert "jigsaw's peak per rank is" in text


def test_plan_predicts_the_measured_jigsaw_rows(ranks):
    """`jigsaw-earth plan` (declared layer costs, nothing run) within 10 % of what the jigsaw
    strategies measured: rank peak of one sample and bytes sent per step."""
    from jigsaw_earth.bench.strategy_bench import JIGSAW_SHAPES, plan_figures

    for name, shape in JIGSAW_SHAPES.items():
        per = [r[name] for r in ranks]
        plan = plan_figures(PROBLEM, shape(WORLD), per[0]["samples_per_rank"])
        peak = max(f["memory"]["peak"] for f in per)
        sent = sum(f["bytes_sent"] for f in per) / len(per)
        assert 0.9 <= plan["peak"] / peak <= 1.1, (name, plan["peak"], peak)
        assert 0.9 <= plan["bytes_sent"] / sent <= 1.1, (name, plan["bytes_sent"], sent)
