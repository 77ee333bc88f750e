"""Sharded, atomic checkpoints that load on any mesh (torch.distributed.checkpoint underneath)."""

from .export import export_full_state_dict, load_full_tensors
from .load import load_checkpoint
from .manager import SaveRequest, latest_checkpoint, list_checkpoints, pinned, read_meta, save_checkpoint
from .state import capture_rng, restore_rng

__all__ = [
    "SaveRequest",
    "capture_rng",
    "export_full_state_dict",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "load_full_tensors",
    "pinned",
    "read_meta",
    "restore_rng",
    "save_checkpoint",
]
