"""``jigsaw-earth bench io STORE --mesh LATxLON``: the tile reader against raw reads and tensorstore."""

from __future__ import annotations

import argparse
import logging

from ..argtypes import one_input
from ..bench.io import bench_io, format_io
from ..data.batch import VariableSpec
from ..data.objects import is_object_url
from ..data.store import StoreView
from ..distributed.halo import Halo
from ..distributed.mesh import parse_mesh
from .checked_write import write_json

__all__ = ["run_io"]

log = logging.getLogger(__name__)


def run_io(args: argparse.Namespace) -> int:
    one_input(args.inputs, "bench io", "store", "jigsaw-earth bench io STORE --mesh 2x2")
    path = str(args.inputs[0])
    shape = parse_mesh(args.mesh)
    if args.lead_steps < 1:
        raise ValueError(f"--lead-steps {args.lead_steps}: use 1 or more")
    if args.read_threads is not None and args.read_threads < 1:
        raise ValueError(f"--read-threads {args.read_threads}: use 1 or more")
    threads = args.read_threads or ("auto" if is_object_url(path) else 2)
    repeats = args.repeats or 5
    if repeats < 1:
        raise ValueError(f"--repeats {repeats}: use 1 or more")
    view = StoreView.open(path)
    upper, surface, _ = view.known_variables()
    levels = () if view.levels is None else tuple(int(x) for x in view.levels)
    spec = VariableSpec(tuple(upper), levels if upper else (), tuple(surface), static=())
    halo = Halo.uniform(args.halo, lat_mode="pole")
    results = []
    for cold in (False, True) if args.cache == "both" else (args.cache == "cold",):
        r = bench_io(
            path,
            spec,
            (shape.lat, shape.lon),
            ranks=args.ranks,
            halo=halo,
            lead_steps=args.lead_steps,
            threads=threads,
            hedge=not args.no_hedge,
            repeats=repeats,
            cold=cold,
        )
        print(format_io(r))
        results.append(r)
    if args.json:
        write_json(args.json, results, "--json", "ranks", "cache")
    return 0
