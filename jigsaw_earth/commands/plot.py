"""``jigsaw-earth plot``: pictures of an existing score file (``PREFIX.json`` from ``score``): the
scorecards with their intervals, a significance card per comparison, and the maps."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from ..argtypes import path_or_url
from ..metrics.scorecard import read_baselines, read_scores

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="scorecard PNGs and forecast/truth/error maps of a score file")
    p.add_argument("scores", type=path_or_url, metavar="PREFIX.json", help="written by `jigsaw-earth score`")
    p.add_argument("--out", type=path_or_url, required=True, metavar="DIR", help="folder for the PNGs")
    p.add_argument(
        "--baselines", type=path_or_url, metavar="CSV", help="published RMSEs (default: the shipped ones)"
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..metrics.plots import check_plot_dir, maps_unavailable, plot_all

    rows, info = read_scores(args.scores)
    regions = [r.get("region", "global") for r in rows]
    comparisons = info.pop("comparisons", None) or []
    against = [c["against"] for c in comparisons]
    check_plot_dir(args.out, regions, [r["variable"] for r in rows], "--out", _stores(args.scores, info),
                   against=against)  # fmt: skip
    baselines = read_baselines(args.baselines or info.get("baselines"))
    for path in plot_all(rows, info, baselines, args.out, comparisons=comparisons):
        print(f"wrote {path}")
    why = maps_unavailable(info)
    if why is not None:
        print(f"no maps drawn: {why}")
    return 0


def _stores(scores: Path, info: dict) -> tuple[tuple[str, str | None], ...]:
    """The stores a score file names (never written into) and the score file itself."""
    named = tuple((f"{k} store", info.get(k)) for k in ("forecast", "truth", "climatology"))
    return (*named, ("score file", str(scores)))
