"""Pictures of a score: a scorecard PNG per region (RMSE and ACC against lead for the model, the
persistence and climatology baselines and the published numbers; for an ensemble also its spread
beside its ensemble-mean RMSE, and its CRPS) and maps of forecast, truth and error (an ensemble's
mean, and its spread). matplotlib draws them (Agg, no display needed); cartopy adds coastlines when
installed."""

from __future__ import annotations

import logging
import os
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from ..data.store import open_dataset
from ..data.variables import VARIABLES
from ..ownership import check_dir_output, png_of_ours
from .engine import MEMBER
from .evaluate import normalise
from .figures import pyplot, save_figure
from .scorecard import published_for
from .significance_card import card_name, plot_significance

__all__ = [
    "check_plot_dir",
    "maps_unavailable",
    "plot_all",
    "plot_files",
    "plot_maps",
    "plot_scorecard",
    "scorecard_figure",
]

log = logging.getLogger(__name__)

# One level per upper-air variable in the scorecard picture (WB2's headline levels, from the table of
# variables); the printed scorecard and the score files have every level.
HEADLINE_LEVELS = {v.name: v.headline_level for v in VARIABLES if v.headline_level is not None}
CMAPS = {v.name: v.cmap for v in VARIABLES}  # the colour map of each variable's maps
STYLE = {
    "persistence": {"color": "tab:gray", "linestyle": "--"},
    "climatology": {"color": "tab:brown", "linestyle": ":"},
}


def _label(var: str, level: Any) -> str:
    return var if level is None else f"{var} @ {level} hPa"


TITLE_CHARS = 44  # a panel title's line at fontsize 10 fits a 5-inch panel (wrapped beyond)


def _title(ax, text: str, fontsize: float = 10) -> None:
    """A panel title wrapped to the panel's width, so it is never cut at the figure's edge."""
    ax.set_title(textwrap.fill(text, TITLE_CHARS, break_on_hyphens=False), fontsize=fontsize)


def plot_files(regions: list[str], variables: list[str], against: list[str] = ()) -> list[str]:
    """The PNG names ``plot_all`` may write: a scorecard per region, a map per variable, a
    significance card per comparison."""
    return (
        [f"scorecard-{r}.png" for r in dict.fromkeys(regions)]
        + [f"map-{v}.png" for v in dict.fromkeys(variables)]
        + [card_name(a) for a in dict.fromkeys(against)]
    )


def check_plot_dir(
    out_dir: str | os.PathLike,
    regions: list[str],
    variables: list[str],
    option: str,
    protected: tuple = (),
    against: list[str] = (),
) -> Path:
    """``out_dir`` may receive the pictures of ``regions`` and ``variables``
    (``ownership.check_dir_output``): not in a store or a run's records, and every PNG of the
    same name already there is one jigsaw-earth drew."""
    files = dict.fromkeys(plot_files(regions, variables, against), png_of_ours)
    return check_dir_output(out_dir, option, files, protected=protected, what="picture")


def maps_unavailable(info: dict[str, Any]) -> str | None:
    """Why ``plot_all`` draws no maps for a score file's ``info`` (``None``: it draws them)."""
    fc, truth = info.get("forecast"), info.get("truth")
    if not fc:
        return "the score file names no forecast store (predict --score without --out writes none)"
    if not truth:
        return "the score file names no truth store (score it again with this version)"
    for what, path in (("forecast", fc), ("truth", truth)):
        if "://" not in path and not Path(path).exists():
            return f"its {what} store {path} is not found (moved or deleted?)"
    return None


def plot_scorecard(
    rows: list[dict[str, Any]], baselines: list[dict[str, Any]], resolution: str, out_dir: str | os.PathLike
) -> list[Path]:
    """``scorecard-REGION.png``: per variable RMSE and ACC against lead (days); upper-air variables
    at their headline level (``HEADLINE_LEVELS``). An ensemble adds its spread (ensemble stddev,
    dashed) to the RMSE panel, as WB2's spread-and-skill plot, and a CRPS panel."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    regions = dict.fromkeys(r.get("region", "global") for r in rows)
    return [
        save_figure(scorecard_figure(rows, baselines, resolution, r), out_dir / f"scorecard-{r}.png", 110)
        for r in regions
    ]


def scorecard_figure(
    rows: list[dict[str, Any]], baselines: list[dict[str, Any]], resolution: str, region: str
) -> Any:
    """The scorecard figure of ``region`` (a matplotlib ``Figure``, laid out, not saved)."""
    plt = pyplot()
    series: dict[tuple, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    bands: dict[tuple, dict[float, tuple[float, float]]] = defaultdict(dict)  # the intervals, shaded
    units: dict[tuple, str] = {}
    for r in rows:
        key = (r.get("region", "global"), r["variable"], r["level"], r["metric"])
        series[key][r["model"]].append((r["lead_hours"] / 24, r["value"]))
        units[key] = r.get("unit", "")
        if r.get("lower") is not None and r.get("upper") is not None:
            bands[(*key, r["model"])][r["lead_hours"] / 24] = (float(r["lower"]), float(r["upper"]))
    fields = _headline(list(dict.fromkeys(k[1:3] for k in series if k[0] == region)))
    ensemble = any(k[0] == region and k[3] == "crps" for k in series)
    n_col = 3 if ensemble else 2
    size = (5 * n_col, 2.6 * len(fields) + 0.6)
    fig, axes = plt.subplots(len(fields), n_col, figsize=size, squeeze=False)
    for (var, lev), panels in zip(fields, axes):
        ax_rmse, ax_acc = panels[0], panels[1]
        drawn = [("rmse", ax_rmse, ""), ("acc", ax_acc, "")]
        if ensemble:
            drawn += [("ensemble_stddev", ax_rmse, " spread"), ("crps", panels[2], "")]
        colors: dict[str, Any] = {}  # a model's spread in its RMSE's colour
        for metric, ax, suffix in drawn:
            for model, points in series.get((region, var, lev, metric), {}).items():
                x, y = zip(*sorted(points))
                style = STYLE.get(model, {"lw": 2})
                if suffix:
                    style = {**style, "linestyle": "--", "lw": 1.2, "color": colors.get(model)}
                (line,) = ax.plot(x, y, marker="o", ms=3, label=model + suffix, **style)
                colors.setdefault(model, line.get_color())
                band = bands.get((region, var, lev, metric, model))
                if band and not np.isnan([b for pair in band.values() for b in pair]).all():
                    days = sorted(band)
                    lo, hi = zip(*(band[d] for d in days))
                    ax.fill_between(days, lo, hi, color=line.get_color(), alpha=0.2, lw=0)
            ax.set_xlabel("lead (days)")
            ax.grid(alpha=0.3)
        unit = units.get((region, var, lev, "rmse"), "")
        _title(ax_rmse, f"{_label(var, lev)}: RMSE [{unit}]")
        _title(ax_acc, f"{_label(var, lev)}: ACC")
        if ensemble:
            _title(ax_rmse, f"{_label(var, lev)}: RMSE, spread [{unit}]")
            _title(panels[2], f"{_label(var, lev)}: CRPS [{unit}]")
        if region in ("global", "domain"):
            _published(ax_rmse, published_for(baselines, resolution, var, lev))
    # one legend for the figure, below the panels: a legend inside an axis hides its curves
    legend: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    rows_of_legend = -(-len(legend) // 3)
    bottom = (0.25 + 0.18 * rows_of_legend) / fig.get_figheight()
    fig.legend(legend.values(), legend.keys(), loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(f"{region} · {resolution}", fontsize=12)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return fig


def _headline(fields: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Surface fields, and each upper-air variable at its headline level (else its first level)."""
    levels: dict[str, list] = defaultdict(list)
    for var, lev in fields:
        levels[var].append(lev)
    out = []
    for var, levs in levels.items():
        want = HEADLINE_LEVELS.get(var)
        out.append((var, want if want in levs else levs[0]))
    return out


def _published(ax, pub: list[dict[str, Any]]) -> None:
    """Published RMSEs as markers at their lead days; climatologies ('all' leads) as lines.

    The axes stay those of the forecast's own leads and values: published numbers outside them are
    listed in a note in the corner, not drawn (a 3- and 5-day point must not squeeze a 6–24 h curve).
    """
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    outside: list[str] = []
    by_model: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for b in pub:
        name, rmse = f"{b['benchmark']} {b['model']}", float(b["rmse"])
        if b["lead_days"] == "all":
            if not y0 <= rmse <= y1:
                outside.append(f"{name} {rmse:.4g}")
                continue
            ax.axhline(rmse, color="0.6", lw=0.8, ls="-.")
            where = ("axes fraction", "data")
            ax.annotate(name, (0, rmse), xycoords=where, fontsize=6, color="0.4", va="bottom")
        else:
            day = float(b["lead_days"])
            if not (x0 <= day <= x1 and y0 <= rmse <= y1):
                outside.append(f"{name} {day:g} d: {rmse:.4g}")
                continue
            by_model[f"{name} ({b.get('eval_period', '')})"].append((day, rmse))
    for label, points in by_model.items():
        x, y = zip(*sorted(points))
        ax.plot(x, y, marker="x", ls="none", ms=5, label=label)
    ax.set_xlim(x0, x1)
    ax.set_ylim(y0, y1)
    if outside:
        more = f" (+{len(outside) - 4})" if len(outside) > 4 else ""
        note = "published, outside these axes: " + "; ".join(outside[:4]) + more
        ax.annotate(note, (0.01, 0.99), xycoords="axes fraction", fontsize=5, color="0.4", va="top")


def _coastlines():
    try:
        import cartopy.crs as ccrs
    except ImportError:
        return None
    return ccrs


def plot_maps(
    forecast: xr.Dataset,
    truth: xr.Dataset,
    out_dir: str | os.PathLike,
    *,
    variables: list[str] | None = None,
    init_index: int = 0,
    lead_index: int = -1,
) -> list[Path]:
    """``map-VARIABLE.png``: forecast, truth at the valid time and their difference, for one init
    and lead (default: the first init, the last lead); upper-air variables at 500 hPa when present.
    An ensemble shows its mean, and its spread (standard deviation over members, ddof 1) beside."""
    plt = pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    forecast, truth = normalise(forecast, "forecast"), normalise(truth, "truth")
    names = variables or [v for v in forecast.data_vars if v in truth.data_vars]
    ccrs = _coastlines()
    paths = []
    for name in names:
        fc = forecast[name].isel(time=init_index, prediction_timedelta=lead_index)
        spread = None
        if MEMBER in fc.dims:
            if fc.sizes[MEMBER] > 1:
                spread = fc.std(MEMBER, ddof=1)
            fc = fc.mean(MEMBER)
        valid = fc["time"].values + fc["prediction_timedelta"].values
        obs = truth[name].sel(time=valid)
        level = None
        if "level" in fc.dims:
            levels = fc["level"].values
            level = int(500 if 500 in levels else levels[0])
            fc, obs = fc.sel(level=level), obs.sel(level=level)
            spread = None if spread is None else spread.sel(level=level)
        obs = obs.sel(latitude=fc["latitude"], longitude=fc["longitude"], method="nearest", tolerance=1e-3)
        f, o = fc.load().sortby("latitude"), obs.load().sortby("latitude")
        err = f - o.values
        lead_h = fc["prediction_timedelta"].values / np.timedelta64(1, "h")
        title = f"{_label(name, level)}, init {str(fc['time'].values)[:16]}, lead {lead_h:g} h"
        kw = {"subplot_kw": {"projection": ccrs.PlateCarree(central_longitude=180)}} if ccrs else {}
        n_panel = 3 if spread is None else 4
        fig, axes = plt.subplots(1, n_panel, figsize=(5 * n_panel, 3.6), **kw)
        vmin, vmax = float(min(f.min(), o.min())), float(max(f.max(), o.max()))
        lim = float(abs(err).max()) or 1.0
        lon, lat = f["longitude"].values, f["latitude"].values
        what = "ensemble mean" if MEMBER in forecast[name].dims else "forecast"
        panels = [
            (axes[0], f, what, {"vmin": vmin, "vmax": vmax, "cmap": CMAPS.get(name, "viridis")}),
            (axes[1], o, "truth", {"vmin": vmin, "vmax": vmax, "cmap": CMAPS.get(name, "viridis")}),
            (axes[2], err, f"{what} − truth", {"vmin": -lim, "vmax": lim, "cmap": "RdBu_r"}),
        ]
        if spread is not None:
            s_map = spread.load().sortby("latitude")
            panels.append((axes[3], s_map, "ensemble spread (stddev)", {"vmin": 0, "cmap": "magma"}))
        for ax, data, what, opts in panels:
            extra = {"transform": ccrs.PlateCarree()} if ccrs else {}
            mesh = ax.pcolormesh(lon, lat, np.asarray(data), shading="nearest", **opts, **extra)
            if ccrs:
                ax.coastlines(lw=0.5)
            else:
                ax.set_xlabel("longitude (°E)")
                ax.set_ylabel("latitude (°N)")
            _title(ax, what)
            fig.colorbar(mesh, ax=ax, shrink=0.8, label=str(forecast[name].attrs.get("units", "")))
        fig.suptitle(title, fontsize=11)
        fig.tight_layout()
        paths.append(save_figure(fig, out_dir / f"map-{name}.png", 100))
    return paths


def plot_all(
    rows: list[dict[str, Any]],
    info: dict[str, Any],
    baselines: list[dict[str, Any]],
    out_dir: str | os.PathLike,
    comparisons: list[dict[str, Any]] | None = None,
) -> list[Path]:
    """Scorecards (intervals shaded), a significance card per comparison (``info["interval"]`` says
    how they were made), and maps when the forecast and truth stores named in ``info`` can be opened."""
    paths = plot_scorecard(rows, baselines, info.get("resolution", "?"), out_dir)
    if comparisons and info.get("interval"):
        paths += plot_significance(comparisons, info["interval"], out_dir)
    why = maps_unavailable(info)
    if why is None:
        variables = list(dict.fromkeys(r["variable"] for r in rows))
        fc, truth = open_dataset(info["forecast"]), open_dataset(info["truth"])
        paths += plot_maps(fc, truth, out_dir, variables=variables)
    else:
        log.warning("no maps drawn: %s", why)
    return paths
