"""The table of docs/ensembles.md ("Ensembles from any model", measured) from `score`'s JSON files.

Each file is `score ENSEMBLE.zarr --against DETERMINISTIC.zarr --out PREFIX`'s PREFIX.json; per file and
field at one lead it prints a markdown row: spread/skill, CRPS and the ensemble mean's RMSE with their
95 % intervals, and the paired relative differences of CRPS and RMSE against the deterministic
forecast (`*`: significant after the correction over the comparison's cells).

    python scripts/ensemble_table.py runs/ens/{gaussian,correlated,bred,lagged}-scores.json \
        --fields geopotential@500 temperature@850 --lead 24
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _field(row: dict) -> str:
    return row["variable"] if row["level"] is None else f"{row['variable']}@{int(row['level'])}"


def _cell(value: float, lower: float, upper: float, digits: int = 3) -> str:
    return f"{value:.{digits}g} [{lower:.{digits}g}, {upper:.{digits}g}]"


def rows(path: Path, fields: list[str], lead: float) -> list[str]:
    data = json.loads(path.read_text())
    scheme = path.name.removesuffix(".json").removesuffix("-scores")
    scores = {(r["metric"], _field(r)): r for r in data["scores"]
              if (r["model"], r["region"], r["lead_hours"]) == ("forecast", "global", lead)}  # fmt: skip
    against = {(r["metric"], _field(r)): r for r in data.get("comparisons", [])
               if r["against"] not in ("persistence", "climatology") and r["region"] == "global"
               and r["lead_hours"] == lead}  # fmt: skip
    out = []
    for f in fields:
        s, c, e = scores[("spread_skill", f)], scores[("crps", f)], scores[("rmse", f)]
        diff = []
        for metric in ("crps", "rmse"):
            d = against[(metric, f)]
            star = "*" if d["significant"] else ""
            diff.append(f"{100 * d['relative']:+.1f} % [{100 * d['relative_lower']:+.1f}, "
                        f"{100 * d['relative_upper']:+.1f}]{star}")  # fmt: skip
        out.append(f"| {scheme} | {f} | {_cell(s['value'], s['lower'], s['upper'])} | "
                   f"{_cell(c['value'], c['lower'], c['upper'], 4)} | {diff[0]} | "
                   f"{_cell(e['value'], e['lower'], e['upper'], 4)} | {diff[1]} |")  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scores", nargs="+", type=Path, help="PREFIX.json files of `score … --against`")
    p.add_argument("--fields", nargs="+", default=["geopotential@500", "temperature@850"])
    p.add_argument("--lead", type=float, default=24.0, help="lead in hours (default 24)")
    args = p.parse_args()
    print("| scheme | field | spread/skill | CRPS | CRPS vs the deterministic MAE | ensemble-mean RMSE | "
          "RMSE vs the deterministic |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for path in args.scores:
        print("\n".join(rows(path, args.fields, args.lead)))


if __name__ == "__main__":
    main()
