"""Sharded inference: roll a trained model forward and write a WB2-layout forecast store.

Every rank reads only its tile of the initial conditions, runs the model on its tile (weights
sharded as in training), and writes its tile of every forecast into one Zarr store
(``ForecastWriter``). Data-parallel replicas take disjoint initialisation times. The forecast
step is the trainer's (``training.step.model_step``: autocast and tendency scaling as configured),
and the weights come from a sharded checkpoint written on any mesh.

Inference is read-only on the run (``load.py``): no run-directory claim, no ``config.yaml`` or
``history.jsonl`` write, no optimizer; the checkpoint is pinned while read. ``--out`` is checked
before any work (``data.outputs.check_output``): never the truth store, the checkpoints, or a
path that is not predict's own; the temporary store is removed on any exit (SIGTERM included).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..checkpoint import load_checkpoint, pinned
from ..config.schema import TrainConfig
from ..data.outputs import check_output
from ..data.times import hour_dayofyear, period_mask
from ..training.data import TrainData
from ..training.runner import setup_mesh
from ..training.step import build_run_model, model_step
from .forecast_store import KIND, ForecastLayout, ForecastWriter
from .load import check_against_checkpoint, find_checkpoint, protected_paths

__all__ = ["run_prediction", "select_inits"]

log = logging.getLogger(__name__)


def select_inits(
    data: TrainData, start: str, end: str, steps: int, every_hours: int, max_inits: int
) -> np.ndarray:
    """Store time indices of initialisation times in ``[start, end]`` at multiples of
    ``every_hours`` whose ``steps`` targets exist (so the forecast can be scored); every rank agrees."""
    times = np.asarray(data.times).astype("datetime64[h]")
    hours, _ = hour_dayofyear(times)
    idx = np.nonzero(period_mask(times, (start, end), unit="h") & (hours % every_hours == 0))[0]
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


def _check_options(out: str | Path, steps: int, every_hours: int, max_inits: int, batch_size: int) -> None:
    for option, value, least in (
        ("--steps", steps, 1), ("--every-hours", every_hours, 1), ("--batch-size", batch_size, 1),
        ("--max-inits", max_inits, 0),
    ):  # fmt: skip
        if value < least:
            what = "0 (all) or more" if least == 0 else f"at least {least}"
            raise ValueError(f"{option} {value}: must be {what}; e.g. {option} {max(least, 1)}")
    if not str(out).strip():
        raise ValueError("--out '' is empty; give the forecast store to write, e.g. --out fc.zarr")


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM (torchrun stopping the job after another rank failed) unwinds like an error."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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
    _check_options(out, steps, every_hours, max_inits, batch_size)
    ckpt = find_checkpoint(cfg, checkpoint)
    protected = protected_paths(cfg, ckpt)
    run_dir = (("run directory run.dir", cfg.run.dir),)
    check_output(out, KIND, overwrite=overwrite, protected=protected, may_hold_outputs=run_dir)
    check_against_checkpoint(cfg, ckpt)
    mesh = setup_mesh(cfg)
    try:
        with _sigterm_raises():
            return _predict(cfg, mesh, ckpt, out, protected, start, end, steps, every_hours, max_inits,
                            batch_size, overwrite)  # fmt: skip
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _predict(
    cfg: TrainConfig, mesh: Any, ckpt: Path, out: str | Path, protected: Any, start: str, end: str,
    steps: int, every_hours: int, max_inits: int, batch_size: int, overwrite: bool,
) -> Path:  # fmt: skip
    from ..training.sources import build_data

    data = build_data(cfg, mesh, training=False)
    inits = select_inits(data, start, end, steps, every_hours, max_inits)
    model = build_run_model(cfg, mesh, data)
    with pinned(ckpt):
        step = int(load_checkpoint(ckpt, model, None, mesh)["step"])
    model.eval()
    dev = mesh.device
    tendency = data.tendency_std.to(dev) if cfg.loss.tendency_scaling else None
    bf16 = cfg.training.precision == "bf16"
    writer = ForecastWriter(
        out, _layout(cfg, data, inits, steps), data.grid, mesh.rank, overwrite=overwrite, protected=protected
    )
    try:
        replicas, replica = mesh.axis("data").size, mesh.axis("data").index
        mine = np.arange(len(inits))[replica::replicas]
        reported = 0
        for k in range(0, len(mine), batch_size):
            chunk = mine[k : k + batch_size]
            batch = data._batch(inits[chunk], steps).to(dev)
            state = batch.inputs
            for lead in range(steps):
                tf = data.step_time_features(batch, lead).to(dev)
                state = model_step(model, state, batch.static, tf, bf16=bf16, tendency=tendency)
                physical = data.denormalise(state.cpu()).numpy()
                for b, init_index in enumerate(chunk):
                    writer.write(int(init_index), lead, physical[b], data.tile)
            done = min(k + batch_size, len(mine))
            if mesh.rank == 0 and (done == len(mine) or 10 * done // len(mine) > reported):
                reported = 10 * done // len(mine)
                log.info("forecast %d/%d initialisations", done, len(mine))
        path = writer.close()
    except BaseException:
        writer.abort()
        raise
    if mesh.rank == 0:
        log.info("wrote %d forecasts × %d steps from checkpoint %s (step %d) to %s",
                 len(inits), steps, ckpt, step, path)  # fmt: skip
    return path
