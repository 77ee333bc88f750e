"""What a checkpoint every 5 steps costs the trainer: blocks of 5 steps ending in no save, a
synchronous save or a background save (``checkpoint.background``), in rotation in one process on
one rank, so that the machine's load hits the three alike.

    python scripts/checkpoint_stall.py --dir runs/checkpoint-stall [--repeats 20] [key.sub=value ...]

Trains ``configs/demo.yaml`` on mesh 1 × 1 (overrides such as ``model.overrides.embed_dim=512``
make a bigger model). A background block is the save, the 5 steps its write overlaps and what is
left of the write after them (what the next save would wait for). Prints each kind's mean step
(its save included), the median ratio of each block to the no-save block of its round with the
range, the time a background save held training (the copy into host memory) and a synchronous
save's time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from jigsaw_earth.config import load_config
from jigsaw_earth.mesh_setup import setup_mesh
from jigsaw_earth.training.loop import Trainer

KINDS = ("none", "sync", "background")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="run directory (replaced)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("overrides", nargs="*", help="config overrides key.sub=value")
    args = parser.parse_args()
    torch.set_num_threads(1)
    fixed = ["mesh.lat=1", "mesh.lon=1", "training.steps=1000000", "checkpoint.keep=2"]
    quiet = ["logging.progress=false", "logging.wandb.mode=disabled", "validation.max_samples=4"]
    cfg = load_config(args.config, [f"run.dir={args.dir}", *fixed, *quiet, *args.overrides], world_size=1)
    trainer = Trainer(cfg, setup_mesh(cfg), new_run=True)

    def steps(n: int) -> None:
        for _ in range(n):
            trainer.train_step(trainer.step + 1)
            trainer.step += 1

    steps(5)  # warm-up
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    held, full = [], []
    for r in range(args.repeats):
        for kind in KINDS if r % 2 == 0 else KINDS[::-1]:
            t0 = time.perf_counter()
            if kind == "background":  # the save, the 5 steps its write overlaps, the rest of the write
                trainer.save(background=True)
                held.append(time.perf_counter() - t0)
                steps(5)
                trainer.saver.wait()
            else:
                steps(5)
                t1 = time.perf_counter()
                if kind == "sync":
                    trainer.save()
                    full.append(time.perf_counter() - t1)
            times[kind].append((time.perf_counter() - t0) / 5)
    trainer.close()
    params = sum(p.numel() for p in trainer.model.parameters())
    print(f"{params / 1e6:.2f} M parameters, {args.repeats} repeats, load average {os.getloadavg()}")
    for kind, values in times.items():
        ratios = [a / b for a, b in zip(values, times["none"])]
        print(
            f"{kind:>10}: mean step {statistics.mean(values) * 1e3:.1f} ms, ÷ none: median "
            f"{statistics.median(ratios):.3f} [{min(ratios):.2f}-{max(ratios):.2f}]"
        )
    print(
        f"a background save held training {statistics.median(held) * 1e3:.1f} ms (median); "
        f"a synchronous save took {statistics.median(full) * 1e3:.1f} ms"
    )


if __name__ == "__main__":
    main()
