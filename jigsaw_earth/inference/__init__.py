"""Sharded inference: forecasts written by all ranks into one WB2-layout store.

The public face that the command line and a notebook share: a ``PredictRequest`` (with its
``ScoreRequest`` and ``Perturbation``), the configuration it runs with (``prediction_config``), and
``run_prediction``, which returns a ``Prediction`` or raises ``Stopped`` (``option_of``: the option of
``predict`` that sets a request's field); predict's unfinished
forecasts are listed and removed with ``find_unfinished`` and ``remove_unfinished``.
"""

from .forecast_store import ForecastLayout, ForecastWriter, aligned_chunk
from .load import prediction_config
from .perturb import Perturbation
from .predict import run_prediction
from .prediction import Prediction
from .progress import Stopped
from .request import PredictRequest, option_of
from .scoring import ScoreRequest
from .unfinished import UNFINISHED_LOCAL, find_unfinished, foreign_files, foreign_text, remove_unfinished

__all__ = [
    "UNFINISHED_LOCAL",
    "ForecastLayout",
    "ForecastWriter",
    "Perturbation",
    "PredictRequest",
    "Prediction",
    "ScoreRequest",
    "Stopped",
    "aligned_chunk",
    "find_unfinished",
    "foreign_files",
    "foreign_text",
    "option_of",
    "prediction_config",
    "remove_unfinished",
    "run_prediction",
]
