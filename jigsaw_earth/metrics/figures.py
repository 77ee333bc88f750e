"""What every picture of a score shares: matplotlib without a display, and how a figure is saved (a PNG
whose text chunks name jigsaw-earth as its source, so ``ownership.png_of_ours`` knows it for ours)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..ownership import PNG_SOURCE

__all__ = ["SAVE", "pyplot", "save_figure"]

SAVE = {"metadata": {"Source": PNG_SOURCE}, "bbox_inches": "tight", "pad_inches": 0.1}


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, dpi: int) -> Path:
    """Write ``fig`` to ``path`` as one of ours (``SAVE``) and close it; returns ``path``."""
    fig.savefig(path, dpi=dpi, **SAVE)
    pyplot().close(fig)
    return path
