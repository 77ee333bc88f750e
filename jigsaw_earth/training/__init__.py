"""Training: deterministic mesh-invariant data, global loss, sharded AdamW, validation, reporting."""

from ..data.samples import MemorySource, TrainData
from .evaluate import format_table, validate
from .loop import NonFiniteLossError, Trainer
from .runner import run_training

__all__ = [
    "MemorySource",
    "NonFiniteLossError",
    "TrainData",
    "Trainer",
    "format_table",
    "run_training",
    "validate",
]
