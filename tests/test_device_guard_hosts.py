"""The fake GPUs across hosts: two per simulated host (``tests/simhosts.py``), NCCL's rules on every call.

``jigsaw-earth launch --nnodes 2 --nproc-per-node 2`` on two hosts, every rank with the device
plugin (``tests/fakegpu/``) and ``FAKEGPU_COUNT=2``: each rank takes its own host's device by its local
rank (ranks 2 and 3 on ``node2``'s ``fakegpu:0`` and ``fakegpu:1``, as ``cuda:LOCAL_RANK`` on a GPU
node), NCCL's groups (``tests/fakegpu/nccl.py``) span both hosts and no two ranks of one host share a device;
the tiny WeatherMixer of ``selftest`` trains 8 steps on mesh 1 × 2 × 2 to the losses of the same run
on the CPU (1 host × 4 ranks), and no rank hands a CPU tensor to NCCL. The guard knows hosts: a
device is a host's (``nccl.py``'s "Duplicate GPU" check keys it by host name), so the latitude
axis's group of rank 0 and rank 2, both on ``fakegpu:0`` of their own host, is NCCL's to make. Slow
(the fake device's checks run in Python on every operator: 4 minutes on the loaded 2-core machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jigsaw_earth.device import PLUGIN_ENV
from jigsaw_earth.distributed.mesh import MeshShape
from jigsaw_earth.selftest import tiny_config, tiny_store

from .simhosts import SimulatedHosts, unavailable

REPO = Path(__file__).resolve().parents[1]
FAKE = "tests.fakegpu"  # the device plugin, by module name (the ranks run from the repository root)
HOSTS = ["node1", "node2"]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")]


def _config(root: Path, run: str, device: str) -> Path:
    path = root / f"{run}.yaml"
    path.write_text(yaml.safe_dump(tiny_config(root, run, device, 4, "weathermixer", MeshShape(1, 2, 2))))
    return path


def _losses(run_dir: Path) -> list[float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["loss"] for r in rows if r["kind"] == "train"]


def test_two_fake_gpus_per_host_each_rank_its_local_device(tmp_path: Path) -> None:
    tiny_store(tmp_path / "data.zarr")
    cpu = subprocess.run(
        [sys.executable, "-m", "jigsaw_earth", "launch", "--nproc-per-node", "4", "train",
         str(_config(tmp_path, "cpu", "cpu"))], cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert cpu.returncode == 0, cpu.stdout[-3000:] + cpu.stderr[-3000:]
    reports, logs = tmp_path / "reports", tmp_path / "logs"
    reports.mkdir()
    logs.mkdir()
    env = {PLUGIN_ENV: FAKE, "FAKEGPU_COUNT": "2", "FAKEGPU_REPORT": str(reports),
           "FAKENCCL_RECORD": "1", "PYTHONPATH": os.pathsep.join(sys.path)}  # fmt: skip
    with SimulatedHosts(HOSTS, shared=[tmp_path]) as hosts:
        command = ["train", str(_config(tmp_path, "fake", "fakegpu"))]
        procs = hosts.launch(HOSTS, command, per_host=2, logs=logs, env=env, cwd=REPO)
        codes = {h: p.wait(timeout=1500) for h, p in procs.items()}
    assert codes == {"node1": 0, "node2": 0}, {h: (logs / f"{h}.log").read_text()[-3000:] for h in HOSTS}
    ranks = [json.loads(p.read_text()) for p in sorted(reports.glob("rank-*.json"))]
    seats = sorted((r["rank"], r["host"], r["device"]) for r in ranks if r["calls"])
    assert seats == [(0, "node1", 0), (1, "node1", 1), (2, "node2", 0), (3, "node2", 1)], seats
    assert all(any(k.startswith("fakenccl ") for k in r["calls"]) for r in ranks if r["calls"]), ranks
    handed = [h for r in ranks for h in r["cpu_handoffs"]]
    assert not handed, "CPU tensors handed to NCCL:\n" + "\n".join(handed)
    fake, reference = _losses(tmp_path / "fake"), _losses(tmp_path / "cpu")
    assert len(fake) == len(reference) == 8
    assert fake == pytest.approx(reference, rel=1e-5)
