"""jigsaw-earth: domain- and weight-sharded (Jigsaw) weather forecasting on any lat × lon mesh."""

from typing import Any

__version__ = "0.1.0"
__all__ = ["load_model"]


def __getattr__(name: str) -> Any:
    """``jigsaw_earth.load_model``, imported on first use (the CLI starts without torch's import)."""
    if name == "load_model":
        from .sharing.plain import load_model

        return load_model
    raise AttributeError(f"module 'jigsaw_earth' has no attribute {name!r}")
