"""WeatherBench 2 metrics: xarray evaluation of forecast stores and a distributed torch accumulator."""

from .accumulator import MetricAccumulator
from .evaluate import evaluate, normalise
from .wb2 import (
    acc,
    bias,
    climatology_at_valid_time,
    climatology_forecast,
    mse,
    persistence_forecast,
    rmse,
    spatial_mean,
    truth_at_valid_time,
    wb1_acc,
    wb1_rmse,
)
from .weights import cos_latitude_weights, latitude_weights, weights_like

__all__ = [
    "MetricAccumulator",
    "acc",
    "bias",
    "climatology_at_valid_time",
    "climatology_forecast",
    "cos_latitude_weights",
    "evaluate",
    "latitude_weights",
    "mse",
    "normalise",
    "persistence_forecast",
    "rmse",
    "spatial_mean",
    "truth_at_valid_time",
    "wb1_acc",
    "wb1_rmse",
    "weights_like",
]
