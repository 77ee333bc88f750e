"""Training across hosts, on simulated hosts (tests/simhosts.py): each its own network, hostname, /dev/shm
and /tmp, the test's folder shared like a cluster's parallel file system.

* the demo on 2 hosts × 2 ranks (torchrun --nnodes 2) equals 1 host × 4 ranks bit for bit (every
  step's loss and gradient norm, the checkpoint's shards), with the shared-memory rings within each
  host and gloo between them (rank 0's log line says so per pair);
* a killed host: the survivors stop within distributed.timeout_s, each with one line naming the lost
  ranks and host, the newest complete checkpoint and the command to resume, and exit 75; the run
  resumes on the other host alone to the uninterrupted run's final loss, bit for bit;
* a cut link (nothing closed, nothing arrives): both sides stop the same way; after the link is
  mended the run resumes on another mesh, data × domain 2 × 1 × 2 with the data axis across the hosts,
  to the uninterrupted run's losses (1e-4 relative: another mesh sums in another order);
* ``slow``: predict on both hosts writes one store, each host its tiles; node2 killed mid-way, the
  resume ends with the store one host writes, file for file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from jigsaw_earth.checkpoint import latest_checkpoint
from tests.simhosts import SimulatedHosts, unavailable

REASON = unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")
REPO = Path(__file__).resolve().parents[1]
STEPS, TIMEOUT_S, FAULT_AT = 12, 15, 4  # the fault comes once step FAULT_AT's checkpoint is complete
LOST_LINE = re.compile(
    r"lost (?P<lost>ranks? [\d, -]+ on \S+) \((?P<why>[^)]*)\); "
    r"rank (?P<rank>\d) on (?P<host>\S+) stops \(exit 75\); "
    r"(newest complete checkpoint: (?P<ckpt>\S+); )?.*resume: start the same job again"
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("multinode") / "data.zarr"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "jigsaw_earth",
            "data",
            "synth",
            "--out",
            str(path),
            "--grid",
            "16x32",
            "--start",
            "2019-01-01",
            "--end",
            "2019-02-28T18",
            "--no-climatology",
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return path


def train_command(store: Path, run_dir: Path, *more: str) -> list[str]:
    return [
        "train",
        "configs/demo.yaml",
        f"data.store={store}",
        "data.train_period=[2019-01-01,2019-01-31T18]",
        "data.val_period=[2019-02-01,2019-02-28T18]",
        f"training.steps={STEPS}",
        "optim.warmup_steps=2",
        "validation.max_samples=4",
        "checkpoint.every=2",
        "logging.every=1",
        "logging.wandb.mode=disabled",
        f"distributed.timeout_s={TIMEOUT_S}",
        f"run.dir={run_dir}",
        *more,
    ]


def history(run_dir: Path) -> dict[int, tuple[float, float]]:
    """Step → (loss, grad norm), the last record of each step (a resume rewrites none)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in rows if r["kind"] == "train"}


LAUNCH = [sys.executable, "-m", "jigsaw_earth", "launch", "--nproc-per-node", "4"]  # one host × 4 ranks


def _on_this_machine(command: list[str]) -> None:
    """``jigsaw-earth launch`` of ``command`` on 1 host × 4 ranks (this machine); fails with its output."""
    done = subprocess.run([*LAUNCH, *command], cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.fixture(scope="module")
def one_host(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run on 1 host × 4 ranks (this machine)."""
    run_dir = tmp_path_factory.mktemp("one-host") / "run"
    _on_this_machine(train_command(store, run_dir))
    return run_dir


def _wait(procs: dict[str, subprocess.Popen], timeout_s: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    for host, p in procs.items():
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            pytest.fail(f"the job on {host} did not end within {timeout_s:g} s")
    return {h: p.returncode for h, p in procs.items()}


def test_two_hosts_train_as_one_host_bit_for_bit(store: Path, one_host: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with SimulatedHosts(["node1", "node2"], shared=[tmp_path, store.parent]) as hosts:
        procs = hosts.launch(hosts.names, train_command(store, run_dir), per_host=2, logs=tmp_path,
                             launcher="torchrun", cwd=REPO)  # fmt: skip
        codes = _wait(procs, 900)
    logs = {h: (tmp_path / f"{h}.log").read_text() for h in hosts.names}
    assert codes == {"node1": 0, "node2": 0}, logs
    pairs = "shared-memory rings (within a host) 2, gloo (between hosts) 4"
    assert (
        f"2 host(s): node1 ranks 0-1, node2 ranks 2-3; pairs of ranks by transport: {pairs}" in logs["node1"]
    )
    assert history(run_dir) == history(one_host)  # every step's loss and gradient norm, exactly
    assert len(history(run_dir)) == STEPS
    ours, theirs = latest_checkpoint(run_dir), latest_checkpoint(one_host)
    assert ours is not None and theirs is not None and ours.name == theirs.name
    shards = sorted(p.name for p in theirs.glob("*.distcp"))
    assert shards and shards == sorted(p.name for p in ours.glob("*.distcp"))
    for name in shards:  # each rank's shard, written on its own host into the shared folder
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name


def _run_until_fault(
    hosts: SimulatedHosts, store: Path, run_dir: Path, logs: Path
) -> dict[str, subprocess.Popen]:
    """Start the job on both hosts (jigsaw-earth launch --nnodes 2); return once the checkpoint of
    step FAULT_AT is complete (written by the ranks of both hosts)."""
    procs = hosts.launch(hosts.names, train_command(store, run_dir), per_host=2, logs=logs, cwd=REPO)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        ckpt = latest_checkpoint(run_dir) if (run_dir / "checkpoints").is_dir() else None
        if ckpt is not None and int(ckpt.name.split("_")[1]) >= FAULT_AT:
            return procs
        ended = {h: p.poll() for h, p in procs.items() if p.poll() is not None}
        assert not ended, (ended, {h: (logs / f"{h}.log").read_text()[-3000:] for h in hosts.names})
        time.sleep(0.1)
    pytest.fail("the job did not reach its first checkpoints")


def _fault_stops(
    hosts: SimulatedHosts,
    store: Path,
    run_dir: Path,
    logs: Path,
    fault: Callable[[str], object],
    left: list[str],
) -> tuple[dict[str, int], float, dict[str, str]]:
    """Run the job until step FAULT_AT's checkpoint, then ``fault`` node2 (kill or cut it) and wait for
    the ranks on the hosts ``left``: their exit codes, the seconds they took to end, their hosts' logs."""
    procs = _run_until_fault(hosts, store, run_dir, logs)
    fault_at = time.monotonic()
    fault("node2")
    codes = _wait({h: procs[h] for h in left}, 3 * TIMEOUT_S + 60)
    return codes, time.monotonic() - fault_at, {h: (logs / f"{h}.log").read_text() for h in left}


def _stops(log: str, host: str) -> dict[int, re.Match]:
    """Rank → its one 'lost … stops' line (exactly one per rank, and no traceback)."""
    found: dict[int, list[re.Match]] = {}
    for match in LOST_LINE.finditer(log):
        found.setdefault(int(match["rank"]), []).append(match)
    assert all(len(m) == 1 for m in found.values()), log
    assert all(m[0]["host"] == host for m in found.values()), log
    assert "Traceback" not in log, log
    return {r: m[0] for r, m in found.items()}


@pytest.mark.slow
def test_a_killed_host_ends_the_job_and_it_resumes_on_the_other(
    store: Path, one_host: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    with SimulatedHosts(["node1", "node2"], shared=[tmp_path, store.parent]) as hosts:
        codes, took, logs = _fault_stops(hosts, store, run_dir, tmp_path, hosts.kill, ["node1"])
        log = logs["node1"]
        assert codes == {"node1": 75}, log[-4000:]
        lines = _stops(log, "node1")
        assert sorted(lines) == [0, 1], log[-4000:]
        for m in lines.values():
            assert m["lost"] == "ranks 2-3 on node2", m.group(0)
        named = Path(lines[0]["ckpt"])
        assert named == latest_checkpoint(run_dir) and (named / "meta.json").is_file()  # complete
        print(f"killed host: survivors ended {took:.1f} s after the kill (timeout_s={TIMEOUT_S})")
        # resume on node1 alone, 4 ranks: the uninterrupted run's losses, bit for bit
        resumed = hosts.check("node1", [*LAUNCH, *train_command(store, run_dir)], cwd=REPO, timeout_s=900)
    assert f"trained {STEPS} steps" in resumed
    assert history(run_dir) == history(one_host)


def test_a_cut_link_ends_the_job_on_both_sides_and_it_resumes_on_another_mesh(
    store: Path, one_host: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    with SimulatedHosts(["node1", "node2"], shared=[tmp_path, store.parent]) as hosts:
        # a partition: no connection is closed, no message arrives
        codes, took, logs = _fault_stops(hosts, store, run_dir, tmp_path, hosts.cut, hosts.names)
        assert codes == {"node1": 75, "node2": 75}, logs
        seen = {h: _stops(logs[h], h) for h in hosts.names}
        assert sorted(seen["node1"]) == [0, 1] and sorted(seen["node2"]) == [2, 3], logs
        assert {m["lost"] for m in seen["node1"].values()} == {"ranks 2-3 on node2"}, logs["node1"]
        assert {m["lost"] for m in seen["node2"].values()} == {"ranks 0-1 on node1"}, logs["node2"]
        print(f"cut link: every rank ended {took:.1f} s after the cut (timeout_s={TIMEOUT_S})")
        hosts.mend("node2")
        # resume on data × domain 2 × 1 × 2: the data axis across the hosts, each host one domain group
        procs = hosts.launch(hosts.names, train_command(store, run_dir, "mesh.data=2", "mesh.lat=1"),
                             per_host=2, logs=tmp_path, cwd=REPO, port=29501)  # fmt: skip
        codes = _wait(procs, 900)
    assert codes == {"node1": 0, "node2": 0}, (tmp_path / "node1.log").read_text()[-3000:]
    got, want = history(run_dir), history(one_host)
    assert sorted(got) == sorted(want)
    for step, (loss, norm) in want.items():
        assert abs(got[step][0] - loss) <= 1e-4 * abs(loss) and abs(got[step][1] - norm) <= 1e-4 * abs(
            norm
        ), step


def _store_files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}  # fmt: skip


@pytest.mark.slow
def test_predict_across_hosts_resumes_after_a_lost_host_to_one_hosts_store(
    store: Path, one_host: Path, tmp_path: Path
) -> None:
    """Each host writes its tiles into one store; node2 killed after 2 of 8 batches: node1's ranks stop
    with the line (exit 75), the recorded batches kept; node2 rebooted (a replacement node), the same
    command resumes on both hosts, and the store equals one host's, file for file."""
    predict = ["predict", *train_command(store, one_host)[1:], "--steps", "2", "--max-inits", "8",
               "--batch-size", "1"]  # fmt: skip
    ref = tmp_path / "one-host.zarr"
    _on_this_machine([*predict, "--out", str(ref)])
    out = tmp_path / "two-hosts.zarr"
    recorded = Path(f"{out}.in-progress") / "_progress" / "rank-00000.json"
    with SimulatedHosts(["node1", "node2"], shared=[tmp_path, store.parent, one_host.parent]) as hosts:
        procs = hosts.launch(hosts.names, [*predict, "--out", str(out)], per_host=2, logs=tmp_path, cwd=REPO)
        deadline = time.monotonic() + 600
        while not (recorded.is_file() and json.loads(recorded.read_text() or "{}").get("batches", 0) >= 2):
            assert time.monotonic() < deadline and procs["node1"].poll() is None, (
                tmp_path / "node1.log"
            ).read_text()
            time.sleep(0.05)
        hosts.kill("node2")
        assert _wait({"node1": procs["node1"]}, 3 * TIMEOUT_S + 60) == {"node1": 75}
        log = (tmp_path / "node1.log").read_text()
        lines = _stops(log, "node1")
        assert sorted(lines) == [0, 1] and f"the batches recorded so far stay in {out}.in-progress" in log, (
            log
        )
        hosts.boot("node2")
        procs = hosts.launch(hosts.names, [*predict, "--out", str(out)], per_host=2, logs=tmp_path, cwd=REPO,
                             port=29501)  # fmt: skip
        assert _wait(procs, 900) == {"node1": 0, "node2": 0}, (tmp_path / "node1.log").read_text()[-3000:]
    assert _store_files(out) == _store_files(ref)
