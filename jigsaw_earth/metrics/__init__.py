"""WeatherBench 2 metrics: xarray evaluation of forecast stores and a distributed torch accumulator."""
