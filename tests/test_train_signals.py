"""Real signals on real training processes, started as Slurm's ``srun`` starts them (one process
per rank, ``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` in the environment, no torchrun).

* ``SIGUSR1`` (``#SBATCH --signal=USR1@…``) to rank 1 only: both ranks agree at the next step
  boundary, save one checkpoint and exit 75; the same command resumes and finishes, every step
  logged once.
* ``SIGINT`` (Ctrl-C) to a single-process run: one line, exit 130, no traceback.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from jigsaw_earth.distributed.spawn import free_port

from .train_helpers import TINY_YAML, merge_sections, rank_env

STEPS = 10


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from jigsaw_earth.data.synth import SynthConfig, synth_store

    path = tmp_path_factory.mktemp("store") / "data.zarr"
    synth_store(path, SynthConfig(n_lat=16, n_lon=32, start="2020-01-01T00", end="2020-02-12T18"))
    return path


def _config(tmp_path: Path, store: Path, lon: int) -> Path:
    raw = merge_sections(
        TINY_YAML,
        {
            "run": {"dir": str(tmp_path / "run"), "name": "signals"},
            "mesh": {"lon": lon},
            "data": {"store": str(store)},
            "training": {"steps": STEPS},
            "checkpoint": {"every": 100},
            "distributed": {"timeout_s": 120},
        },
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _start(config: Path, world: int, port: int) -> list[subprocess.Popen]:
    procs = []
    for rank in range(world):
        env = rank_env(rank, world, port)
        cmd = [sys.executable, "-m", "jigsaw_earth", "train", str(config)]
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    return procs


def _train_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [r["step"] for r in rows if r["kind"] == "train"]


def _wait_for_step(run_dir: Path, step: int, procs: list[subprocess.Popen], limit_s: float = 300) -> None:
    deadline = time.monotonic() + limit_s
    while max(_train_steps(run_dir), default=0) < step:
        assert time.monotonic() < deadline, f"never reached step {step}"
        assert all(p.poll() is None for p in procs), [p.communicate()[0][-2000:] for p in procs]
        time.sleep(0.1)


def test_sigusr1_on_one_rank_checkpoints_every_rank_and_resumes(store: Path, tmp_path: Path) -> None:
    config = _config(tmp_path, store, lon=2)
    run_dir = tmp_path / "run"
    procs = _start(config, 2, free_port())
    _wait_for_step(run_dir, 2, procs)
    procs[1].send_signal(signal.SIGUSR1)  # Slurm's warning signal, to one rank only
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [75, 75], "\n".join(o[-3000:] for o in outs)
    assert all("Traceback" not in o for o in outs), outs[0][-3000:]
    stopped = max(_train_steps(run_dir))
    assert 2 <= stopped < STEPS
    assert f"stopped on a signal to another rank after step {stopped}" in outs[0]
    ckpts = run_dir / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == f"step_{stopped:09d}"
    assert len(list((ckpts / f"step_{stopped:09d}").glob("*.distcp"))) == 2  # both ranks wrote

    procs = _start(config, 2, free_port())  # what sbatch --requeue does: the same command again
    outs = [p.communicate(timeout=400)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    assert f"{STEPS - stopped} this run" in outs[0]
    assert _train_steps(run_dir) == list(range(1, STEPS + 1))  # no step logged twice
    history = [json.loads(x) for x in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [h["start_step"] for h in history] == [0, stopped]


def test_sigint_ends_with_one_line(store: Path, tmp_path: Path) -> None:
    config = _config(tmp_path, store, lon=1)
    run_dir = tmp_path / "run"
    procs = _start(config, 1, free_port())
    _wait_for_step(run_dir, 1, procs)
    procs[0].send_signal(signal.SIGINT)
    out = procs[0].communicate(timeout=120)[0]
    assert procs[0].returncode == 130, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert out.strip().splitlines()[-1].startswith("jigsaw-earth train: interrupted (Ctrl-C)")
