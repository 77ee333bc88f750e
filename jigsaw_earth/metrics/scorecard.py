"""Scorecard: RMSE, ACC and bias per region, variable, level and lead, with units, beside the
published WB1/WB2 RMSEs (shipped as ``baselines_rmse.csv``) and the period they were measured on;
for an ensemble forecast also WB2's ensemble metrics (CRPS, its skill and spread terms, ensemble
standard deviation, spread/skill) in a second table per block."""

from __future__ import annotations

import csv
import json
import math
import os
import textwrap
from collections import defaultdict
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "BASELINES",
    "ENSEMBLE_COLUMNS",
    "UNITLESS",
    "check_scores_output",
    "format_scorecard",
    "grid_resolution",
    "init_period",
    "published_for",
    "read_baselines",
    "read_scores",
    "write_scores",
]

WIDTH = 100
BASELINES = "baselines_rmse.csv"  # package data of jigsaw_earth.metrics
FIELDS = ["model", "metric", "region", "variable", "level", "lead_hours", "value", "unit"]
FIELDS += ["se", "lower", "upper"]
REQUIRED = FIELDS[:8]  # a score file's rows have at least these (intervals: se, lower, upper)
_RESOLUTIONS = {1440: "0.25deg", 240: "1.5deg", 64: "5.625deg"}
UNITLESS = ("acc", "spread_skill")  # every other metric is in the variable's unit
# the ensemble table's columns: metric -> header (``ensemble.ENSEMBLE_METRICS``)
ENSEMBLE_COLUMNS = {
    "crps": "CRPS",
    "crps_skill": "CRPS skill",
    "crps_spread": "CRPS spread",
    "ensemble_stddev": "ens. stddev",
    "spread_skill": "spread/skill",
}


def init_period(times: Any) -> str:
    """``"2020-01-01T00 … 2020-12-31T12, 732 inits"``: the header's period of a forecast's inits."""
    import numpy as np

    times = np.asarray(times)
    first, last = (str(np.datetime_as_string(t, unit="h")) for t in (times.min(), times.max()))
    return f"{first} … {last}, {times.size} inits"


def grid_resolution(n_lon: int) -> str:
    """WB naming of a grid by its longitude count (``240`` → ``"1.5deg"``)."""
    return _RESOLUTIONS.get(n_lon, f"{360 / n_lon:g}deg")


def read_baselines(path: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """Rows of a baselines CSV (benchmark, resolution, eval_period, model, variable, level_hpa,
    lead_days, rmse, unit); default: the published WB1/WB2 numbers shipped with the package."""
    if path is None:
        text = resources.files("jigsaw_earth.metrics").joinpath(BASELINES).read_text()
        source = f"jigsaw_earth.metrics/{BASELINES}"
    else:
        if not Path(path).is_file():
            raise FileNotFoundError(
                f"baselines file {path} not found; leave --baselines out for the shipped one"
            )
        text, source = Path(path).read_text(), str(path)
    rows = list(csv.DictReader(text.splitlines()))
    needed = {"benchmark", "resolution", "model", "variable", "level_hpa", "lead_days", "rmse"}
    if rows and not needed <= set(rows[0]):
        raise ValueError(f"{source} lacks columns {sorted(needed - set(rows[0]))}")
    return rows


def _level_key(level: Any) -> str:
    return "" if level in (None, "") else str(int(float(level)))


def published_for(
    baselines: list[dict[str, Any]], resolution: str, variable: str, level: Any
) -> list[dict[str, Any]]:
    """Published rows for one variable and level at ``resolution``."""
    return [
        b
        for b in baselines
        if b["resolution"] == resolution
        and b["variable"] == variable
        and _level_key(b["level_hpa"]) == _level_key(level)
    ]


def _fmt(v: float | None, metric: str = "rmse") -> str:
    if v is None:
        return ""
    return f"{v:.4f}" if metric in UNITLESS else f"{v:.4g}"


def _half(row: dict[str, Any] | None) -> float | None:
    """Half the width of a row's interval (None: no interval)."""
    if row is None or row.get("lower") is None or row.get("upper") is None:
        return None
    half = (float(row["upper"]) - float(row["lower"])) / 2
    return None if math.isnan(half) else half


def _cell(row: dict[str, Any] | None, metric: str) -> str:
    """``value±h``, h half the interval's width to 2 significant digits and the value to as many
    decimals, at most 5 significant digits of the value (the value alone without an interval)."""
    if row is None:
        return ""
    half, value = _half(row), row["value"]
    if half is None or half <= 0 or math.isnan(value) or value == 0:
        return _fmt(value, metric) + ("" if half is None else f"±{half:.2g}")
    decimals = max(0, min(1 - math.floor(math.log10(half)), 4 - math.floor(math.log10(abs(value)))))
    shown = f"{half:.{decimals}f}"
    return f"{value:.{decimals}f}±" + (shown if float(shown) > 0 else f"{half:.0e}")


def _published_lines(pub: list[dict[str, Any]], unit: str, period: str) -> list[str]:
    by_lead: dict[str, list[str]] = defaultdict(list)
    for b in pub:
        by_lead[b["lead_days"]].append(f"{b['model']} {float(b['rmse']):.4g}")
    first = pub[0]
    title = (
        f"published RMSE [{unit}], {first['benchmark']} {first['resolution']}, evaluated "
        f"{first.get('eval_period') or '?'} (this run: {period}):"
    )
    lines = textwrap.wrap(title, WIDTH, initial_indent="  ", subsequent_indent="    ")
    order = sorted(by_lead, key=lambda d: (d == "all", float(d) if d != "all" else 0))
    for d in order:
        label = "all leads" if d == "all" else f"{d} d"
        lines += textwrap.wrap(
            " · ".join(by_lead[d]), WIDTH, initial_indent=f"    {label}: ", subsequent_indent=" " * 8
        )
    return lines


def _ensemble_lines(values: dict[float, dict[tuple[str, str], dict]], model: str) -> list[str]:
    """The ensemble table of one block: a line per lead with ``ENSEMBLE_COLUMNS`` of ``model``."""
    heads = list(ENSEMBLE_COLUMNS.values())
    w = 17 if any(_half(r) is not None for v in values.values() for r in v.values()) else 13
    out = ["  lead  " + " ".join(h.rjust(w) for h in heads)]
    for hours in sorted(values):
        cells = [_cell(values[hours].get((m, model)), m).rjust(w) for m in ENSEMBLE_COLUMNS]
        out.append(f"{hours:>5g} h " + " ".join(cells))
    return out


def format_scorecard(
    rows: list[dict[str, Any]],
    baselines: list[dict[str, Any]],
    resolution: str,
    period: str = "?",
    members: int | None = None,
    interval: dict[str, Any] | None = None,
) -> str:
    """Text tables (at most 100 columns): per region and variable, one line per lead with RMSE and
    ACC of every model and the forecast's bias; the published RMSEs under the global tables. For an
    ensemble (``members``, or rows with ensemble metrics) a second table per block has WB2's
    ensemble metrics, and RMSE, ACC and bias are the ensemble mean's. With intervals (rows with
    ``lower`` and ``upper``) each score is printed ``value±h``, h half the width of its interval
    (``interval``: the method, confidence and inits)."""
    table: dict[tuple, dict[tuple[str, str], dict[str, Any]]] = defaultdict(dict)
    units: dict[tuple, str] = {}
    models: list[str] = []
    for r in rows:
        key = (r.get("region", "global"), r["variable"], r["level"])
        table[(*key, r["lead_hours"])][(r["metric"], r["model"])] = r
        if r["metric"] not in UNITLESS:
            units[key] = r.get("unit", "")
        if r["model"] not in models:
            models.append(r["model"])
    cols = [(m, mod) for m in ("rmse", "acc") for mod in models if any((m, mod) in v for v in table.values())]
    cols += [("bias", models[0])] if models else []
    with_interval = any(_half(r) is not None for r in rows)
    width = max(14 if with_interval else 9, *(min(len(mod), 11) for _, mod in cols)) if cols else 9
    group_names = {"rmse": "RMSE", "acc": "ACC", "bias": "bias"}
    ensemble = [m for m in models if any(("crps", m) in v for v in table.values())]
    head = (
        f"Scores at {resolution}, inits {period}. RMSE = sqrt of the mean MSE over inits; ACC against "
        f"the climatology (WB2, uncentred); RMSE and bias in the variable's unit."
    )
    if ensemble:
        size = f"an ensemble of {members} member" + "s" * (members != 1) if members else "an ensemble"
        head += (
            f" {ensemble[0]} is {size}: its RMSE, ACC and bias are the ensemble mean's (WB2's "
            f"ensemble_mean_rmse); CRPS = skill − spread/2 (fair estimator), ens. stddev = sqrt of "
            f"the mean member variance (ddof 1), spread/skill = ens. stddev / RMSE, as WB2."
        )
    if with_interval and interval:
        method = interval["method"]
        if interval.get("requested"):
            method += f", as {interval['requested']} needs more inits"
        head += (
            f" ±: half the width of the {interval['confidence']:.0%} interval ({method}, "
            f"{interval['inits']} inits)."
        )
    out = textwrap.wrap(head, WIDTH)
    blocks = sorted({k[:3] for k in table}, key=lambda k: (k[0] != "global", k[0], k[1], k[2] or 0))
    for region, var, lev in blocks:
        unit = units.get((region, var, lev), "")
        where = var if lev is None else f"{var} @ {lev} hPa"
        out += ["", f"{region} · {where} [{unit}]"]
        metrics = dict.fromkeys(c[0] for c in cols)
        groups = "".join(group_names[m].ljust((width + 1) * sum(c[0] == m for c in cols)) for m in metrics)
        out.append(" " * 8 + groups.rstrip())
        out.append("  lead  " + " ".join(mod[:11].rjust(width) for _, mod in cols))
        leads = sorted(k[3] for k in table if k[:3] == (region, var, lev))
        for hours in leads:
            vals = table[(region, var, lev, hours)]
            out.append(f"{hours:>5g} h " + " ".join(_cell(vals.get(c), c[0]).rjust(width) for c in cols))
        for model in ensemble:
            values = {k[3]: v for k, v in table.items() if k[:3] == (region, var, lev)}
            out += [" " * 8 + f"ensemble ({model})", *_ensemble_lines(values, model)]
        pub = published_for(baselines, resolution, var, lev) if region == "global" else []
        if pub:
            out += _published_lines(pub, unit, period)
    if not any(published_for(baselines, resolution, r["variable"], r["level"]) for r in rows):
        out += ["", f"(no published baselines at {resolution} for these variables)"]
    return "\n".join(out)


def _score_csv(path: Path) -> bool:
    try:
        with open(path, newline="") as f:
            return f.readline().strip() in (",".join(FIELDS), ",".join(REQUIRED))
    except (OSError, UnicodeDecodeError):
        return False


def check_scores_output(
    prefix: str | os.PathLike, option: str, protected: tuple[tuple[str, Any], ...] = ()
) -> tuple[Path, Path, Path]:
    """``PREFIX.json``, ``PREFIX.csv`` and ``PREFIX-stats.nc``, checked as outputs
    (``ownership.check_file_output``: never a run's record, never inside a store or ``protected``,
    never over a file other than an earlier score file, table or statistics file)."""
    from ..argtypes import URL
    from ..ownership import check_file_output, json_with_keys
    from .statistics import Statistics, stats_path

    text = str(prefix)
    if URL.match(text):  # before a Path folds its '//'
        raise ValueError(f"{option} {text!r} must be a local path; write locally and copy it afterwards")
    prefix = Path(prefix)
    if prefix.name in ("", ".", "..") or prefix.is_dir():
        raise ValueError(
            f"{option} {str(prefix)!r} is a folder; {option} takes a PREFIX: PREFIX.json, PREFIX.csv and "
            f"PREFIX-stats.nc are written, e.g. {option} {prefix / 'scores'}"
        )
    js, cs = prefix.with_name(prefix.name + ".json"), prefix.with_name(prefix.name + ".csv")
    st = stats_path(prefix)
    check_file_output(js, option, "score file (PREFIX.json)", json_with_keys("scores"), protected=protected)
    check_file_output(cs, option, "score table (PREFIX.csv)", _score_csv, protected=protected)
    what = "statistics file (PREFIX-stats.nc)"
    check_file_output(st, option, what, Statistics.recognise, protected=protected)
    return js, cs, st


def write_scores(
    rows: list[dict[str, Any]],
    prefix: str | os.PathLike,
    info: dict[str, Any],
    option: str = "--out",
    protected: tuple[tuple[str, Any], ...] = (),
    statistics: Any = None,
    comparisons: list[dict[str, Any]] | None = None,
) -> list[Path]:
    """``PREFIX.json`` (rows, ``comparisons`` + run info), ``PREFIX.csv`` (rows) and, given the
    per-init ``statistics``, ``PREFIX-stats.nc``, each whole or not at all; checked first
    (``check_scores_output``)."""
    js, cs, st = check_scores_output(prefix, option, protected)
    js.parent.mkdir(parents=True, exist_ok=True)
    tmp = js.with_name(js.name + ".tmp")
    extra = {} if comparisons is None else {"comparisons": comparisons}
    tmp.write_text(json.dumps({**info, "scores": rows, **extra}, indent=1))
    tmp.replace(js)
    tmp = cs.with_name(cs.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(cs)
    written = [js, cs]
    if statistics is not None:
        written.append(statistics.write(st))
    return written


def read_scores(path: str | os.PathLike) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows and run info of a ``PREFIX.json`` written by ``write_scores``.

    Store paths in the info that are relative (files written before they were made absolute) are
    taken relative to the JSON file's folder, so ``plot`` works from any directory.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"score file {path} not found; write one with `jigsaw-earth score`")
    fix = "write it again with `jigsaw-earth score`"
    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith((b"\x89HDF", b"CDF")):  # netCDF: the per-init statistics, or a forecast
        prefix = path.name.removesuffix(".nc").removesuffix("-stats")
        raise ValueError(
            f"{path} is a netCDF file (a PREFIX-stats.nc of `jigsaw-earth score`, or a forecast), not a "
            f"score file: plot the PREFIX.json written beside it ({path.with_name(prefix + '.json')}), or "
            f"score the statistics into one: jigsaw-earth score {path} --out {path.with_name(prefix)}"
        )
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"score file {path} is not valid JSON ({err}); {fix}") from None
    if not isinstance(data, dict) or not isinstance(data.get("scores"), list):
        raise ValueError(f"{path} has no 'scores' list: is it a PREFIX.json from `jigsaw-earth score`?")
    rows = data.pop("scores")
    for k, row in enumerate(rows):
        missing = [f for f in REQUIRED if not isinstance(row, dict) or f not in row]
        if missing:
            raise ValueError(f"score file {path}: row {k} lacks {missing} (rows need {REQUIRED}); {fix}")
    for key in ("forecast", "truth", "climatology"):
        value = data.get(key)
        if isinstance(value, str) and "://" not in value and not Path(value).is_absolute():
            data[key] = str(path.parent / value) if (path.parent / value).exists() else value
    return rows, data
