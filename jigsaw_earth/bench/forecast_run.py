"""One run of ``bench forecast`` in its own processes: ``python -m jigsaw_earth.bench.forecast_run
SPEC.json OUT.json``. One rank runs here with one thread; more ranks are spawned (gloo, one thread
each) through the project's spawn helper. OUT holds the slowest rank's loop times."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import torch

from ..distributed.mesh import DomainMesh, MeshShape
from ..distributed.spawn import spawn
from .forecast import forecast_worker

__all__ = ["main"]


def main(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    shape = MeshShape(1, *spec["mesh"])
    args = (spec["config"], spec["out"], spec["steps"])
    if shape.world_size == 1:
        torch.set_num_threads(1)
        times = forecast_worker(DomainMesh(shape), *args)
    else:
        times = spawn(shape, forecast_worker, *args)[0]  # reduced over the ranks: the same on each
    Path(out_path).write_text(json.dumps(times))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main(*sys.argv[1:3])
