"""``configs/slurm/train.sbatch`` across nodes, on a Slurm cluster of simulated hosts that the test starts.

The cluster (``tests/slurm_hosts.py``): slurmctld on host ``ctl``, a slurmd on each of ``n1``, ``n2``,
``n3``, each host its own network, hostname, ``/dev/shm`` and ``/tmp``, the test's folder shared.
The job is the demo shortened as in ``tests/test_slurm.py`` (its model, loss and optimiser on a
16 × 32 store; 6 steps), submitted through the unchanged template with ``--nodes 2
--ntasks-per-node 2``: mesh 1 × 2 × 2, two ranks on each node. The reference is the same run
uninterrupted on one host × 4 ranks (``jigsaw-earth launch``), which ends bit for bit where two
hosts × 2 ranks do.

* preempted: ``scancel --signal=TERM`` once step 2 is logged; every rank saves and exits 75, the
  script requeues the job; meanwhile the first node is drained, so the requeued job runs on another
  pair of nodes, resumes from the signal's checkpoint and ends at the reference's losses, every one
  bit for bit. In the default run.
* killed node (slow): the node of rank 0 (and of the batch script) is killed once step 4's checkpoint
  is complete, as a node that crashes; slurmctld marks it DOWN and requeues the job onto the two
  nodes left, whose rank 0 is on another host: the ``run.lock`` the dead host left (its lease still
  running) does not stop it, since an earlier attempt of the same job is gone (``locks.py``); it
  resumes from step 4 and ends at the reference's losses.

Skipped with the reason where the cluster cannot start (Slurm/MUNGE not installed, not root, no
namespaces).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .slurm_cluster import FINAL_STATES, ClusterUnavailable
from .slurm_hosts import SimSlurmCluster, start_host_cluster
from .slurm_jobs import (
    PREDICT_BATCHES,
    PREDICT_TEMPLATE,
    TEMPLATE,
    JobLog,
    demo_config,
    files,
    final_loss,
    history_starts,
    recorded,
    sbatch,
    train_rows,
)

log = logging.getLogger(__name__)
STEPS = 6
TASKS_PER_NODE = 1  # mesh 1 x 1 x 2: the longitude split across the two nodes
SIGNAL_AFTER = 2  # steps logged before the preemption
JOB_LIMIT_S = 600  # one job, its requeue included; generous for a loaded 2-core machine


def _config(job_dir: Path, store: Path) -> Path:
    return demo_config(job_dir, store, STEPS, {"data": 1, "lat": 1, "lon": 2 * TASKS_PER_NODE})


class Job(JobLog):
    """One ``sbatch`` of the template on the cluster, and what it left."""

    def __init__(self, cluster: SimSlurmCluster, name: str, job_dir: Path, config: Path,
                 template: Path = TEMPLATE, *args: str):  # fmt: skip
        self.cluster, self.name, self.dir, self.run_dir = cluster, name, job_dir, job_dir / "run"
        opts = ["--nodes=2", f"--ntasks-per-node={TASKS_PER_NODE}"]
        self.id = sbatch(cluster, name, job_dir, opts, template, str(config), *args)
        self.info: dict[str, str] = {}
        self.nodes: list[list[str]] = []  # each attempt's nodes (Restarts = index), as seen running
        self.states: list[tuple[str, float]] = []  # each state seen, and when

    def poll(self) -> str:
        self.info = self.cluster.job(self.id) or self.info
        state = self.info.get("JobState", "")
        if not self.states or self.states[-1][0] != state:
            self.states.append((state, time.monotonic()))
        attempt = int(self.info.get("Restarts", "0"))
        if state == "RUNNING" and len(self.nodes) == attempt:
            self.nodes.append(self.cluster.job_nodes(self.id))
        return state

    def wait(self, done: callable, what: str, limit_s: float = JOB_LIMIT_S) -> float:  # type: ignore[valid-type]
        """Poll until ``done()``; the time it took. Fails with the job's log after ``limit_s``."""
        t0 = time.monotonic()
        while not done():
            if time.monotonic() - t0 > limit_s:
                pytest.fail(
                    f"job {self.name}: not {what} after {limit_s} s\n{self.tail()}\n{self.cluster.logs()}"
                )
            time.sleep(0.2)
        return time.monotonic() - t0

    def steps_logged(self) -> int:
        return max((r["step"] for r in train_rows(self.run_dir)), default=0)

    def resumed_step(self, at: int) -> bool:
        """Whether the requeued attempt logged its first step after resuming at step ``at``."""
        text = self.log()
        resumed = text.find(f"resumed from {self.run_dir / 'checkpoints' / f'step_{at:09d}'} at step {at}")
        return resumed >= 0 and f"step {at + 1:6d}/{STEPS}" in text[resumed:]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from jigsaw_earth.data.synth import SynthConfig, synth_store

    root = tmp_path_factory.mktemp("slurm-nodes")
    synth_store(
        root / "data.zarr", SynthConfig(n_lat=16, n_lon=32, start="2020-01-01T00", end="2020-01-20T18")
    )
    return root


@pytest.fixture(scope="module")
def cluster(root: Path):
    try:
        cluster = start_host_cluster(root / "slurm", nodes=3, shared=(root,))
    except ClusterUnavailable as err:
        pytest.skip(f"no Slurm cluster on simulated hosts: {err}")
    yield cluster
    cluster.stop()


class Reference:
    """The run uninterrupted on one host (this machine), started at once and in the background, so
    that it runs while the cluster starts and while a requeued job waits; ``run_dir`` waits for it."""

    def __init__(self, root: Path):
        config = _config(root / "reference", root / "data.zarr")
        self.dir = root / "reference"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jigsaw_earth", "launch", "--nproc-per-node", str(2 * TASKS_PER_NODE),
             "train", str(config)], cwd=self.dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip

    def run_dir(self) -> Path:
        out, _ = self.proc.communicate(timeout=900)
        assert self.proc.returncode == 0, out[-4000:]
        return self.dir / "run"


@pytest.fixture(scope="module")
def reference(root: Path):
    ref = Reference(root)
    yield ref
    if ref.proc.poll() is None:
        ref.proc.kill()
        ref.proc.communicate()


def _assert_resumed_as_reference(job: Job, reference: Path, stopped: int) -> None:
    """Requeued once, resumed at ``stopped`` and every step's loss bit for bit the reference's."""
    assert job.info.get("JobState") == "COMPLETED", job.tail()
    assert (job.info["Restarts"], job.info["ExitCode"]) == ("1", "0:0"), job.tail()  # requeued once
    assert (
        f"trained {STEPS} steps on mesh 1x1x{2 * TASKS_PER_NODE} ({STEPS - stopped} this run" in job.log()
    ), job.tail()
    assert history_starts(job.run_dir) == [0, stopped]
    rows, ref = train_rows(job.run_dir), train_rows(reference)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), job.tail()
    assert [r["loss"] for r in rows] == [r["loss"] for r in ref]  # bit for bit
    assert final_loss(job.run_dir) == final_loss(reference)
    assert not (job.run_dir / "run.lock").exists()


def test_preempted_two_node_job_resumes_on_another_pair(
    reference: Reference, cluster: SimSlurmCluster, root: Path
) -> None:
    job = Job(cluster, "preempted", root / "preempted", _config(root / "preempted", root / "data.zarr"))
    job.wait(lambda: job.poll() in FINAL_STATES or job.steps_logged() >= SIGNAL_AFTER, "at its step")
    first = list(job.nodes[0])
    out = cluster.run("scancel", "--signal=TERM", job.id)
    assert out.returncode == 0, out.stderr
    t_signal = time.monotonic()
    # the first pair is not free again: the requeued job must run on another one
    drained = cluster.run("scontrol", "update", f"NodeName={first[0]}", "State=DRAIN", "Reason=test")
    assert drained.returncode == 0, drained.stderr
    try:
        job.wait(lambda: len(job.nodes) > 1 or job.poll() in FINAL_STATES, "requeued and running")
        stop = re.search(rf"stopped on SIGTERM after step (\d+) of {STEPS}; saved ", job.log())
        assert stop, job.tail()
        stopped = int(stop[1])
        job.wait(lambda: job.resumed_step(stopped) or job.poll() in FINAL_STATES, "past its checkpoint")
        log.info("states after the signal: %s", [(s, round(t - t_signal, 1)) for s, t in job.states])
        resumed_s = time.monotonic() - t_signal
        job.wait(lambda: job.poll() in FINAL_STATES, "ended")
    finally:
        cluster.run("scontrol", "update", f"NodeName={first[0]}", "State=RESUME")
    assert f"requeueing job {job.id}" in job.log(), job.tail()
    assert (
        f"resumed from {job.run_dir / 'checkpoints' / f'step_{stopped:09d}'} at step {stopped}" in job.log()
    )
    assert len(job.nodes) == 2 and job.nodes[1] != first and first[0] not in job.nodes[1], job.nodes
    ref = reference.run_dir()
    _assert_resumed_as_reference(job, ref, stopped)
    log.info("preempted after step %d on %s, resumed on %s; first step after the resume %.1f s after the "
             "signal; final loss %r = reference %r", stopped, first, job.nodes[1], resumed_s,
             final_loss(job.run_dir), final_loss(ref))  # fmt: skip


@pytest.mark.slow
def test_killed_node_requeues_onto_the_nodes_left_and_resumes(
    reference: Reference, cluster: SimSlurmCluster, root: Path
) -> None:
    job = Job(cluster, "killed", root / "killed", _config(root / "killed", root / "data.zarr"))
    latest = job.run_dir / "checkpoints" / "latest"
    job.wait(lambda: job.poll() in FINAL_STATES or (latest.exists() and job.steps_logged() >= 3), "at step 3")
    saved = latest.read_text().strip()
    victim = job.nodes[0][0]  # rank 0's, the batch script's and the rendezvous store's node
    t_kill = time.monotonic()
    killed = cluster.kill_node(victim)
    assert killed, f"nothing to kill on {victim}"
    try:
        job.wait(lambda: len(job.nodes) > 1 or job.poll() in FINAL_STATES, "requeued and running")
        resumed_at = int(saved.split("_")[1])
        job.wait(lambda: job.resumed_step(resumed_at) or job.poll() in FINAL_STATES, "past its checkpoint")
        resumed_s = time.monotonic() - t_kill
        job.wait(lambda: job.poll() in FINAL_STATES, "ended")
        assert cluster.node_states().get(victim, "").startswith("down"), cluster.node_states()
    finally:
        cluster.boot_node(victim)  # for the tests after this one
    states = [(s, round(t - t_kill, 1)) for s, t in job.states]
    assert victim not in job.nodes[1], job.nodes
    text = job.log()
    assert f"resumed from {job.run_dir / 'checkpoints' / saved} at step {resumed_at}" in text, job.tail()
    # the lock rank 0 held on the dead node, its lease still running, is taken over at once
    left = re.search(rf"took over the lock {job.run_dir / 'run.lock'} left by a run that ended without "
                     rf"releasing it: pid \d+ on host {victim},", text)  # fmt: skip
    assert left, job.tail()
    ref = reference.run_dir()
    _assert_resumed_as_reference(job, ref, resumed_at)
    log.info("node %s killed after step %s's checkpoint; states %s; first step after the resume %.1f s after "
             "the kill, on %s; final loss %r = reference %r", victim, resumed_at, states, resumed_s,
             job.nodes[1], final_loss(job.run_dir), final_loss(ref))  # fmt: skip


@pytest.mark.slow
def test_predict_across_two_nodes_preempted_resumes_on_another_pair(
    reference: Reference, cluster: SimSlurmCluster, root: Path
) -> None:
    """``configs/slurm/predict.sbatch`` on two nodes from the reference's checkpoint, 16 inits one per
    batch: ``scancel --signal=TERM`` once 2 batches are recorded, the first node drained; the requeued
    job resumes on another pair and its store equals one host's forecast file for file, byte for byte."""
    reference.run_dir()
    config = root / "reference" / "config.yaml"
    args = ["--every-hours", "6", "--steps", "4", "--batch-size", "1"]
    one_host = root / "predict-one-host"
    one_host.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "jigsaw_earth", "launch", "--nproc-per-node", str(2 * TASKS_PER_NODE),
         "predict", str(config), *args, "--out", str(one_host / "fc.zarr")], cwd=one_host,
        capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    job_dir = root / "predict"
    job_dir.mkdir()
    job = Job(cluster, "predict", job_dir, config, PREDICT_TEMPLATE, *args, "--out", str(job_dir / "fc.zarr"))
    folder = job_dir / "fc.zarr.in-progress"
    job.wait(lambda: job.poll() in FINAL_STATES or recorded(folder) >= 2, "at 2 batches")
    first = list(job.nodes[0])
    assert cluster.run("scancel", "--signal=TERM", job.id).returncode == 0
    cluster.run("scontrol", "update", f"NodeName={first[0]}", "State=DRAIN", "Reason=test")
    try:
        job.wait(lambda: job.poll() in FINAL_STATES and len(job.nodes) > 1, "requeued and ended")
    finally:
        cluster.run("scontrol", "update", f"NodeName={first[0]}", "State=RESUME")
    assert job.info.get("JobState") == "COMPLETED", job.tail()
    assert (job.info["Restarts"], job.info["ExitCode"]) == ("1", "0:0"), job.tail()
    assert first[0] not in job.nodes[1], job.nodes
    stop = re.search(rf"stopped on SIGTERM before batch (\d+) of {PREDICT_BATCHES}; (\d+) of ", job.log())
    assert stop and 2 <= int(stop[2]) < PREDICT_BATCHES, job.tail()
    assert f"{stop[2]} of {PREDICT_BATCHES} batches recorded; starting at batch {stop[1]}" in job.log()
    mine, theirs = files(job_dir / "fc.zarr"), files(one_host / "fc.zarr")
    assert mine.keys() == theirs.keys() and [k for k in mine if mine[k] != theirs[k]] == []
    log.info("predict: stopped before batch %s of %d on %s, resumed on %s; the store equals one host's",
             stop[1], PREDICT_BATCHES, first, job.nodes[1])  # fmt: skip
