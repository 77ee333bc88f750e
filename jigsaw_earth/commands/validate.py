"""``jigsaw-earth validate``: the sharding truth table.

For every mesh it spawns ``lat × lon`` gloo ranks, runs every registered op sharded and serially
on several global sizes, and prints one row per case: the sharded and the serial float32 result's
errors against the float64 serial reference, relative to its scale (``validation.registry.Record``),
and the judge's figure (the sharded error
over what it allows, ``validation.registry``; a case passes at ≤ 1 with exact bytes). Exit
status 1 on any failure.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from ..distributed.mesh import parse_mesh
from ..distributed.spawn import spawn
from ..validation.registry import ENSEMBLE_OPS, checks, run_checks
from ..validation.user_model import check_user_model
from .checked_write import check_json, write_json

JSON_KEYS = ("op", "mesh", "passed")

log = logging.getLogger(__name__)
DEFAULT_MESHES = ["1x1", "1x2", "2x1", "2x2", "1x4", "3x1", "1x3", "2x3", "3x2", "1x2x1x3", "1x2x2x3"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="check every distributed op against its serial counterpart")
    p.add_argument(
        "--mesh",
        action="append",
        metavar="LATxLON",
        help=f"mesh to check: LATxLON, or 1xENSEMBLExLATxLON for the ensemble checks only (repeatable; "
        f"default {' '.join(DEFAULT_MESHES)})",
    )
    p.add_argument(
        "--op",
        action="append",
        metavar="NAME",
        help="only ops whose registered name starts with NAME (repeatable)",
    )
    p.add_argument(
        "--model",
        metavar="NAME",
        help="check this model (registered, or package.module:Class) instead of the registered ops, and "
        "name the first module whose output diverges from the serial run",
    )
    p.add_argument("--preset", help="the model's preset (with --model; default: its first, or tiny)")
    p.add_argument("--json", type=Path, metavar="PATH", help="write all records as a JSON list")
    p.add_argument("--list", action="store_true", help="list the registered ops and exit")
    p.set_defaults(run=run)


def _row(r: dict) -> str:
    expected = "-" if r["expected_bytes"] is None else str(r["expected_bytes"])
    verdict = "PASS" if r["passed"] else "FAIL"
    judged = max(r["judge_forward"], r["judge_backward"])
    return (
        f"{r['op']:<30} {r['mesh']:>5} {r['shape']:<44} {r['error_forward']:>9.2e} "
        f"{r['error_backward']:>9.2e} {r['serial_error_forward']:>9.2e} {r['serial_error_backward']:>9.2e} "
        f"{judged:>6.2f} {r['comm_bytes']:>10} {expected:>10} {verdict}"
    )


def divergence_line(first: dict) -> str:
    """``the first value that diverges from the serial run is …, relative error …: why``."""
    if first.get("kind") == "op":
        what = f"op {first['module']}"
        if first.get("inside"):
            what += f" (inside module {first['inside']!r}, {first['inside_class']})"
        else:
            what += " (in the model's own forward)"
    else:
        what = f"module {first['module']!r} ({first['class']})"
    return (
        f"the first value that diverges from the serial run is {what}, relative error {first['error']:.2e}: "
        f"{first['why']}"
    )


def why_failed(r: dict) -> str:
    """The reasons a truth-table row failed, one clause each."""
    out = []
    extra = r.get("extra", {})
    if extra.get("not_reproducible"):
        out.append(f"the serial reference does not reproduce itself: {extra['not_reproducible']}")
    if r["judge_forward"] > 1:
        out.append(
            f"outputs or initial parameters off by {r['judge_forward']:.3g}x what float32 rounding allows "
            f"(relative error {r['error_forward']:.2e})"
        )
    if r["judge_backward"] > 1:
        worst = extra.get("worst_backward")
        out.append(
            f"gradients off by {r['judge_backward']:.3g}x what rounding allows"
            + (f", worst: {'the input' if worst == 'input' else repr(worst)}" if worst else "")
        )
    if r["expected_bytes"] is not None and r["comm_bytes"] != r["expected_bytes"]:
        out.append(
            f"{r['comm_bytes']} bytes sent, the layers declare {r['expected_bytes']} (a layer's cost() or a "
            f"layer given another domain)"
        )
    if extra.get("param_bytes_ok") is False:
        out.append(
            f"a rank holds {extra['param_bytes_rank_max']} parameter bytes, more than 1/N of the serial "
            f"{extra['param_bytes_serial']} (a parameter not sharded: a torch layer, or "
            f"sharded_parameter(shape, None))"
        )
    return "; ".join(out) or "see the record"


def run(args: argparse.Namespace) -> int:
    if args.list:
        print("\n".join(checks()))
        return 0
    check_json(args.json, "--json", *JSON_KEYS)
    meshes = [parse_mesh(m) for m in (args.mesh or DEFAULT_MESHES)]
    for shape in meshes:
        if shape.data != 1:
            raise ValueError(
                f"validate checks domain meshes LATxLON (or 1xENSEMBLExLATxLON); got data axis {shape.data}"
            )
        if args.model and shape.ensemble != 1:
            raise ValueError(
                f"validate --model checks LATxLON meshes; got mesh {shape} with an ensemble axis"
            )
    header = (
        f"{'op':<30} {'mesh':>5} {'shape':<44} {'err fwd':>9} {'err bwd':>9} {'ser fwd':>9} {'ser bwd':>9} "
        f"{'judge':>6} {'comm B':>10} {'expected':>10} result"
    )
    if args.model:
        from ..models import model_entry
        from ..validation.user_model import check_contract

        model_entry(args.model).config(args.preset)  # a bad name or preset: one error, before spawning
        check_contract(args.model, args.preset)  # signature, output shape, parameters made in forward
    print(header)
    print("-" * len(header))
    records: list[dict] = []
    start = time.perf_counter()
    for shape in meshes:
        t0 = time.perf_counter()
        if args.model:
            result = spawn(shape, check_user_model, args.model, args.preset)[0]
            rows, first = [result["record"]], result["first_divergence"]
            if first is not None:
                rows[0]["first_divergence"] = first
                print(f"{args.model} on {shape.lat}x{shape.lon}: {divergence_line(first)}", flush=True)
        elif shape.ensemble == 1:
            rows = spawn(shape, run_checks, args.op)[0]
        else:  # an ensemble axis: the ensemble checks only (the others check one lat x lon group)
            only = [o for o in args.op or ENSEMBLE_OPS if o.startswith(ENSEMBLE_OPS)]
            rows = spawn(shape, run_checks, only)[0] if only else []
        for r in rows:
            print(_row(r), flush=True)
            if not r["passed"]:
                print(f"  why: {why_failed(r)}", flush=True)
        log.info("mesh %s: %d cases in %.1f s", shape, len(rows), time.perf_counter() - t0)
        records.extend(rows)
    failed = [r for r in records if not r["passed"]]
    print(
        f"{len(records) - len(failed)} passed, {len(failed)} failed "
        f"({len(meshes)} meshes, {time.perf_counter() - start:.1f} s)"
    )
    if args.json:
        write_json(args.json, records, "--json", *JSON_KEYS)
    return 1 if failed or not records else 0
