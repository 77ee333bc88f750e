"""``configs/slurm/train.sbatch`` run for real on a one-node Slurm cluster that the test starts.

Three jobs of a shortened demo (``configs/demo.yaml``'s model, loss and optimiser on a 16 × 32
synthetic store; 20 steps, a checkpoint every 2) are submitted at once through the unchanged
template, its ``#SBATCH`` lines overridden on the command line for 4 CPU tasks on one node:

* ``plain`` runs uninterrupted; its losses are the reference.
* ``term`` gets ``scancel --signal=TERM`` (what preemption and the time limit send to the tasks)
  once step 3 is logged and a checkpoint exists: every rank saves a checkpoint and exits 75, the
  script requeues the job, the requeued job resumes from that checkpoint and finishes.
* ``usr1`` gets ``scancel --batch --signal=USR1`` — what ``#SBATCH --signal=B:USR1@120`` sends
  before the time limit — to the batch script, whose trap forwards it to the tasks; same outcome.

Both interrupted jobs must end with Restarts=1, every step logged once, no checkpoint lost and
every loss (the final one included) equal to the uninterrupted job's.

Then two forecasts from the uninterrupted job's checkpoint through ``configs/slurm/predict.sbatch``
(16 inits, one per batch, written and scored): ``predict-plain`` runs uninterrupted; ``predict-term``
gets ``scancel --signal=TERM`` once 2 batches are recorded: every rank stops before a batch and exits
75, the script requeues the job and the requeued job resumes; its store must equal the uninterrupted
one file for file, byte for byte, and its scores exactly.

Skipped with the reason where the cluster cannot start (``tests/slurm_cluster.py``: Slurm/MUNGE not
installed, not root). Slow (``-m slow``): the default run's Slurm case is ``test_slurm_nodes.py``'s
preempted two-node ``train.sbatch``.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from .slurm_cluster import FINAL_STATES, ClusterUnavailable, SlurmCluster, start_cluster
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

pytestmark = pytest.mark.slow
log = logging.getLogger(__name__)
STEPS = 20
SIGNAL_AFTER_STEP = 3
JOBS_LIMIT_S = 900  # all three jobs, requeues included; generous for a loaded 2-core machine
# how each interrupted job is signalled: scancel options
SIGNALS = {"term": ("SIGTERM", ["--signal=TERM"]), "usr1": ("SIGUSR1", ["--batch", "--signal=USR1"])}


@dataclass
class Job(JobLog):
    name: str
    dir: Path
    id: str = ""
    info: dict[str, str] | None = None

    @property
    def run_dir(self) -> Path:
        return self.dir / "run"


def _submit(cluster: SlurmCluster, job: Job, config: Path, template: Path = TEMPLATE, *args: str) -> None:
    opts = ["--nodes=1", "--ntasks-per-node=4"]
    job.id = sbatch(cluster, job.name, job.dir, opts, template, str(config), *args)


def _mid_run(run_dir: Path) -> bool:
    """Step ``SIGNAL_AFTER_STEP`` logged and a checkpoint past step 0 saved."""
    steps = [r["step"] for r in train_rows(run_dir)]
    return max(steps, default=0) >= SIGNAL_AFTER_STEP and (run_dir / "checkpoints" / "latest").exists()


def _drive(cluster: SlurmCluster, jobs: dict[str, Job], signals: dict | None = None) -> None:
    """Signal the interrupted jobs mid-run (``signals``: name → (scancel options, ready(job)); default
    the training jobs once a step and a checkpoint are saved), then wait until every job has ended."""
    pending = signals or {
        name: (opts, lambda job: _mid_run(job.run_dir)) for name, (_, opts) in SIGNALS.items()
    }
    deadline = time.monotonic() + JOBS_LIMIT_S
    while True:
        for job in jobs.values():
            job.info = cluster.job(job.id)
        for name, (opts, ready) in list(pending.items()):
            job = jobs[name]
            if job.info.get("JobState") in FINAL_STATES:
                pytest.fail(f"job {name} ended before it was signalled\n{job.tail()}\n{cluster.logs()}")
            if ready(job):
                out = cluster.run("scancel", *opts, job.id)
                assert out.returncode == 0, f"scancel {opts} failed: {out.stderr}\n{job.tail()}"
                log.info("job %s (%s): scancel %s", name, job.id, " ".join(opts))
                del pending[name]
        if not pending and all(j.info.get("JobState") in FINAL_STATES for j in jobs.values()):
            return
        if time.monotonic() > deadline:
            tails = "\n".join(j.tail() for j in jobs.values())
            pytest.fail(f"jobs not done after {JOBS_LIMIT_S} s\n{tails}\n{cluster.logs()}")
        time.sleep(0.3)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    try:
        cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    except ClusterUnavailable as err:
        pytest.skip(f"no one-node Slurm cluster: {err}")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def jobs(cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Job]:
    from jigsaw_earth.data.synth import SynthConfig, synth_store

    root = tmp_path_factory.mktemp("jobs")
    store = root / "data.zarr"
    synth_store(store, SynthConfig(n_lat=16, n_lon=32, start="2020-01-01T00", end="2020-01-20T18"))
    jobs = {name: Job(name, root / name) for name in ("plain", *SIGNALS)}
    t0 = time.monotonic()
    for job in jobs.values():
        _submit(cluster, job, demo_config(job.dir, store, STEPS))
    _drive(cluster, jobs)
    fields = ("JobState", "Restarts", "ExitCode")
    ends = {j.name: [(j.info or {}).get(k) for k in fields] for j in jobs.values()}
    log.info("three jobs done in %.0f s: %s", time.monotonic() - t0, ends)
    return jobs


def test_sbatch_runs_the_demo_config(jobs: dict[str, Job]) -> None:
    job = jobs["plain"]
    assert job.info and job.info["JobState"] == "COMPLETED", job.tail()
    assert (job.info["Restarts"], job.info["ExitCode"]) == ("0", "0:0"), job.tail()
    assert f"trained {STEPS} steps on mesh 1x2x2 ({STEPS} this run" in job.log(), job.tail()
    assert [r["step"] for r in train_rows(job.run_dir)] == list(range(1, STEPS + 1))
    assert history_starts(job.run_dir) == [0]
    log.info("uninterrupted final loss %r", final_loss(job.run_dir))


@pytest.mark.parametrize("name", list(SIGNALS))
def test_signal_checkpoints_requeues_and_matches_uninterrupted(jobs: dict[str, Job], name: str) -> None:
    job, plain = jobs[name], jobs["plain"]
    signal_name = SIGNALS[name][0]
    text = job.log()
    assert job.info and job.info["JobState"] == "COMPLETED", job.tail()
    assert (job.info["Restarts"], job.info["ExitCode"]) == ("1", "0:0"), job.tail()  # requeued once

    stop = re.search(rf"stopped on {signal_name} after step (\d+) of {STEPS}; saved ", text)
    assert stop, job.tail()
    stopped = int(stop[1])
    assert 0 < stopped < STEPS, job.tail()
    ckpt = job.run_dir / "checkpoints" / f"step_{stopped:09d}"
    assert f"requeueing job {job.id}" in text, job.tail()
    assert f"resumed from {ckpt} at step {stopped}" in text, job.tail()
    assert f"trained {STEPS} steps on mesh 1x2x2 ({STEPS - stopped} this run" in text, job.tail()
    assert history_starts(job.run_dir) == [0, stopped]

    # nothing lost: every periodic checkpoint, the signal's one, every step logged exactly once
    saved = {p.name for p in (job.run_dir / "checkpoints").glob("step_*")}
    assert saved == {f"step_{s:09d}" for s in [*range(2, STEPS + 1, 2), stopped]}
    assert (job.run_dir / "checkpoints" / "latest").read_text().strip() == f"step_{STEPS:09d}"
    rows, reference = train_rows(job.run_dir), train_rows(plain.run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))

    # the same numbers as the uninterrupted job, exactly (same mesh, same ops: bitwise)
    assert [r["loss"] for r in rows] == [r["loss"] for r in reference]
    assert final_loss(job.run_dir) == final_loss(plain.run_dir)
    log.info("%s: stopped after step %d, requeued, final loss %r", name, stopped, final_loss(job.run_dir))


# ---------------------------------------------------------------- predict.sbatch
@pytest.fixture(scope="module")
def predict_jobs(cluster: SlurmCluster, jobs: dict[str, Job]) -> dict[str, Job]:
    plain = jobs["plain"]
    if not (plain.info and plain.info["JobState"] == "COMPLETED"):
        pytest.fail(f"the training job to forecast from did not complete\n{plain.tail()}")
    found = {name: Job(name, plain.dir.parent / name) for name in ("predict-plain", "predict-term")}
    for job in found.values():
        job.dir.mkdir()
        args = ["--every-hours", "6", "--steps", "4", "--batch-size", "1", "--out", str(job.dir / "fc.zarr"),
                "--score", "--scores", str(job.dir / "fc")]  # fmt: skip
        _submit(cluster, job, plain.dir / "config.yaml", PREDICT_TEMPLATE, *args)
    folder = found["predict-term"].dir / "fc.zarr.in-progress"
    _drive(cluster, found, {"predict-term": (["--signal=TERM"], lambda job: recorded(folder) >= 2)})
    return found


def test_predict_signalled_requeues_and_matches_uninterrupted(predict_jobs: dict[str, Job]) -> None:
    plain, term = predict_jobs["predict-plain"], predict_jobs["predict-term"]
    assert plain.info and (plain.info["JobState"], plain.info["Restarts"]) == ("COMPLETED", "0"), plain.tail()
    assert term.info and term.info["JobState"] == "COMPLETED", term.tail()
    assert (term.info["Restarts"], term.info["ExitCode"]) == ("1", "0:0"), term.tail()  # requeued once
    text = term.log()
    stop = re.search(
        rf"stopped on SIGTERM (?:before|in) batch (\d+) of {PREDICT_BATCHES}[^;]*; (\d+) of ", text
    )
    assert stop and int(stop[2]) == int(stop[1]) - 1 and 2 <= int(stop[2]) < PREDICT_BATCHES, term.tail()
    assert f"requeueing job {term.id}" in text, term.tail()
    assert f"{stop[2]} of {PREDICT_BATCHES} batches recorded; starting at batch {stop[1]}" in text, (
        term.tail()
    )
    assert sorted(p.name for p in term.dir.iterdir() if not p.name.startswith("slurm-")) == [
        "fc-stats.nc", "fc.csv", "fc.json", "fc.zarr"
    ], "nothing but the outputs is left"  # fmt: skip
    mine, theirs = files(term.dir / "fc.zarr"), files(plain.dir / "fc.zarr")
    assert mine.keys() == theirs.keys() and [k for k in mine if mine[k] != theirs[k]] == []
    rows = [json.loads((j.dir / "fc.json").read_text())["scores"] for j in (term, plain)]
    assert rows[0] == rows[1]
    log.info(
        "predict: stopped before or in batch %s of %d, requeued, same store and scores",
        stop[1],
        PREDICT_BATCHES,
    )
