"""What ``torch.compile`` did, step by step (``logging.compile_report``, ``bench compile``).

``CompileWatch.take()`` returns what Dynamo compiled since the previous call: the frames it
compiled, the graphs they made, each graph break (its reason and place: the innermost frame of
the project's code and the line in it) and each recompile (the frame and the guard that failed).
It reads Dynamo's own records (``torch._dynamo.utils``: the compilation metrics, the graph-break
reasons and the ``unique_graphs`` counter), so it costs nothing per step and changes nothing that
is compiled. A compiled model settles after its first steps: every later ``take()`` is empty
unless something recompiles (a changed shape, a Python value the code reads, the grad mode).

``summarize`` folds the records of a run into one table: every break place with its reason and
how often it was compiled, the recompiles, and the last step that compiled anything. ``CompileLog``
is the trainer's (``logging.compile_report``): one record per training step and validation, a
line on rank 0 when one compiled anything, ``compile-report-rankR.json`` in the run directory.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

__all__ = ["CompileLog", "CompileWatch", "format_record", "summarize"]

log = logging.getLogger(__name__)

_ROOT = Path(__file__).resolve().parents[2]  # the checkout: jigsaw_earth/, models/, data/
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")
# a frame Dynamo leaves to eager because it starts at a graph break: no failure
_SKIPPED = ("Unsupported", "SkipFrame", "StepUnsupported")


def _dynamo_utils() -> Any:
    import torch._dynamo.utils as utils  # private, read only: Dynamo's records of its compiles

    return utils


def _short(filename: str) -> str:
    """A source path relative to the checkout (the package's own files), else as it is."""
    path = Path(filename)
    try:
        return str(path.resolve().relative_to(_ROOT))
    except (OSError, ValueError):
        return filename


def _ours(filename: str) -> bool:
    return not _short(filename).startswith("/") and "site-packages" not in filename


def _reason(text: str) -> str:
    """The one-line cause of a graph break from Dynamo's message (the disable reason when the
    break is a ``torch.compiler.disable``d call)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    preamble = ("Encountered graph break", "Graph break")
    detail = next((line for line in lines if not line.startswith(preamble)), "")
    why = re.search(r"\(reason: ([^)]*)\)", text)
    summary = detail or (lines[0] if lines else "")
    if why and why.group(1) != "None":
        summary = f"{summary}: {why.group(1)}"
    return _ADDRESS.sub("", summary)


def _place(stack: list) -> str:
    """``file:line in function`` of the innermost frame of the project's code in a break's user
    stack (the call that broke the graph; ``comm.run_exchange``, which every exchange goes
    through, left out), with the frame that called it."""
    ours = [
        f
        for f in stack
        if not _short(f.filename).startswith("/")
        and "site-packages" not in f.filename
        and f.name != "run_exchange"
    ]
    frames = ours[-2:] if ours else stack[-1:]
    return " ← ".join(f"{_short(f.filename)}:{f.lineno} in {f.name}" for f in reversed(frames))


class CompileWatch:
    """Dynamo's compiles since the last ``take()`` (construct it before the first compiled call)."""

    def __init__(self) -> None:
        utils = _dynamo_utils()
        utils.set_compilation_metrics_limit(1_000_000)  # the default keeps 64: a model compiles more
        self._metrics = len(utils.get_compilation_metrics())
        self._breaks = len(utils.graph_break_reasons)
        self._graphs = utils.counters["stats"]["unique_graphs"]

    def take(self) -> dict[str, Any]:
        """``{"frames", "graphs", "breaks": [{"reason", "place"}], "recompiles": [{"frame",
        "reason"}], "failed": [...]}`` for the compiles since the previous call."""
        utils = _dynamo_utils()
        metrics, reasons = utils.get_compilation_metrics(), utils.graph_break_reasons
        self._metrics = min(self._metrics, len(metrics))  # torch._dynamo.reset() clears them
        self._breaks = min(self._breaks, len(reasons))
        new, broken = metrics[self._metrics :], reasons[self._breaks :]
        graphs = utils.counters["stats"]["unique_graphs"]
        record: dict[str, Any] = {
            "frames": sum(1 for m in new if m.is_forward is not False and not m.is_runtime),
            "graphs": max(0, graphs - self._graphs),
            "breaks": [{"reason": _reason(b.reason), "place": _place(b.user_stack)} for b in broken],
            "recompiles": [
                {"frame": _frame(m), "reason": " ".join(m.recompile_reason.split())}
                for m in new
                if getattr(m, "recompile_reason", None)
            ],
            "failed": [
                {"frame": _frame(m), "reason": str(m.fail_reason)[:300]}
                for m in new
                if m.fail_type and m.fail_type not in _SKIPPED
            ],
        }
        self._metrics, self._breaks, self._graphs = len(metrics), len(reasons), graphs
        return record


def _frame(m: Any) -> str:
    return f"{m.co_name} ({_short(str(m.co_filename))}:{m.co_firstlineno})"


def format_record(label: str, record: dict[str, Any]) -> str:
    """One log line: ``compile LABEL: N graphs in F frames, B graph breaks, R recompiles (…)``."""
    text = (
        f"compile {label}: {record['graphs']} graphs in {record['frames']} frames, "
        f"{len(record['breaks'])} graph breaks, {len(record['recompiles'])} recompiles"
    )
    if record["recompiles"]:
        first = record["recompiles"][0]
        text += f" (first: {first['frame']}: {first['reason'][:200]})"
    if record["failed"]:
        first = record["failed"][0]
        text += f", {len(record['failed'])} frames left uncompiled (first: {first['reason'][:200]})"
    return text


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Fold ``[{"label", "step", **take()}]`` into totals, the break places (reason, how often
    compiled) and the recompiles with their steps; ``last_step_compiling``: the last training step
    whose ``take()`` was not empty (0: none compiled anything)."""
    places: dict[tuple[str, str], int] = {}
    recompiles, last = [], 0
    for r in records:
        for b in r["breaks"]:
            places[(b["place"], b["reason"])] = places.get((b["place"], b["reason"]), 0) + 1
        recompiles += [{"label": r["label"], **x} for x in r["recompiles"]]
        if r.get("step") and (r["frames"] or r["recompiles"] or r["failed"]):
            last = max(last, r["step"])
    return {
        "graphs": sum(r["graphs"] for r in records),
        "frames": sum(r["frames"] for r in records),
        "breaks": sum(len(r["breaks"]) for r in records),
        "recompiles": len(recompiles),
        "failed": sum(len(r["failed"]) for r in records),
        "last_step_compiling": last,
        "break_places": [
            {"place": p, "reason": why, "compiled": n} for (p, why), n in sorted(places.items())
        ],
        "recompile_list": recompiles,
    }


class CompileLog:
    """The trainer's compile report: ``note`` after each step and validation, ``write`` at the end."""

    def __init__(self, run_dir: Path, rank: int):
        self.path = Path(run_dir) / f"compile-report-rank{rank}.json"
        self.rank = rank
        self.records: list[dict[str, Any]] = []
        try:
            self.watch: CompileWatch | None = CompileWatch()
        except (ImportError, AttributeError) as err:  # the records are torch's private ones
            self.watch = None
            if rank == 0:
                log.warning(
                    "logging.compile_report: this torch has no Dynamo records to read (%s); no report", err
                )

    def note(self, label: str, step: int | None) -> dict[str, Any]:
        """Record what compiled since the last note (``step``: the training step, None for a
        validation); rank 0 logs a line when anything did."""
        if self.watch is None:
            return {}
        record = {"label": label, "step": step, **self.watch.take()}
        self.records.append(record)
        if self.rank == 0 and (record["frames"] or record["recompiles"] or record["failed"]):
            log.info("%s", format_record(label, record))
        return record

    def write(self) -> dict[str, Any]:
        """Write this rank's records and their summary; rank 0 logs the summary line."""
        if self.watch is None:
            return {}
        summary = summarize(self.records)
        self.path.write_text(json.dumps({"summary": summary, "records": self.records}, indent=1))
        if self.rank == 0:
            log.info(
                "torch.compile: %d graphs, %d graph breaks at %d places, %d recompiles; the last training "
                "step that compiled anything: %d (%s)",
                summary["graphs"],
                summary["breaks"],
                len(summary["break_places"]),
                summary["recompiles"],
                summary["last_step_compiling"],
                self.path,
            )
        return summary
