"""``bench io`` (reader against raw reads of the same bytes, tensorstore and zarr) and plan's
price of reading a batch, on a small synthetic store."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from jigsaw_earth.data.batch import VariableSpec
from jigsaw_earth.data.synth import SynthConfig, synth_store
from jigsaw_earth.data.writer import ChunkLayout
from jigsaw_earth.models.plan import Hardware, plan_mesh

from jigsaw_earth.bench.io import bench_io, format_io
from jigsaw_earth.cli import main
from jigsaw_earth.distributed.halo import Halo
from jigsaw_earth.distributed.mesh import MeshShape

GRID = (48, 96)
SPEC = VariableSpec(("geopotential", "temperature"), (500, 850), ("2m_temperature",), static=())


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("io") / "data.zarr"
    layout = ChunkLayout.for_mesh(*GRID, MeshShape(1, 2, 2))
    cfg = SynthConfig(
        n_lat=GRID[0],
        n_lon=GRID[1],
        start="2020-01-01",
        end="2020-01-02T18",
        levels=(500, 850),
        layout=layout,
    )
    synth_store(path, cfg)
    return str(path)


def test_bench_io_reads_the_same_bytes_every_way(store):
    r = bench_io(store, SPEC, (2, 2), ranks="0,3", halo=Halo.uniform(1, "pole"), repeats=2)
    assert [res["rank"] for res in r["results"]] == [0, 3]
    for res in r["results"]:
        m = res["methods"]
        assert {"reader", "checked", "raw", "zarr"} <= set(m)
        assert res["bytes"] > 0 and res["files"] > 0
        for name, v in m.items():
            assert v["ms"] > 0 and v["gbps"] > 0 and len(v["ms_all"]) == 2, name
            assert v["x_raw"] == pytest.approx(v["ms"] / m["raw"]["ms"])
    table = format_io(r)
    assert "x raw" in table and "reader" in table


def test_bench_io_cli_all_ranks_at_once_and_plan_reads_its_json(store, tmp_path, capsys):
    out = tmp_path / "io.json"
    assert (
        main(
            [
                "bench",
                "io",
                store,
                "--mesh",
                "1x2",
                "--ranks",
                "all",
                "--repeats",
                "1",
                "--halo",
                "0",
                "--cache",
                "warm",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    runs = json.loads(out.read_text())
    assert runs[0]["ranks"] == "all" and len(runs[0]["results"]) == 2
    assert "all reading at once" in capsys.readouterr().out
    plan = ["plan", "--model", "weathermixer", "--preset", "tiny", "--grid", "48x96", "--world-size", "2"]
    assert main([*plan, "--channels", "5,0,0", "--io-json", str(out)]) == 0
    assert "read ms" in capsys.readouterr().out
    plan = ["plan", "--model", "weathermixer", "--preset", "tiny", "--grid", "48x96", "--world-size", "2"]
    assert main([*plan, "--io-json", str(tmp_path / "missing.json")]) == 2
    assert "--io-json" in capsys.readouterr().err


def test_plan_prices_reading_what_bench_io_measures(store):
    """plan's bytes per rank are what the reader delivers (no halo: training reads none, the
    layers exchange it), so its read time at the measured rate is the measured time."""
    r = bench_io(store, SPEC, (2, 2), ranks="0", halo=Halo(), repeats=2)
    res = r["results"][0]
    reader = res["methods"]["reader"]
    hw = Hardware(read_gbps=reader["delivered_gbps"])
    plan = plan_mesh("weathermixer", "tiny", GRID, MeshShape(1, 2, 2), (SPEC.n_channels, 0, 0), hw)
    assert plan.read_bytes == res["delivered"]  # the tile of the inputs and one target, float32
    assert res["bytes"] == pytest.approx(res["delivered"], rel=0.2)  # stored: zstd, chunk frames
    assert plan.io_s * 1e3 == pytest.approx(reader["ms"], rel=0.2)
    slow = plan_mesh(
        "weathermixer", "tiny", GRID, MeshShape(1, 2, 2), (SPEC.n_channels, 0, 0), Hardware(read_gbps=1e-6)
    )
    assert slow.io_bound and slow.step_s == pytest.approx(slow.io_s)
    assert np.isclose(slow.samples_per_s, 1 / slow.io_s)


def test_bench_io_refuses_bad_input(store):
    with pytest.raises(ValueError, match="--ranks"):
        bench_io(store, SPEC, (2, 2), ranks="7", halo=Halo())
    assert main(["bench", "io", store, "--lead-steps", "0"]) == 2


def _sixteen_cores(monkeypatch, local_ranks: int) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_ranks))


def test_read_threads_auto_follows_the_cores_each_rank_has(monkeypatch):
    """``data.read_threads: auto`` (the default): the CPUs this process may run on shared by the
    ranks of its host; a number is capped at that; 0 and words other than auto are refused."""
    from jigsaw_earth.data.reader import read_threads

    from jigsaw_earth.config import parse_config

    assert parse_config({"data": {"store": "x"}}).data.read_threads == "auto"
    _sixteen_cores(monkeypatch, 1)  # one GPU rank on a 16-core node
    assert [read_threads("auto"), read_threads(8), read_threads(64)] == [16, 8, 16]
    _sixteen_cores(monkeypatch, 4)
    assert read_threads("auto") == 4
    _sixteen_cores(monkeypatch, 32)
    assert read_threads("auto") == 1
    for bad in (0, "many"):
        with pytest.raises(ValueError, match="read_threads"):
            parse_config({"data": {"store": "x", "read_threads": bad}})


def test_a_step_waiting_for_data_is_warned_once(tmp_path, caplog, monkeypatch):
    """Steps since the last log point that waited for data over 10 % of their time: one warning,
    naming the read threads chosen."""
    import logging

    from jigsaw_earth.training.monitor import Monitor

    from .train_helpers import tiny_config

    _sixteen_cores(monkeypatch, 2)
    cfg = tiny_config(str(tmp_path), (1, 1, 1), logging={"every": 1, "wandb": {"mode": "disabled"}})
    monitor = Monitor(cfg, tmp_path, 0, 0)
    values = {
        "loss": 1.0,
        "grad_norm": 1.0,
        "lr": 1e-3,
        "samples_per_s": 1.0,
        "memory_mb": 1.0,
        "tflops": 0.0,
        "step_time_s": 1.0,
        "compute_s": 0.95,
        "comm_s": 0.0,
        "data_s": 0.02,
        "other_s": 0.03,
    }
    with caplog.at_level(logging.WARNING):
        monitor.step(2, values)
        assert not caplog.records
        for step in (3, 4):
            monitor.step(step, {**values, "compute_s": 0.5, "data_s": 0.47})
    monitor.close()
    warned = [r.getMessage() for r in caplog.records if "waited" in r.getMessage()]
    assert len(warned) == 1 and "bench io" in warned[0]
    assert "data.read_threads=auto reads with 8 thread(s), one per core of this rank" in warned[0]
