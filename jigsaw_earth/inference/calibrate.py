"""``jigsaw-earth ensemble calibrate``: the amplitude of a perturbation scheme that makes a reliable ensemble.

For each amplitude of a sweep, ``predict --members N --perturb SCHEME --score`` runs on validation inits
(scored as it runs, nothing written) and the chosen fields are scored at one lead: the spread/skill
ratio (WB2's ensemble standard deviation over the ensemble mean's RMSE) and the CRPS, with their
intervals. The best amplitude has the mean ``|log spread/skill|`` over the fields closest to 0
(``by="spread-skill"``), or the lowest mean CRPS relative to each field's lowest (``by="crps"``). The
sweep is a coarse geometric list, then the geometric midpoints on either side of the best one (and a
step beyond it when it is at an end of the sweep), then one
amplitude aimed at the optimum (``aim``): where the mean ``log spread/skill`` crosses 0 between two
neighbours (interpolated in ``log amplitude``), or the vertex of the parabola through the best CRPS and
its neighbours. The
choice, its settings and the table go to a JSON file that ``predict --perturb SCHEME`` reads
(``perturb.settings_path``).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch.distributed as dist

from ..config.schema import TrainConfig
from ..mesh_setup import setup_mesh
from .perturb import SETTINGS_KIND, Perturbation
from .predict import run_prediction
from .scoring import ScoreRequest

__all__ = ["BY", "Calibration", "aim", "calibrate", "default_amplitudes", "format_table", "settings"]

log = logging.getLogger(__name__)

BY = ("spread-skill", "crps")
METRICS = ("spread_skill", "crps", "rmse", "ensemble_stddev")


def default_amplitudes(scheme: str, scale: str = "tendency") -> list[float]:
    """The coarse sweep of a scheme (in units of ``scale``; lagged: multiples of the lag difference)."""
    if scheme == "lagged":
        return [0.25, 0.5, 1.0, 1.5, 2.0]
    return [0.01, 0.03, 0.1, 0.3, 1.0] if scale == "std" else [0.1, 0.3, 1.0, 3.0, 10.0]


@dataclass
class Calibration:
    """The sweep's rows (one per amplitude: ``amplitude``, ``objective`` and per field the metrics with
    ``lower``/``upper``) and the chosen perturbation."""

    rows: list[dict[str, Any]]
    chosen: Perturbation
    by: str
    lead_hours: int
    fields: list[str]
    members: int
    inits: list[Any]


def _field(row: dict[str, Any]) -> str:
    return row["variable"] if row["level"] is None else f"{row['variable']}@{int(row['level'])}"


def _split(fields: list[str]) -> tuple[list[str], list[int]]:
    names, levels = [], []
    for f in fields:
        name, _, level = f.partition("@")
        names.append(name)
        if level:
            levels.append(int(level))
    return list(dict.fromkeys(names)), sorted(set(levels))


def _objective(rows: list[dict[str, Any]], fields: list[str], by: str) -> None:
    """Each row's ``objective`` (lower is better)."""
    for r in rows:
        if by == "spread-skill":
            r["objective"] = float(np.mean([abs(math.log(max(r[f]["spread_skill"], 1e-12))) for f in fields]))
    if by == "crps":
        best = {f: min(r[f]["crps"] for r in rows) for f in fields}
        for r in rows:
            r["objective"] = float(np.mean([r[f]["crps"] / best[f] for f in fields]))


def aim(rows: list[dict[str, Any]], fields: list[str], by: str) -> list[float]:
    """One amplitude where the optimum lies between the sampled ones (none if it does not)."""
    rows = sorted(rows, key=lambda r: r["amplitude"])
    x = [math.log(r["amplitude"]) for r in rows]
    if by == "spread-skill":
        y = [float(np.mean([math.log(max(r[f]["spread_skill"], 1e-12)) for f in fields])) for r in rows]
        for i in range(len(rows) - 1):
            if y[i] < 0 <= y[i + 1] or y[i] > 0 >= y[i + 1]:
                return [math.exp(x[i] - y[i] * (x[i + 1] - x[i]) / (y[i + 1] - y[i]))]
        return []
    i = min(range(len(rows)), key=lambda k: rows[k]["objective"])
    if 0 < i < len(rows) - 1:
        xs, ys = x[i - 1 : i + 2], [r["objective"] for r in rows[i - 1 : i + 2]]
        a, b, _ = np.polyfit(xs, ys, 2)
        if a > 0 and xs[0] < -b / (2 * a) < xs[2]:
            return [math.exp(-b / (2 * a))]
    return []


def refine(amplitudes: list[float], best: float) -> list[float]:
    """The geometric midpoints between ``best`` and its neighbours in the sorted sweep, and a third of or
    three times ``best`` where it is the sweep's smallest or largest (the optimum may lie beyond)."""
    a = sorted(amplitudes)
    i = a.index(best)
    out = [math.sqrt(a[j] * best) for j in (i - 1, i + 1) if 0 <= j < len(a)]
    if i == 0:
        out.append(best / 3)
    if i == len(a) - 1:
        out.append(best * 3)
    return out


def calibrate(cfg: TrainConfig, base: Perturbation, *, amplitudes: list[float] | None = None,
              members: int = 8, lead_hours: int = 24, by: str = "spread-skill",
              fields: list[str] | None = None, start: str, end: str, every_hours: int = 12,
              max_inits: int = 32, seed: int | None = None, checkpoint: str | None = None,
              batch_size: int | None = None) -> Calibration:  # fmt: skip
    """Sweep the amplitude of ``base`` (collective; forms the mesh of ``cfg`` once for every forecast)."""
    if by not in BY:
        raise ValueError(f"--by {by!r}: choose one of {', '.join(BY)}")
    if lead_hours <= 0 or lead_hours % cfg.data.step_hours:
        raise ValueError(
            f"--lead-hours {lead_hours}: a positive multiple of data.step_hours={cfg.data.step_hours}"
        )
    if members < 2:
        raise ValueError(
            f"--members {members}: an ensemble's spread needs at least 2 members; e.g. --members 8"
        )
    fields = list(fields or cfg.validation.variables)
    sweep = list(amplitudes or default_amplitudes(base.scheme, base.scale))
    for a in sweep:
        if not (math.isfinite(a) and a > 0):
            raise ValueError(
                f"--amplitudes {a}: every amplitude must be positive; e.g. --amplitudes 0.05 0.1 0.2"
            )
    names, levels = _split(fields)
    steps = lead_hours // cfg.data.step_hours
    mesh = setup_mesh(cfg)
    rows: list[dict[str, Any]] = []
    inits: list[Any] = []
    progress_log = logging.getLogger("jigsaw_earth.inference.progress")
    level = progress_log.level
    progress_log.setLevel(logging.ERROR)  # each forecast is scored as it runs and redone if stopped
    try:
        for stage in range(3):
            for a in sweep:
                if any(math.isclose(a, r["amplitude"]) for r in rows):
                    continue
                result = run_prediction(
                    cfg, None, checkpoint=checkpoint, start=start, end=end, steps=steps,
                    every_hours=every_hours, max_inits=max_inits, batch_size=batch_size, variables=names,
                    levels=levels or None, lead_hours=[lead_hours], score=ScoreRequest(), mesh=mesh,
                    members=members, seed=seed, perturb=replace(base, amplitude=a),
                )  # fmt: skip
                rows.append(_row(a, result.rows, fields, lead_hours))
                inits = [str(np.datetime_as_string(t, unit="h")) for t in (result.init_times.min(),
                         result.init_times.max())] + [int(result.init_times.size)]  # fmt: skip
                if mesh.rank == 0:
                    log.info("amplitude %g: %s", a, _line(rows[-1], fields))
            _objective(rows, fields, by)
            best = min(rows, key=lambda r: r["objective"])["amplitude"]
            sweep = refine([r["amplitude"] for r in rows], best) if stage == 0 else aim(rows, fields, by)
    finally:
        progress_log.setLevel(level)
        if dist.is_initialized():
            dist.destroy_process_group()
    rows.sort(key=lambda r: r["amplitude"])
    return Calibration(rows, replace(base, amplitude=best), by, lead_hours, fields, members, inits)


def _row(amplitude: float, scores: list[dict[str, Any]], fields: list[str], lead: int) -> dict[str, Any]:
    row: dict[str, Any] = {"amplitude": amplitude}
    for r in scores:
        if r["model"] == "forecast" and r["region"] == "global" and r["lead_hours"] == lead:
            f = _field(r)
            if f in fields and r["metric"] in METRICS:
                row.setdefault(f, {})[r["metric"]] = r["value"]
                row[f][r["metric"] + "_interval"] = [r["lower"], r["upper"]]
    missing = [f for f in fields if f not in row]
    if missing:
        raise ValueError(f"--fields {missing}: not among the forecast's fields; give variable@level names "
                         f"of the model, e.g. geopotential@500")  # fmt: skip
    return row


def _line(row: dict[str, Any], fields: list[str]) -> str:
    return "; ".join(
        f"{f} spread/skill {row[f]['spread_skill']:.3f}, CRPS {row[f]['crps']:.4g}" for f in fields
    )


def format_table(c: Calibration) -> str:
    """The sweep as a table: per amplitude and field the spread/skill with its interval and the CRPS."""
    head = f"{'amplitude':>10}  " + "  ".join(f"{f + ' spread/skill':>28}  {'CRPS':>9}" for f in c.fields)
    title = (f"{c.chosen.scheme} perturbations, {c.members} members, {c.inits[2]} inits {c.inits[0]} … "
             f"{c.inits[1]}, at {c.lead_hours} h (95 % intervals); chosen by {c.by}")  # fmt: skip
    lines = [title, head + "  objective"]
    for r in c.rows:
        cells = []
        for f in c.fields:
            lo, hi = r[f]["spread_skill_interval"]
            cells.append(f"{r[f]['spread_skill']:>12.3f} [{lo:6.3f}, {hi:6.3f}]  {r[f]['crps']:>9.4g}")
        mark = "  <- chosen" if math.isclose(r["amplitude"], c.chosen.amplitude) else ""
        lines.append(f"{r['amplitude']:>10.4g}  " + "  ".join(cells) + f"  {r['objective']:9.4f}{mark}")
    ends = (c.rows[0]["amplitude"], c.rows[-1]["amplitude"])
    if any(math.isclose(c.chosen.amplitude, e) for e in ends):
        lines.append(f"the chosen amplitude is at an end of the sweep: the optimum may lie beyond it (widen "
                     f"--amplitudes, or for {c.chosen.scheme} try other settings)")  # fmt: skip
    return "\n".join(lines)


def settings(c: Calibration, checkpoint: str | None) -> dict[str, Any]:
    """The chosen settings and the sweep: the JSON that ``predict --perturb`` reads."""
    return {"kind": SETTINGS_KIND, **c.chosen.describe(), "calibration": {
        "by": c.by, "lead_hours": c.lead_hours, "fields": c.fields, "members": c.members, "inits": c.inits,
        "checkpoint": checkpoint, "table": c.rows}}  # fmt: skip
