"""Sharded inference: forecasts written by all ranks into one WB2-layout Zarr store."""

from .forecast_store import ForecastLayout, ForecastWriter, aligned_chunk

__all__ = ["ForecastLayout", "ForecastWriter", "aligned_chunk"]
