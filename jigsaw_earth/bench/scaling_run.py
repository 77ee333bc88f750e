"""One run of ``bench scaling`` in its own processes: ``python -m jigsaw_earth.bench.scaling_run
SPEC.json OUT.json``. One rank runs here with the spec's thread count; more ranks are spawned
(gloo, one thread each) through the project's spawn helper."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import torch

from ..distributed.mesh import DomainMesh, MeshShape
from ..distributed.spawn import spawn
from .scaling import scaling_worker

__all__ = ["main"]


def main(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    shape = MeshShape(*spec["run"]["mesh"])
    args = (spec["config"], spec["grid"], spec["warmup"], spec["steps"])
    if shape.world_size == 1:
        torch.set_num_threads(spec["run"]["threads"])
        ranks = [scaling_worker(DomainMesh(shape), *args)]
    else:
        ranks = spawn(shape, scaling_worker, *args)
    Path(out_path).write_text(json.dumps(ranks))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main(*sys.argv[1:3])
