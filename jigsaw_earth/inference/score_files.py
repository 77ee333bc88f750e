"""A scored forecast's report: the scorecard as ``score`` prints it, and with ``scores`` the files
``PREFIX.json``, ``PREFIX.csv`` and ``PREFIX-stats.nc`` as ``score --out PREFIX`` writes them.

``run_prediction`` checks the files before any work (never a run's record, never inside a store it
reads or writes) and writes them on rank 0 when the forecast is done, so a notebook's request gets
what the command line's gets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..config.schema import TrainConfig
from ..data.preflight import default_climatology_path
from .prediction import Prediction
from .request import PredictRequest

__all__ = ["check_score_files", "scorecard", "write_score_files"]

OPTION = "--scores"


def _never_inside(request: PredictRequest, cfg: TrainConfig) -> tuple[tuple[str, str | None], ...]:
    """What the score files may never be inside: the stores read and the one written."""
    d, score = cfg.data, request.score
    truth, climatology = (None, None) if score is None else (score.truth, score.climatology)
    return (("--out store", request.out), ("--truth store", truth), ("truth/training store data.store",
            d.store), ("--climatology store", climatology),
            ("climatology", d.climatology or default_climatology_path(d.store)),
            ("--init source", request.init))  # fmt: skip


def check_score_files(request: PredictRequest, cfg: TrainConfig) -> None:
    """Refuse ``scores`` files that may not be written, before any work (each fault one line)."""
    from ..metrics.scorecard import check_scores_output

    if request.scores:
        check_scores_output(request.scores, OPTION, _never_inside(request, cfg))


def _interval(result: Prediction) -> dict[str, Any]:
    from ..metrics.significance import IntervalOptions

    return IntervalOptions().info(int(result.init_times.size))  # TileScorer.finish's default


def scorecard(result: Prediction) -> str | None:
    """The scorecard of a scored forecast, as ``score`` prints it (None: not scored)."""
    from ..metrics.scorecard import format_scorecard, grid_resolution, init_period, read_baselines

    if result.rows is None:
        return None
    return format_scorecard(result.rows, read_baselines(None), grid_resolution(result.n_lon),
                            init_period(result.init_times), members=result.members,
                            interval=_interval(result))  # fmt: skip


def write_score_files(request: PredictRequest, cfg: TrainConfig, result: Prediction) -> list[Path]:
    """``PREFIX.json``, ``.csv`` and ``-stats.nc`` of a scored forecast (rank 0), the run info naming
    the stores read; none without ``scores``."""
    from ..metrics.scorecard import grid_resolution, write_scores
    from .scoring import score_stores

    if not request.scores or request.score is None or result.rows is None:
        return []
    first, last = result.init_times.min(), result.init_times.max()
    times = [str(np.datetime_as_string(t, unit="h")) for t in (first, last)]
    truth, climatology = score_stores(request.score, cfg)  # the stores actually read
    where = None if result.path is None else str(result.path)
    info = {"forecast": where if where is None or "://" in where else str(Path(where).resolve()),
            "truth": truth, "climatology": climatology, "baselines": None,
            "resolution": grid_resolution(result.n_lon), "inits": [*times, int(result.init_times.size)],
            "members": result.members, "interval": _interval(result)}  # fmt: skip
    result.statistics.ds.attrs.update({k: v for k, v in info.items() if k in ("forecast", "truth",
                                       "climatology", "resolution") and v})  # fmt: skip
    return write_scores(result.rows, Path(request.scores), info, OPTION, _never_inside(request, cfg),
                        statistics=result.statistics)  # fmt: skip
