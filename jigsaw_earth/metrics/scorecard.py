"""Scorecard: our RMSE per variable, level and lead beside the published WB1/WB2 baselines."""

from __future__ import annotations

import csv
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

__all__ = ["format_scorecard", "grid_resolution", "read_baselines", "write_scores"]

_RESOLUTIONS = {1440: "0.25deg", 240: "1.5deg", 64: "5.625deg"}


def grid_resolution(n_lon: int) -> str:
    """WB naming of a grid by its longitude count (``240`` → ``"1.5deg"``)."""
    return _RESOLUTIONS.get(n_lon, f"{360 / n_lon:g}deg")


def read_baselines(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of ``baselines_rmse.csv`` (benchmark, resolution, model, variable, level_hpa, lead_days, rmse)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"baselines file {path} not found; pass --baselines shared/reference/baselines_rmse.csv"
        )
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    needed = {"benchmark", "resolution", "model", "variable", "level_hpa", "lead_days", "rmse"}
    if rows and not needed <= set(rows[0]):
        raise ValueError(f"{path} lacks columns {sorted(needed - set(rows[0]))}")
    return rows


def _key(variable: str, level: Any, lead_days: Any) -> tuple[str, str, str]:
    lev = "" if level in (None, "") else str(int(float(level)))
    return variable, lev, str(lead_days)


def format_scorecard(rows: list[dict[str, Any]], baselines: list[dict[str, Any]], resolution: str) -> str:
    """A text table: one line per (variable, level, lead) with our models' and the published RMSEs."""
    ours: dict[tuple[str, str, float], dict[str, float]] = defaultdict(dict)
    for r in rows:
        if r["metric"] == "rmse":
            ours[(r["variable"], "" if r["level"] is None else str(r["level"]), r["lead_hours"])][
                r["model"]
            ] = r["value"]
    published: dict[tuple[str, str, str], dict[str, float]] = defaultdict(dict)
    for b in baselines:
        if b["resolution"] == resolution:
            published[_key(b["variable"], b["level_hpa"], b["lead_days"])][
                f"{b['benchmark']} {b['model']}"
            ] = float(b["rmse"])
    models = sorted({m for v in ours.values() for m in v}, key=lambda m: (m != "forecast", m))
    pub_models = sorted({m for v in published.values() for m in v})
    header = ["variable", "level", "lead_h", *models, *pub_models]
    lines = []
    for (var, lev, hours), scores in sorted(ours.items()):
        days = hours / 24
        pub = published.get(_key(var, lev or None, f"{days:g}"), {}) if days.is_integer() else {}
        pub = {**published.get(_key(var, lev or None, "all"), {}), **pub}
        lines.append(
            [var, lev or "-", f"{hours:g}"]
            + [f"{scores[m]:.4g}" if m in scores else "" for m in models]
            + [f"{pub[m]:.4g}" if m in pub else "" for m in pub_models]
        )
    widths = [max(len(str(x)) for x in col) for col in zip(header, *lines)]

    def fmt(row: list[Any]) -> str:
        return "  ".join(
            str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(row, widths))
        )

    note = f"published baselines at {resolution}" if pub_models else f"no published baselines at {resolution}"
    return "\n".join([fmt(header), *map(fmt, lines), f"({note}; RMSE = sqrt of the mean MSE over inits)"])


def write_scores(rows: list[dict[str, Any]], prefix: str | os.PathLike, info: dict[str, Any]) -> list[Path]:
    """``PREFIX.json`` (rows + run info) and ``PREFIX.csv`` (rows)."""
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    js, cs = prefix.with_name(prefix.name + ".json"), prefix.with_name(prefix.name + ".csv")
    js.write_text(json.dumps({**info, "scores": rows}, indent=1))
    with open(cs, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["model", "metric", "variable", "level", "lead_hours", "value"])
        writer.writeheader()
        writer.writerows(rows)
    return [js, cs]
