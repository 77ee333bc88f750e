"""What a forecast run returns: ``Prediction``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .timing import LoopTimes

__all__ = ["Prediction"]


@dataclass
class Prediction:
    """What ``run_prediction`` did: the store written (or None), ``score``'s rows (or None), the
    init times, model steps, longitudes of the grid, the forecast rate (model steps × inits ×
    members per second of the forecast loop, all replicas together), the batch (inits per forward),
    the training forward's rate, the ensemble size (None: deterministic), the scores' per-init
    statistics and where the loop's time went."""

    path: Path | str | None  # a bucket URL as given
    rows: list[dict[str, Any]] | None
    init_times: np.ndarray
    steps: int
    n_lon: int
    steps_per_s: float
    batch_size: int
    training_steps_per_s: float  # the training forward (autograd on, training batch), same mesh
    members: int | None = None
    statistics: Any = None  # the per-init statistics of ``rows`` (``metrics.statistics.Statistics``)
    times: LoopTimes | None = None  # where the forecast loop's time went (the slowest rank's)
    complete: bool = False  # ``path`` already held this forecast: nothing was run or written
    scorecard: str | None = None  # the scores as ``score`` prints them (``score_files.py``)
    score_files: tuple[Path, ...] = ()  # what ``scores`` wrote (rank 0)
