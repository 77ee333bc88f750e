"""What a comparison says, as text and as an ECMWF-style scorecard PNG.

``format_comparisons`` prints, per comparison (the forecast against persistence, climatology or
``--against``), region and field, a line per lead with each score's relative difference, its interval
and ``*`` where it is significant after the correction. ``plot_significance`` draws
``significance-AGAINST.png``: a cell per field and score (rows) × region and lead (columns), green
where the forecast is better, red where it is worse, strong with a triangle only where the difference
is significant after the multiple-testing correction, pale where it is not; the method, confidence,
number of inits and correction are printed on it.
"""

from __future__ import annotations

import os
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from .figures import pyplot, save_figure

__all__ = ["card_name", "format_comparisons", "plot_significance", "significance_figure"]

NAMES = {"rmse": "RMSE", "acc": "ACC", "crps": "CRPS"}
COLOURS = {  # (better, significant) -> face colour
    (True, True): "#1a9641",
    (True, False): "#c7e9c0",
    (False, True): "#d7191c",
    (False, False): "#fdd0a2",
}


def card_name(against: str) -> str:
    """The PNG of the comparison with ``against``."""
    return f"significance-{against}.png"


def _field(var: str, level: Any) -> str:
    return var if level is None else f"{var}@{level}"


def _percent(x: float) -> str:
    return "nan" if np.isnan(x) else f"{100 * x:+.1f}"


def _header(rows: list[dict[str, Any]], interval: dict[str, Any]) -> str:
    n = len(rows)
    correction = {"holm": "Holm", "bh": "Benjamini–Hochberg", "none": "no correction"}[interval["correction"]]
    return (
        f"{rows[0]['model']} against {rows[0]['against']}: relative difference of each score in % [its "
        f"{interval['confidence']:.0%} interval] ({interval['method']}"
        f"{', as ' + interval['requested'] + ' needs more inits' if interval.get('requested') else ''}, "
        f"{interval['inits']} inits); * "
        f"significant after {correction} over these {n} cells"
    )


def format_comparisons(rows: list[dict[str, Any]], interval: dict[str, Any]) -> str:
    """Text blocks (at most 100 columns) of ``significance.compare_rows``' rows."""
    out: list[str] = []
    for against in dict.fromkeys(r["against"] for r in rows):
        mine = [r for r in rows if r["against"] == against]
        metrics = list(dict.fromkeys(r["metric"] for r in mine))
        out += ["", *textwrap.wrap(_header(mine, interval), 100)]
        blocks: dict[tuple, dict[float, dict[str, dict]]] = defaultdict(lambda: defaultdict(dict))
        for r in mine:
            blocks[(r["region"], _field(r["variable"], r["level"]))][r["lead_hours"]][r["metric"]] = r
        for (region, field), leads in blocks.items():
            out.append(f"  {region} · {field}")
            out.append("    lead " + "".join(f"{NAMES.get(m, m) + ' Δ %':>27}" for m in metrics))
            for hours in sorted(leads):
                cells = []
                for m in metrics:
                    r = leads[hours].get(m)
                    if r is None:
                        cells.append(" " * 27)
                        continue
                    span = f"[{_percent(r['relative_lower'])}, {_percent(r['relative_upper'])}]"
                    mark = "*" if r["significant"] else " "
                    cells.append(f"{_percent(r['relative'])} {span}{mark}".rjust(27))
                out.append(f"  {hours:>5g} h" + "".join(cells))
    return "\n".join(out)


def significance_figure(rows: list[dict[str, Any]], interval: dict[str, Any]) -> Any:
    """The scorecard figure of one comparison's rows (a matplotlib ``Figure``)."""
    plt = pyplot()
    lines = list(dict.fromkeys((_field(r["variable"], r["level"]), r["metric"]) for r in rows))
    regions = list(dict.fromkeys(r["region"] for r in rows))
    leads = sorted({r["lead_hours"] for r in rows})
    columns = [(reg, h) for reg in regions for h in leads]
    cell = {(_field(r["variable"], r["level"]), r["metric"], r["region"], r["lead_hours"]): r for r in rows}
    fig, ax = plt.subplots(figsize=(2.2 + 0.45 * len(columns), 1.4 + 0.32 * len(lines)))
    for i, (field, metric) in enumerate(lines):
        for j, (region, hours) in enumerate(columns):
            r = cell.get((field, metric, region, hours))
            if r is None or np.isnan(r["value"]):
                continue
            ax.add_patch(plt.Rectangle((j, i), 1, 1, color=COLOURS[(r["better"], r["significant"])], lw=0))
            if r["significant"]:
                ax.text(j + 0.5, i + 0.5, "▲" if r["better"] else "▼", ha="center", va="center", fontsize=8,
                        color="white")  # fmt: skip
    ax.set_xlim(0, len(columns))
    ax.set_ylim(len(lines), 0)
    ax.set_yticks(np.arange(len(lines)) + 0.5, [f"{NAMES.get(m, m)} {f}" for f, m in lines], fontsize=8)
    ax.set_xticks(np.arange(len(columns)) + 0.5, [f"{h:g}" for _, h in columns], fontsize=7)
    ax.set_xlabel("lead (hours), per region")
    for k, region in enumerate(regions):
        ax.axvline(k * len(leads), color="k", lw=1)
        ax.text((k + 0.5) * len(leads), -0.2, region, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(np.arange(len(columns) + 1), minor=True)
    ax.set_yticks(np.arange(len(lines) + 1), minor=True)
    ax.grid(which="minor", color="white", lw=1)
    ax.tick_params(which="minor", length=0)
    fig.suptitle(
        f"{rows[0]['model']} against {rows[0]['against']} · {interval['method']}, "
        f"{interval['confidence']:.0%} intervals, {interval['inits']} inits, {interval['correction']} over "
        f"{len(rows)} cells\n▲ green: significantly better · ▼ red: significantly worse · "
        "pale: not significant",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def plot_significance(
    rows: list[dict[str, Any]], interval: dict[str, Any], out_dir: str | os.PathLike
) -> list[Path]:
    """``significance-AGAINST.png`` for every comparison in ``rows``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        save_figure(significance_figure([r for r in rows if r["against"] == against], interval),
                    out_dir / card_name(against), 110)
        for against in dict.fromkeys(r["against"] for r in rows)
    ]  # fmt: skip
