"""``jigsaw-earth train CONFIG [key.sub=value ...]``: train on this process's rank.

Runs as a plain single process, under ``torchrun --nproc-per-node N -m jigsaw_earth train ...``
or under Slurm ``srun`` (see ``configs/slurm/train.sbatch``). The mesh comes from the config and
must multiply to the world size.

A run already at ``training.steps`` is left as it is: ``train`` says so, prints its recorded
validation and exits 0 (raise ``training.steps`` to continue it).

Exit codes: 0 done (or already done); 1 diverged (non-finite loss) or a peer never arrived; 2 a bad
config, input or filesystem fault (one line names it and the fix; nothing of the run is lost); 75 stopped on
SIGTERM/SIGUSR1 after saving a checkpoint, or a peer's host lost (``distributed/heartbeat.py``: one
line names it and the newest complete checkpoint); rerun to resume; 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from ..config import load_config

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model from a YAML config (single process, torchrun or srun)")
    p.add_argument("config", help="YAML config file (see configs/demo.yaml, docs/training.md)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides such as optim.lr=3e-4")
    p.add_argument(
        "--new-run",
        action="store_true",
        help="run.dir holds another run: move it aside to RUN_DIR.old-K (printed) and start a new run",
    )
    p.add_argument(
        "--peak-tflops",
        type=float,
        metavar="T",
        help="peak dense TFLOP/s of one rank, for the utilisation in the step line (= logging.peak_tflops)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..mesh_setup import world_size_from_env
    from ..signals import Preempted
    from ..training import NonFiniteLossError, run_training
    from ..training.rundir import RunFinished, check_place

    overrides = list(args.overrides)
    if args.peak_tflops is not None:
        overrides.append(f"logging.peak_tflops={args.peak_tflops}")
    cfg = load_config(args.config, overrides, world_size=world_size_from_env())
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    check_place(cfg, args.config, overrides, taker=rank == 0)  # never in a store or over others' files
    if rank != 0:
        logging.getLogger().setLevel(logging.WARNING)
    try:
        summary = run_training(cfg, new_run=args.new_run)
    except Preempted as err:
        if rank == 0:
            print(f"jigsaw-earth train: {err}", file=sys.stderr)
        return err.exit_code
    except RunFinished as done:
        if rank == 0:
            print(f"jigsaw-earth train: {done}")
            table = done.run_dir / "validation.txt"
            if table.is_file():
                print(f"validation at step {done.step} ({table}):\n{table.read_text().rstrip()}")
        return 0
    except NonFiniteLossError as err:
        print(f"jigsaw-earth train: error: {err}", file=sys.stderr)
        return 1
    except TimeoutError as err:
        print(f"jigsaw-earth train: error: {err}", file=sys.stderr)
        return 1
    if rank == 0:
        rate = summary["samples_per_s"]
        rate = "" if rate is None else f", {rate:.2f} samples/s"
        loss = summary["final_loss"]
        print(
            f"trained {summary['steps']} steps on mesh {summary['mesh']} "
            f"({summary['steps_this_run']} this run, {summary['train_wall_s']:.1f} s{rate}); "
            f"final loss {'not recorded' if loss is None else f'{loss:.6f}'}"
        )
        print(f"validation at step {summary['steps']} ({int(summary['validation']['n_inits'])} inits, RMSE):")
        print(summary["table"])
        print(f"run directory: {cfg.run.dir} (metrics.jsonl, validation.txt, summary.json, checkpoints/)")
    return 0
