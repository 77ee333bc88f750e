"""``training.activation_checkpointing: auto``: recompute only when plan's estimate does not fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from jigsaw_earth.config import parse_config
from jigsaw_earth.mesh_setup import setup_mesh
from jigsaw_earth.selftest import tiny_config, tiny_store
from jigsaw_earth.training import memory
from jigsaw_earth.training.loop import Trainer


def test_auto_checkpointing_follows_free_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tiny_store(tmp_path / "data.zarr")
    losses = {}
    for free, expected in ((1 << 40, False), (1 << 10, True)):
        raw = tiny_config(tmp_path, f"run-{expected}", "cpu", 1)
        raw["training"].update(activation_checkpointing="auto", steps=3)
        monkeypatch.setattr(memory, "free_bytes", lambda device, ranks=1, free=free: free)
        cfg = parse_config(raw)
        trainer = Trainer(cfg, setup_mesh(cfg))
        assert trainer.recompute is expected
        losses[expected] = [trainer.train_step(s)["loss"] for s in (1, 2, 3)]
    assert losses[True] == losses[False]  # recomputing the forward changes no number
