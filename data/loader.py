"""``ShardedLoader``: batches of this rank's tile, prefetched in the background, on its device.

    loader = ShardedLoader("runs/demo/data.zarr", mesh, batch_size=4, lead_steps=1,
                           period=("2019-01-01", "2019-12-31T18"), halo=Halo.uniform(1))
    for batch in loader:            # one epoch, from the saved position on
        ...
    state = loader.state_dict()     # {"epoch", "step", ...}; load_state_dict(state) resumes

A background thread keeps ``prefetch`` batches ready; ``workers`` threads read the samples of
a batch concurrently (zarr releases the GIL for I/O and decoding). On CUDA the batch is pinned
and copied with ``non_blocking=True``.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from jigsaw_earth.distributed.halo import Halo
from jigsaw_earth.distributed.mesh import DomainMesh
from jigsaw_earth.distributed.tiles import TileGrid

from .batch import TIME_FEATURES, Batch, VariableSpec
from .geometry import time_features
from .reader import TileReader
from .sampler import EpochSampler, SampleTimes
from .stats import Normalizer, read_statistics
from .store import StoreView

__all__ = ["ShardedLoader"]

log = logging.getLogger(__name__)
_DONE = object()


class ShardedLoader:
    """Yields ``Batch`` objects of this rank's tile; see the module docstring.

    ``stats="auto"`` normalises with the store's statistics (an error if it has none), a path
    uses a separate statistics store, ``None`` yields physical values.
    """

    def __init__(self, store: str | Path, mesh: DomainMesh, *, spec: VariableSpec | None = None,
                 halo: Halo | None = None, batch_size: int = 1, lead_steps: int = 1,
                 step_hours: int = 6, period: tuple[str, str] | None = None, seed: int = 0,
                 shuffle: bool = True, names: dict[str, str] | None = None,
                 stats: str | Path | None = "auto", prefetch: int = 2, workers: int = 2,
                 allow_gaps: bool = False, device: torch.device | str | None = None):
        self.spec = spec or VariableSpec()
        self.halo = halo or Halo()
        self.mesh = mesh
        self.view = StoreView.open(store, names=names)
        self.grid = TileGrid(*self.view.grid_shape, mesh.shape.lat, mesh.shape.lon)
        self.tile = self.grid.tile_of(mesh.domain.index)
        self.reader = TileReader(self.view, self.spec, self.grid, self.tile, self.halo)
        self.samples = SampleTimes.build(self.view.times, period, step_hours, lead_steps, allow_gaps)
        self.sampler = EpochSampler(len(self.samples), batch_size, seed=seed, shuffle=shuffle,
                                    rank=mesh.coord[0], world=mesh.shape.data)
        static, self.static_channels = self.reader.read_static()
        n_geo = len(self.static_channels) - len(self.spec.static)
        if stats is None:
            self.normalizer = Normalizer.identity(self.spec, len(self.static_channels))
        else:
            source = store if stats == "auto" else stats
            self.normalizer = Normalizer.from_stats(read_statistics(source), self.spec, self.view, n_geo)
        n = self.normalizer
        self._mean = n.mean.reshape(-1, 1, 1)
        self._std = n.std.reshape(-1, 1, 1)
        self.static = torch.from_numpy(
            ((static - n.static_mean.reshape(-1, 1, 1)) / n.static_std.reshape(-1, 1, 1)).astype(np.float32))
        self.device = torch.device(device) if device is not None else mesh.device
        self.prefetch, self.workers = max(1, prefetch), max(1, workers)
        self.lead_steps = lead_steps
        self.time_feature_names = list(TIME_FEATURES)

    # ---- sizes and state ------------------------------------------------------------------
    def __len__(self) -> int:
        """Batches per epoch for this data-parallel group."""
        return len(self.sampler)

    @property
    def channels(self) -> list[str]:
        return self.spec.channels

    def state_dict(self) -> dict[str, Any]:
        """Position after the last batch handed out (prefetched batches are not counted)."""
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.epoch, self.sampler.step = epoch, 0

    # ---- reading --------------------------------------------------------------------------
    def _sample(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = self.reader.read_sample(int(self.samples.inputs[i]), self.samples.target_index[i])
        return (x - self._mean) / self._std, (y - self._mean[None]) / self._std[None]

    def read_batch(self, positions: np.ndarray, pool: ThreadPoolExecutor | None = None) -> Batch:
        """The batch of sample positions ``positions`` (on the CPU)."""
        parts = list(pool.map(self._sample, positions)) if pool else [self._sample(i) for i in positions]
        t_in = self.view.times[self.samples.inputs[positions]]
        return Batch(
            inputs=torch.from_numpy(np.stack([p[0] for p in parts]).astype(np.float32)),
            targets=torch.from_numpy(np.stack([p[1] for p in parts]).astype(np.float32)),
            static=self.static,
            time_features=torch.from_numpy(time_features(t_in)),
            channels=self.spec.channels,
            static_channels=list(self.static_channels),
            times=t_in,
            target_times=self.view.times[self.samples.target_index[positions]],
            tile=self.tile,
            halo=self.halo,
        )

    def _to_device(self, batch: Batch) -> Batch:
        if self.device.type == "cuda":
            return batch.pin_memory().to(self.device, non_blocking=True)
        return batch if self.device.type == "cpu" else batch.to(self.device)

    def __iter__(self) -> Iterator[Batch]:
        """The rest of the current epoch; the position advances as batches are handed out."""
        q: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def produce() -> None:
            try:
                with ThreadPoolExecutor(self.workers) as pool:
                    for epoch, step, positions in self.sampler.batches():
                        if stop.is_set():
                            return
                        item = (epoch, step, self._to_device(self.read_batch(positions, pool)))
                        while not stop.is_set():
                            try:
                                q.put(item, timeout=0.1)
                                break
                            except queue.Full:
                                continue
            except BaseException as err:  # surfaced in the consumer
                q.put(err)
            finally:
                q.put(_DONE)

        thread = threading.Thread(target=produce, name="jigsaw-data-prefetch", daemon=True)
        thread.start()
        try:
            while True:
                item = q.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                epoch, step, batch = item
                self.sampler.advance(epoch, step)
                yield batch
        finally:
            stop.set()
            while thread.is_alive():
                try:
                    q.get_nowait()
                except queue.Empty:
                    thread.join(timeout=0.05)
