"""What the Slurm tests submit and read back: the shortened demo config, ``sbatch`` of a template, and a
job's log, metrics, checkpoints and forecast files (``tests/test_slurm.py``, ``tests/test_slurm_nodes.py``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import yaml

from .slurm_cluster import SlurmCluster

__all__ = [
    "PREDICT_BATCHES",
    "PREDICT_TEMPLATE",
    "REPO",
    "TEMPLATE",
    "JobLog",
    "demo_config",
    "files",
    "final_loss",
    "history_starts",
    "recorded",
    "sbatch",
    "train_rows",
]

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "configs" / "slurm" / "train.sbatch"
PREDICT_TEMPLATE = REPO / "configs" / "slurm" / "predict.sbatch"
PREDICT_BATCHES = 16  # inits of the validation period at 6 h with 4 steps of targets, one per batch


def demo_config(job_dir: Path, store: Path, steps: int, mesh: dict[str, int] | None = None) -> Path:
    """``configs/demo.yaml`` shortened: the same model, loss and optimiser; a small store, ``steps``
    steps, a checkpoint every 2 (all kept: the tests count them); written as ``job_dir/config.yaml``."""
    raw = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    raw["run"]["dir"] = str(job_dir / "run")
    if mesh is not None:
        raw["mesh"] = mesh
    raw["data"].update(store=str(store), train_period=["2020-01-01", "2020-01-15T18"])
    raw["data"]["val_period"] = ["2020-01-16", "2020-01-20T18"]
    raw["optim"]["warmup_steps"] = 2
    raw["training"]["steps"] = steps
    raw["validation"].update(lead_hours=[6], max_samples=4, batch_size=4)
    raw["checkpoint"].update(every=2, keep=steps)
    raw["logging"].update(every=1, progress=False, wandb={"mode": "disabled"})
    job_dir.mkdir(parents=True)
    path = job_dir / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def sbatch(
    cluster: SlurmCluster, name: str, job_dir: Path, opts: list[str], template: Path, *args: str
) -> str:
    """Submit ``template`` with ``args`` and ``opts`` (its ``#SBATCH`` lines overridden) from a shell with
    this interpreter's ``python`` first on PATH and no launcher variables; the job id."""
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in cluster.env.items() if k not in launcher}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    out = cluster.run(
        "sbatch", "--parsable", f"--job-name=jigsaw-{name}", *opts, "--cpus-per-task=1", "--gpus-per-node=0",
        f"--output={job_dir}/slurm-%j.out", f"--chdir={job_dir}", str(template), *args, env=env,
    )  # fmt: skip
    assert out.returncode == 0, f"sbatch failed: {out.stderr}\n{cluster.logs()}"
    return out.stdout.strip().split(";")[0]


class JobLog:
    """A submitted job's output file, for assertions and failure messages (``name``, ``dir``, ``id``,
    ``info`` set by the class that mixes it in)."""

    name: str
    dir: Path
    id: str
    info: dict[str, str] | None

    def log(self) -> str:
        path = self.dir / f"slurm-{self.id}.out"
        return path.read_text(errors="replace") if path.exists() else f"(no {path})"

    def tail(self, n: int = 60) -> str:
        lines = [x for x in self.log().splitlines() if "Warning" not in x and "warnings.warn" not in x]
        return f"--- job {self.name} ({self.id}) {self.info} ---\n" + "\n".join(lines[-n:])


def train_rows(run_dir: Path) -> list[dict]:
    """The training rows of ``metrics.jsonl`` written so far (a line being written left out)."""
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().split("\n")[:-1] if path.exists() else []
    return [r for r in (json.loads(x) for x in lines if x.strip()) if r["kind"] == "train"]


def final_loss(run_dir: Path) -> float:
    return json.loads((run_dir / "summary.json").read_text())["final_loss"]


def history_starts(run_dir: Path) -> list[int]:
    """The step each attempt of the run started at."""
    return [json.loads(x)["start_step"] for x in (run_dir / "history.jsonl").read_text().splitlines()]


def recorded(folder: Path) -> int:
    """Batches an unfinished forecast folder has recorded (0 before its request is written)."""
    from jigsaw_earth.inference.unfinished import batches_done, read_request

    info = read_request(folder)
    return batches_done(folder, int(info["world"])) if info else 0


def files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path → bytes)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
