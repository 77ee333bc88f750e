"""Deterministic, mesh-invariant batches for the trainer.

Global batch ``s`` is a pure function of ``(seed, s)``: sample ``j = s·B + i`` of the run is
position ``j mod N`` of epoch ``j div N``'s permutation of the ``N`` valid initialisation times.
Replica ``d`` of the data axis takes rows ``[d·B/D, (d+1)·B/D)`` of the global batch, and each
domain rank reads only its tile of them. So the global batch is the same on every mesh, resume
needs nothing but the step, and validation scores the same initialisation times everywhere.

Tiles are read by ``jigsaw_earth.data``'s ``TileReader`` (only this rank's chunks) and
normalised with the store's statistics; a ``MemorySource`` holds small global arrays (tests).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch
from jigsaw_earth.data.batch import Batch
from jigsaw_earth.data.times import TIME_FEATURES, evenly_spaced, period_mask, sample_index, time_features

from jigsaw_earth.distributed.halo import Halo
from jigsaw_earth.distributed.mesh import DomainMesh
from jigsaw_earth.distributed.tiles import Tile, TileGrid
from jigsaw_earth.layers.channels import ModelChannels
from jigsaw_earth.sphere import latitude_weights

if TYPE_CHECKING:
    from jigsaw_earth.config.schema import TrainConfig

__all__ = ["MemorySource", "Source", "TrainData", "model_channels"]

log = logging.getLogger(__name__)


class Source(Protocol):
    """One rank's tile of a dataset, physical units, normalised grid (latitude descending)."""

    times: np.ndarray
    lat: np.ndarray
    channels: list[str]
    static_channels: list[str]

    def inputs(self, t: int) -> np.ndarray: ...  # (C, h, w)
    def targets(self, ts: np.ndarray) -> np.ndarray: ...  # (L, C, h, w)
    def static(self) -> np.ndarray: ...  # (S, h, w), already normalised
    def climatology(self, times: np.ndarray) -> np.ndarray | None: ...  # (N, C, h, w) or None
    def batch(
        self,
        inits: np.ndarray,
        targets: np.ndarray,
        mean: np.ndarray,
        std: np.ndarray,
        out: tuple[np.ndarray, np.ndarray] | None = None,
        check_nan: bool = True,
    ) -> tuple[np.ndarray, np.ndarray]: ...  # normalised (B, C, h, w), (B, L, C, h, w)


@dataclass
class MemorySource:
    """A source over in-memory global arrays: ``fields (T, C, H, W)``, ``static (S, H, W)``."""

    fields: np.ndarray
    static_fields: np.ndarray
    times: np.ndarray
    lat: np.ndarray
    channels: list[str]
    static_channels: list[str]
    tile: Tile
    clim: np.ndarray | None = None  # (T, C, H, W) climatology at each store time

    def _cut(self, a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(
            a[..., self.tile.lat_start : self.tile.lat_stop, self.tile.lon_start : self.tile.lon_stop]
        )

    def inputs(self, t: int) -> np.ndarray:
        return self._cut(self.fields[t])

    def targets(self, ts: np.ndarray) -> np.ndarray:
        return self._cut(self.fields[np.asarray(ts)])

    def static(self) -> np.ndarray:
        return self._cut(self.static_fields)

    def batch(
        self,
        inits: np.ndarray,
        targets: np.ndarray,
        mean: np.ndarray,
        std: np.ndarray,
        out: tuple[np.ndarray, np.ndarray] | None = None,
        check_nan: bool = True,
    ) -> tuple[np.ndarray, np.ndarray]:
        x = np.stack([(self.inputs(int(t)) - mean) / std for t in inits])
        y = np.stack([(self.targets(ts) - mean) / std for ts in targets])
        return x.astype(np.float32), y.astype(np.float32)

    def climatology(self, times: np.ndarray) -> np.ndarray | None:
        if self.clim is None:
            return None
        idx = np.searchsorted(self.times, np.asarray(times))
        return self._cut(self.clim[idx])


class TrainData:
    """Batches of one rank's tile for a run: training by step, validation by a fixed list."""

    def __init__(
        self,
        source: Source,
        mesh: DomainMesh,
        grid: TileGrid,
        *,
        mean: np.ndarray,
        std: np.ndarray,
        global_batch: int,
        seed: int,
        step_hours: int,
        train_period: list[str],
        val_period: list[str],
        rollout_steps: int,
        diff_std: np.ndarray | None = None,
        allow_gaps: bool = False,
        prefetch: int = 1,
    ):
        self.source, self.mesh, self.grid = source, mesh, grid
        self.tile = grid.tile_of(mesh.domain.index)
        self.mean = np.asarray(mean, np.float32).reshape(-1, 1, 1)
        self.std = np.asarray(std, np.float32).reshape(-1, 1, 1)
        self._stats_on: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        d = self.std.reshape(-1) if diff_std is None else np.asarray(diff_std, np.float32)
        #: one-step tendency std in normalised units (diff_std / std), per channel
        self.tendency_std = torch.from_numpy((d / self.std.reshape(-1)).astype(np.float32))
        self.global_batch, self.seed, self.rollout_steps = global_batch, seed, rollout_steps
        times = np.asarray(source.times).astype("datetime64[ns]")
        self.where = f"store {getattr(source, 'path', 'of the data')!r}"
        self.allow_gaps = allow_gaps
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: dict[int, Future] = {}
        self.prefetch = prefetch
        self._buffers: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        #: seconds the last ``train_batch`` call blocked waiting for its batch (the step's data wait)
        self.last_wait_s = 0.0
        self.step_hours = step_hours
        self.times = times
        self.train_mask = period_mask(times, train_period)
        self.val_mask = period_mask(times, val_period)
        self.train_index = self._inits(self.train_mask, rollout_steps, "training")
        if len(self.train_index) < global_batch:
            raise ValueError(
                f"data.train_period {train_period} holds {len(self.train_index)} initialisation times with "
                f"{rollout_steps} step(s) of targets, fewer than training.batch_size={global_batch}; "
                f"widen the period or lower the batch"
            )
        self.lat_weights = torch.from_numpy(
            latitude_weights(source.lat)[self.tile.lat_start : self.tile.lat_stop].astype(np.float32)
        )
        self._static = torch.from_numpy(np.asarray(source.static(), np.float32))
        self._perm: tuple[int, np.ndarray] | None = None
        replicas = mesh.axis("data").size
        self.local_batch = global_batch // replicas
        self.replica = mesh.axis("data").index

    @property
    def channels(self) -> list[str]:
        return list(self.source.channels)

    @property
    def n_static(self) -> int:
        return int(self._static.shape[0])

    def use_normalisation(
        self, mean: np.ndarray, std: np.ndarray, tendency_std: torch.Tensor, static: torch.Tensor
    ) -> None:
        """Normalise with these ``(C,)`` statistics and read these static fields ``(S, h, w)`` of this
        rank's tile instead of the store's: a shared model's own (``sharing/use.py``)."""
        if tuple(static.shape) != tuple(self._static.shape) or len(mean) != len(self.channels):
            raise ValueError(
                f"the model's static fields {tuple(static.shape)} and {len(mean)} channels do not fit this "
                f"data's {tuple(self._static.shape)} and {len(self.channels)}"
            )
        self.mean = np.asarray(mean, np.float32).reshape(-1, 1, 1)
        self.std = np.asarray(std, np.float32).reshape(-1, 1, 1)
        self.tendency_std = tendency_std.float().cpu()
        self._static = static.float().cpu().contiguous()
        self._stats_on.clear()

    def _inits(self, mask: np.ndarray, lead_steps: int, what: str) -> np.ndarray:
        """Time indices in ``mask`` whose ``lead_steps`` targets exist and also lie in ``mask``."""
        inits, targets = sample_index(
            self.times, np.nonzero(mask)[0], self.step_hours, lead_steps, self.allow_gaps, self.where, what
        )
        return inits[mask[targets[:, -1]]] if len(inits) else inits

    def valid_inits(self, candidates: np.ndarray, lead_steps: int) -> np.ndarray:
        """The candidates whose ``lead_steps`` targets all exist (gaps and the store's end skipped)."""
        inits, _ = sample_index(
            self.times, candidates, self.step_hours, lead_steps, True, self.where, "forecast"
        )
        return inits

    def target_indices(self, inits: np.ndarray, lead_steps: int) -> np.ndarray:
        """``(n, lead_steps)`` store indices of the targets of valid ``inits``."""
        wanted = self.times[np.asarray(inits)][:, None] + np.timedelta64(self.step_hours, "h") * np.arange(
            1, lead_steps + 1
        )
        return np.searchsorted(self.times, wanted)

    def _epoch_perm(self, epoch: int) -> np.ndarray:
        if self._perm is None or self._perm[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._perm = (epoch, rng.permutation(len(self.train_index)))
        return self._perm[1]

    def global_indices(self, step: int) -> np.ndarray:
        """The store time indices of global batch ``step`` (same on every rank and mesh)."""
        n = len(self.train_index)
        out = []
        for j in range(step * self.global_batch, (step + 1) * self.global_batch):
            out.append(self.train_index[self._epoch_perm(j // n)[j % n]])
        return np.asarray(out)

    def _batch(self, inits: np.ndarray, lead_steps: int, slot: int | None = None) -> Batch:
        """Batch of ``inits``; training batches (``slot``) reuse a ring of host buffers and are
        read without the NaN pass: a NaN makes the step's loss non-finite, and ``nan_report``
        then names it (validation batches are checked as they are read)."""
        targets = self.target_indices(inits, lead_steps)
        out = self._buffers.get(slot) if slot is not None else None
        x, y = self.source.batch(np.asarray(inits), targets, self.mean, self.std, out, check_nan=slot is None)
        if slot is not None:
            self._buffers[slot] = (x, y)
        return self._make_batch(x, y, self.times[inits], self.times[targets])

    def _make_batch(self, x: np.ndarray, y: np.ndarray, times: np.ndarray, target_times: np.ndarray) -> Batch:
        return Batch(
            inputs=torch.from_numpy(x),
            targets=torch.from_numpy(y),
            static=self._static,
            time_features=torch.from_numpy(time_features(times)),
            channels=self.channels,
            static_channels=list(self.source.static_channels),
            times=times,
            target_times=target_times,
            tile=self.tile,
            halo=Halo(),
        )

    def batch_of(self, fields: np.ndarray, times: np.ndarray) -> Batch:
        """A forecast's batch from initial states read elsewhere (``predict --init``): ``fields`` ``(B, C,
        h, w)`` of this rank's tile in physical units at ``times``, normalised as a store's are; no
        targets."""
        x = ((np.asarray(fields, np.float32) - self.mean) / self.std).astype(np.float32, copy=False)
        y = np.empty((len(x), 0, *x.shape[1:]), np.float32)
        times = np.asarray(times, "datetime64[ns]")
        return self._make_batch(np.ascontiguousarray(x), y, times, np.empty((len(x), 0), times.dtype))

    def _read_train_batch(self, step: int) -> Batch:
        idx = self.global_indices(step)
        mine = idx[self.replica * self.local_batch : (self.replica + 1) * self.local_batch]
        # slot of a ring of prefetch + 2 buffers: step s's is refilled for step s + prefetch + 2,
        # which is queued only once step s + 1 has begun (pinned copies on CUDA are separate)
        batch = self._batch(mine, self.rollout_steps, slot=step % (self.prefetch + 2))
        return batch.pin_memory() if self.mesh.device.type == "cuda" else batch

    def nan_report(self, batch: Batch) -> str | None:
        """Which channels and times of ``batch`` (this rank's tile of it) hold NaN; None if none."""
        found = []
        for what, data, times in (
            ("input", batch.inputs, np.asarray(batch.times, "datetime64[m]")),
            ("target", batch.targets, np.asarray(batch.target_times, "datetime64[m]")),
        ):
            channel_axis = data.dim() - 3
            nan = torch.isnan(data).movedim(channel_axis, -3)  # (..., C, h, w)
            per_channel = nan.flatten(-2).sum(-1).reshape(-1, nan.shape[-3]).sum(0).cpu()
            where = nan.flatten(-3).any(-1).cpu().numpy()  # (B,) or (B, L): which times
            bad = per_channel.nonzero().flatten().tolist()
            names = [f"{batch.channels[c]!r} ({int(per_channel[c])} values)" for c in bad]
            if names:
                found.append(f"{what} {', '.join(names)} at {', '.join(str(t) for t in times[where][:5])}")
        if not found:
            return None
        return (
            f"NaN values in this rank's tile {self.tile} of the step's batch: {'; '.join(found)}; "
            f"fill them in the source or choose a period without them "
            f"(`jigsaw-earth data inspect PATH` lists NaNs)"
        )

    def batch_bytes(self) -> int:
        """Host bytes of one training batch on this rank (inputs and targets, float32)."""
        h, w = self.tile.shape
        return 4 * self.local_batch * len(self.channels) * h * w * (1 + self.rollout_steps)

    def train_batch(self, step: int) -> Batch:
        """This replica's rows of global batch ``step``, this rank's tile.

        The next ``prefetch`` steps' batches are read on background threads while the caller
        computes on this one (I/O overlapped with compute; pinned host memory on GPU for
        non-blocking copies). A batch is a pure function of its step, so prefetching cannot change
        what is read. ``last_wait_s`` is how long this call blocked.
        """
        t0 = time.perf_counter()
        ahead = self._ahead.pop(step, None)
        if ahead is None:  # first step, a jump (resume, validation) or prefetch 0
            for fut in self._ahead.values():  # reads in flight finish first: they fill ring slots
                if not fut.cancel():
                    with contextlib.suppress(Exception):
                        fut.result()
            self._ahead = {}
        batch = ahead.result() if ahead is not None else self._read_train_batch(step)
        self.last_wait_s = time.perf_counter() - t0
        if self.prefetch:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.prefetch, thread_name_prefix="jigsaw-prefetch")
            for s in range(step + 1, step + 1 + self.prefetch):
                if s not in self._ahead:
                    self._ahead[s] = self._pool.submit(self._read_train_batch, s)
        return batch

    def val_inits(self, lead_steps: int, max_samples: int) -> np.ndarray:
        """Validation initialisation indices, evenly spaced over the period (every rank agrees)."""
        idx = self._inits(self.val_mask, lead_steps, "validation")
        if len(idx) == 0:
            raise ValueError(
                f"the validation period holds no initialisation time with "
                f"{lead_steps * self.step_hours} h of targets; widen data.val_period"
            )
        return evenly_spaced(idx, max_samples)

    def val_batches(self, lead_steps: int, max_samples: int, batch_size: int) -> Iterator[Batch]:
        """This replica's share (round-robin) of the validation inits, in batches."""
        idx = self.val_inits(lead_steps, max_samples)
        mine = idx[self.replica :: self.mesh.axis("data").size]
        for k in range(0, len(mine), batch_size):
            yield self._batch(mine[k : k + batch_size], lead_steps)

    def denormalise(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised ``(..., C, h, w)`` → physical units, on ``x``'s device."""
        std, mean = self._statistics_on(x.device)
        return x * std + mean

    def _statistics_on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(std, mean)`` as ``(C, 1, 1)`` tensors on ``device`` (copied there once)."""
        key = str(device)
        if key not in self._stats_on:
            self._stats_on[key] = (
                torch.from_numpy(self.std).to(device),
                torch.from_numpy(self.mean).to(device),
            )
        return self._stats_on[key]

    def step_time_features(self, batch: Batch, k: int) -> torch.Tensor:
        """Time features of rollout step ``k`` (0 = the input time)."""
        if k == 0:
            return batch.time_features
        times = np.asarray(batch.times).astype("datetime64[h]") + np.timedelta64(k * self.step_hours, "h")
        return torch.from_numpy(time_features(times))


def model_channels(cfg: TrainConfig, data: TrainData) -> ModelChannels:
    """The names of the channels the run's model reads, in its order."""
    noise = [f"noise:{k}" for k in range(cfg.model.noise_channels)]
    static = list(getattr(data.source, "static_channels", ()))
    return ModelChannels.from_lists(data.channels, [*static, *noise], TIME_FEATURES)
