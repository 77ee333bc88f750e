"""Faults through the real command line: kill -9 of one rank under torchrun --max-restarts 1,
and a peer that never arrives.

A tiny synthetic store (16 × 32, six weeks) and the tiny WeatherMixer run on 2 gloo ranks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jigsaw_earth.distributed.spawn import free_port

CONFIG = """
run: {{dir: {run_dir}, seed: 1, name: fault-test}}
mesh: {{data: 1, lat: 1, lon: 2}}
data:
  store: {store}
  train_period: ["2020-01-01", "2020-01-31T18"]
  val_period: ["2020-02-01", "2020-02-10"]
  upper_air: [geopotential, temperature]
  levels: [500, 850]
  surface: [2m_temperature]
model: {{name: weathermixer, preset: tiny}}
optim: {{lr: 2.0e-3, warmup_steps: 2}}
training: {{steps: 24, batch_size: 2}}
validation: {{lead_hours: [6], max_samples: 2, batch_size: 2}}
checkpoint: {{every: 4, keep: 2, resume: auto}}
logging: {{every: 1, progress: false, wandb: {{mode: offline}}}}
distributed: {{timeout_s: 60}}
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from jigsaw_earth.data.synth import SynthConfig, synth_store

    path = tmp_path_factory.mktemp("store") / "data.zarr"
    synth_store(path, SynthConfig(n_lat=16, n_lon=32, start="2020-01-01T00", end="2020-02-12T18"))
    return path


def _torchrun(config: Path, extra: list[str]) -> subprocess.Popen:
    # c10d rendezvous: every restart is a new rendezvous round with fresh store keys (the static
    # default can hand a restarted rank the dead peer's address from the first round).
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        *extra,
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        "--rdzv-id",
        "fault-test",
        "-m",
        "jigsaw_earth",
        "train",
        str(config),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _children_with_rank(parent: int, rank: int) -> list[int]:
    """PIDs of descendants of ``parent`` whose environment has ``RANK=<rank>``."""
    found, frontier = [], [parent]
    while frontier:
        pid = frontier.pop()
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            for kid in kids:
                frontier.append(kid)
                try:
                    env = Path(f"/proc/{kid}/environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                if f"RANK={rank}".encode() in env and b"LOCAL_RANK" in b"".join(env):
                    found.append(kid)
    return found


def _steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(x)["step"] for x in path.read_text().splitlines() if '"train"' in x]


@pytest.mark.slow
def test_kill_one_rank_restarts_and_finishes_like_a_clean_run(store: Path, tmp_path: Path) -> None:
    runs = {}
    for name in ("clean", "killed"):
        run_dir = tmp_path / name
        config = tmp_path / f"{name}.yaml"
        config.write_text(CONFIG.format(run_dir=run_dir, store=store))
        proc = _torchrun(config, ["--max-restarts", "1"])
        killed = None
        if name == "killed":
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and proc.poll() is None:
                if max(_steps(run_dir), default=0) >= 10:
                    pids = _children_with_rank(proc.pid, 1)
                    if pids:
                        killed = pids[0]
                        os.kill(killed, signal.SIGKILL)
                        break
                time.sleep(0.1)
            assert killed is not None, "never saw step 10 with a live rank 1 to kill"
        out, _ = proc.communicate(timeout=400)
        (tmp_path / f"{name}.log").write_text(out)
        errors = [ln for ln in out.splitlines() if "Error" in ln or "error:" in ln]
        assert proc.returncode == 0, "\n".join(errors[-20:]) + out[-2000:]
        runs[name] = json.loads((run_dir / "summary.json").read_text())
        runs[name]["steps_seen"] = _steps(run_dir)
        history = (run_dir / "history.jsonl").read_text().splitlines()
        runs[name]["starts"] = [json.loads(x)["start_step"] for x in history]
    starts = runs["killed"]["starts"]
    assert len(starts) == 2 and starts[1] > 0, f"the restart did not resume from a checkpoint: {starts}"
    assert runs["killed"]["steps_this_run"] < 24  # the restart resumed from a checkpoint
    # metrics.jsonl was cut back to the resumed step: every step logged exactly once
    assert runs["killed"]["steps_seen"] == list(range(1, 25))
    assert runs["killed"]["final_loss"] == pytest.approx(runs["clean"]["final_loss"], rel=1e-6, abs=0)
    assert (tmp_path / "clean" / "wandb").is_dir()  # offline wandb wrote locally, no network


def test_missing_peer_times_out_with_a_clear_error(tmp_path: Path) -> None:
    code = (
        "from jigsaw_earth.config import parse_config\n"
        "from jigsaw_earth.mesh_setup import setup_mesh\n"
        "cfg = parse_config({'data': {'store': 'x'}, 'mesh': {'lon': 2}, 'distributed': {'timeout_s': 4}})\n"
        "setup_mesh(cfg)\n"
    )
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    want = "TimeoutError: rank 0 of 2: the process group did not form within distributed.timeout_s=4"
    assert want in proc.stderr, proc.stderr[-2000:]
    assert elapsed < 60, elapsed
