"""Tables of bench results: the terminal table and ``docs/benchmarks.md`` from the JSON files."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from .parts import part_rows
from .scaling_report import scaling_markdown
from .strategy_report import strategies_markdown

__all__ = ["format_parts", "format_table", "load_results", "markdown"]

HEADER = (
    "case", "jigsaw ms", "twin ms", "ratio median [min-max]", "CPU ratio", "memory ratio",
    "twin ÷ plain form [min-max]",
)  # fmt: skip


def _rows(results: Sequence[dict], meshes: Sequence[str]) -> list[tuple[str, ...]]:
    rows = []
    for r in results:
        q = r["ratio"]
        row = (
            r["name"],
            f"{r['jigsaw_ms']:.2f}",
            f"{r['twin_ms']:.2f}",
            f"{q['median']:.2f} [{q['min']:.2f}-{q['max']:.2f}]",
            f"{r['cpu_ratio']['median']:.2f}",
            f"{r['memory']['ratio']:.2f}",
            _plain(r),
        )
        row += tuple(f"{r['meshes'][m]['peak_fraction']:.2f}" if m in r["meshes"] else "-" for m in meshes)
        rows.append(row)
    return rows


def _plain(r: dict) -> str:
    """Twin ÷ the plain form a user writes (``plain_forms.py``), where the case has one."""
    q = r.get("twin_vs_plain", {}).get("ratio")
    return f"{q['median']:.2f} [{q['min']:.2f}-{q['max']:.2f}]" if q else "-"


def _meshes(results: Sequence[dict]) -> list[str]:
    seen: list[str] = []
    for r in results:
        seen += [m for m in r["meshes"] if m not in seen]
    return seen


def format_table(results: Sequence[dict]) -> str:
    """Fixed-width table for the terminal."""
    meshes = _meshes(results)
    header = HEADER + tuple(f"mem/rank {m}" for m in meshes)
    rows = [header, *_rows(results, meshes)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows)


def format_parts(parts: dict) -> str:
    """Fixed-width table of one case's time per layer (``bench/parts.py``)."""
    header, body = part_rows(parts)
    rows = [header, *body]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows)


def _md_parts(r: dict) -> list[str]:
    header, rows = part_rows(r["parts"])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join((f"`{row[0]}`", *row[1:])) + " |" for row in rows]
    return ["", f"Time by layer of `{r['name']}` (ms per step, median; `--parts`):", "", *lines]


def load_results(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"bench report: {path} does not exist; write it with bench ... --json"
        ) from None
    except json.JSONDecodeError as err:
        raise ValueError(
            f"bench report: {path} is not JSON ({err}); write it with bench ... --json"
        ) from None
    if isinstance(data, list) and data and all(isinstance(r, dict) and "store" in r for r in data):
        return {"kind": "io", "runs": data}  # bench io's list of runs
    held = "result" if isinstance(data, dict) and data.get("kind") == "scaling" else "results"
    if not isinstance(data, dict) or "meta" not in data or held not in data:
        raise ValueError(f"bench report: {path} holds no bench results (keys 'meta' and 'results' missing)")
    return data


IO_METHODS = ("reader", "checked", "raw", "tensorstore", "zarr")


def _io_markdown(path: str, runs: Sequence[dict]) -> list[str]:
    """The section of one ``bench io`` JSON file: a row per run and rank (ms, median)."""
    out = [
        "",
        f"## Reading a rank's share of a sample (`bench io`) — {Path(path).name}",
        "",
        "Each row: `jigsaw-earth bench io STORE --mesh MESH --ranks RANKS --cache CACHE --read-threads "
        "THREADS --repeats N`; the machine is not in the file (`docs/data.md` names it).",
        "",
        "| store | mesh | ranks | cache | threads asked/used | repeats | rank | "
        + " | ".join(f"{m} ms" for m in IO_METHODS)
        + " | reader × raw | reader × tensorstore |",
        "|" + "---|" * (9 + len(IO_METHODS)),
    ]
    for r in runs:
        for res in r["results"]:
            m = res["methods"]
            ms = [f"{m[k]['ms']:.1f}" if k in m else "-" for k in IO_METHODS]
            ratios = [
                f"{m['reader'][k]:.2f}" if m["reader"].get(k) else "-" for k in ("x_raw", "x_tensorstore")
            ]
            threads = f"{r['read_threads']}/{res.get('read_threads', r['read_threads'])}"
            cells = [f"`{r['store']}`", r["mesh"], r["ranks"], r["cache"], threads, str(r["repeats"]),
                     str(res["rank"]), *ms, *ratios]  # fmt: skip
            out.append("| " + " | ".join(cells) + " |")
    return out


def _md_table(results: Sequence[dict]) -> list[str]:
    meshes = _meshes(results)
    header = (*HEADER, *(f"peak/rank {m} (of 1 rank)" for m in meshes), "sent/rank " + " · ".join(meshes))
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r, row in zip(results, _rows(results, meshes)):
        sent = " · ".join(
            f"{r['meshes'][m]['bytes_sent_max'] / 2**20:.2f} MiB" for m in meshes if m in r["meshes"]
        )
        lines.append("| " + " | ".join((f"`{row[0]}`", *row[1:], sent or "-")) + " |")
    return lines


def _load(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def markdown(runs: Sequence[tuple[str, dict]], command: str) -> str:
    """``docs/benchmarks.md``: one section per JSON file (``(path, data)``), with its metadata."""
    out = [
        "# Benchmarks",
        "",
        f"Generated by `{command}` from the JSON files named below; do not edit by hand. Each section",
        "gives the command and the machine that produced it: layers and models against their plain-PyTorch",
        "twins (`bench all`), training strategies (`bench strategies`), strong scaling (`bench scaling`),",
        "reading a rank's share of a sample (`bench io`).",
        "",
        "**Layers and models.** Each case runs a jigsaw layer or model on one rank and its plain twin",
        "(`jigsaw_earth/twins/`: the same module with each jigsaw layer computed by torch's own ops, the",
        "same weights) after checking that outputs, input and parameter gradients agree. Time is forward",
        "and backward, A/B interleaved (`A B B A …`); *ratio* is the median jigsaw/twin ratio over the",
        "repeats with its range, *CPU ratio* the same for process CPU time. *Memory ratio*: peak bytes of",
        "one step (parameters, inputs and the highest point of the bytes allocated during the step: CPU",
        "allocator events from torch.profiler, or CUDA `max_memory_allocated`). *peak/rank*: the largest",
        "rank's peak on that mesh divided by the one-rank peak of the same jigsaw case (CPU);",
        "*sent/rank*: the most bytes any rank sent in the step. On a shared CPU machine multi-rank",
        "timings measure waiting, so meshes report memory and bytes (and, with `--parts`, rank 0's time",
        "by layer, waits included). The `noise_floor` case times a twin against its own copy: its spread",
        "is what this run's noise can do to any ratio. *Twin ÷ plain form*: the twin of a convolution-like",
        "layer timed against what a user writes, `F.conv2d` / `F.conv_transpose2d` after `F.pad` (circular",
        "in longitude; zeros or the rows across the pole in latitude) on the same weights",
        "(`jigsaw_earth/bench/plain_forms.py`; both run the same aten ops, `tests/test_twins.py`).",
        "",
        "Reproduce: `jigsaw-earth bench all --json run.json` (`--device cuda`, `--dtype bf16` on a GPU;",
        "`bench layers` / `bench models --only NAME`, `--quick`, `--meshes 2x2,1x4|none`, `--repeats N`),",
        "then `jigsaw-earth bench report run.json ... --out docs/benchmarks.md`.",
        "The strategies section (jigsaw against DDP, FSDP2 and tensor parallelism) comes from",
        "`jigsaw-earth bench strategies CONFIG --world-size 4 --json strategies.json` (its command is",
        "given with it).",
    ]
    for path, data in runs:
        if data.get("kind") == "io":
            out += _io_markdown(path, data["runs"])
            continue
        if data.get("kind") == "strategies":
            out += strategies_markdown(path, data)
            continue
        if data.get("kind") == "scaling":
            out += scaling_markdown(path, data)
            continue
        meta = data["meta"]
        load = _load(meta.get("load_average", []))
        out += [
            "",
            f"## {meta['device']} {meta['dtype']} — {Path(path).name}",
            "",
            f"- command: `{meta['command']}`",
            f"- device: {meta['device_name']} ({meta.get('cpu_count')} CPUs), torch {meta['torch']}, "
            f"{meta['threads']} thread(s), {meta['dtype']}",
            f"- date: {meta['date']}; load average (1, 5, 15 min) at start: {load}"
            + (f"; at end: {_load(meta['load_average_end'])}" if "load_average_end" in meta else ""),
        ]
        kinds: dict[str, list[dict]] = {}
        for r in data["results"]:
            kinds.setdefault(r.get("kind", data.get("kind", "bench")), []).append(r)
        for kind, results in kinds.items():
            cases = "; ".join(f"`{r['name']}` {r['note']} on {r['grid'][0]}x{r['grid'][1]}" for r in results)
            out += ["", f"### {kind}", "", *_md_table(results), "", f"Cases: {cases}."]
            for r in results:
                out += _md_parts(r) if "parts" in r else []
    return "\n".join(out) + "\n"
