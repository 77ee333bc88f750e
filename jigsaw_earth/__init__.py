"""jigsaw-earth: domain- and weight-sharded (Jigsaw) weather forecasting on any lat × lon mesh."""

__version__ = "0.1.0"
