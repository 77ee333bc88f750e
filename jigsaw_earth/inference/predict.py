"""Sharded inference: roll a trained model forward and write a WB2-layout forecast store.

Every rank reads only its tile of the initial conditions, runs the model on its tile (weights
sharded as in training), and writes its tile of every forecast into one Zarr store
(``ForecastWriter``). Data-parallel replicas take disjoint initialisation times. The forecast
step is the trainer's (``Trainer.forward``: autocast and tendency scaling as configured), and the
weights come from a sharded checkpoint written on any mesh.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ..checkpoint import latest_checkpoint
from ..config.schema import TrainConfig
from ..training.data import TrainData
from ..training.loop import Trainer
from ..training.runner import setup_mesh
from .forecast_store import ForecastLayout, ForecastWriter

__all__ = ["run_prediction", "select_inits"]

log = logging.getLogger(__name__)


def select_inits(
    data: TrainData, start: str, end: str, steps: int, every_hours: int, max_inits: int
) -> np.ndarray:
    """Store time indices of initialisation times in ``[start, end]`` at multiples of
    ``every_hours`` whose ``steps`` targets exist (so the forecast can be scored); every rank agrees."""
    times = np.asarray(data.times).astype("datetime64[h]")
    lo, hi = np.datetime64(start, "h"), np.datetime64(end, "h")
    hours = (times - times.astype("datetime64[D]")).astype(int)
    idx = np.nonzero((times >= lo) & (times <= hi) & (hours % every_hours == 0))[0]
    idx = data.valid_inits(idx, steps)
    if len(idx) == 0:
        raise ValueError(
            f"no initialisation time in [{start}, {end}] every {every_hours} h has {steps} forecast "
            f"steps inside the store ({times[0]} … {times[-1]}); widen --start/--end or lower --steps"
        )
    if max_inits and len(idx) > max_inits:
        idx = idx[np.linspace(0, len(idx) - 1, max_inits).round().astype(int)]
    return idx


def _layout(cfg: TrainConfig, data: TrainData, inits: np.ndarray, steps: int) -> ForecastLayout:
    d = cfg.data
    layout = ForecastLayout(
        init_times=np.asarray(data.times)[inits],
        leads=np.arange(1, steps + 1) * np.timedelta64(d.step_hours, "h"),
        upper_air=tuple(d.upper_air),
        levels=tuple(d.levels),
        surface=tuple(d.surface),
        latitude=np.asarray(data.source.lat),
        longitude=np.asarray(data.source.view.lon),
    )
    if layout.channels != data.channels:
        raise ValueError(f"forecast channels {layout.channels} differ from the data's {data.channels}")
    return layout


@torch.no_grad()
def run_prediction(
    cfg: TrainConfig,
    out: str | Path,
    *,
    checkpoint: str | None = None,
    start: str,
    end: str,
    steps: int,
    every_hours: int = 12,
    max_inits: int = 0,
    batch_size: int = 2,
    overwrite: bool = False,
) -> Path:
    """Forecast ``steps`` steps from every selected init and write ``out`` (collective)."""
    if steps < 1:
        raise ValueError(f"--steps must be at least 1, got {steps}")
    cfg.checkpoint.resume = checkpoint or "auto"
    if checkpoint is None and latest_checkpoint(cfg.run.dir) is None:
        raise FileNotFoundError(
            f"no checkpoint in run directory {cfg.run.dir!r}: train first (jigsaw-earth train) "
            f"or pass --checkpoint"
        )
    mesh = setup_mesh(cfg)
    try:
        trainer = Trainer(cfg, mesh)
        data = trainer.data
        inits = select_inits(data, start, end, steps, every_hours, max_inits)
        writer = ForecastWriter(
            out, _layout(cfg, data, inits, steps), data.grid, mesh.rank, overwrite=overwrite
        )
        replicas, replica = mesh.axis("data").size, mesh.axis("data").index
        mine = np.arange(len(inits))[replica::replicas]
        trainer.model.eval()
        dev = mesh.device
        for k in range(0, len(mine), batch_size):
            chunk = mine[k : k + batch_size]
            batch = data._batch(inits[chunk], steps).to(dev)
            state = batch.inputs
            for lead in range(steps):
                state = trainer.forward(state, batch.static, data.step_time_features(batch, lead).to(dev))
                physical = data.denormalise(state.cpu()).numpy()
                for b, init_index in enumerate(chunk):
                    writer.write(int(init_index), lead, physical[b], data.tile)
            log.info("forecast %d/%d initialisations", min(k + batch_size, len(mine)), len(mine))
        path = writer.close()
        log.info(
            "wrote %d forecasts × %d steps from checkpoint step %d to %s",
            len(inits),
            steps,
            trainer.step,
            path,
        )
        return path
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
