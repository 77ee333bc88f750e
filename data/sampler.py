"""Which times make samples, and in which order each data-parallel rank visits them.

All ranks of one domain group (same ``mesh.coord[0]``) get the same indices, in the same order;
data-parallel groups get disjoint shares. The order is a pure function of ``(seed, epoch)``,
so resuming from ``(epoch, step)`` replays exactly the batches that were not yet consumed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

__all__ = ["EpochSampler", "SampleTimes", "find_gaps", "native_step"]

log = logging.getLogger(__name__)


def native_step(times: np.ndarray) -> np.timedelta64:
    """The store's regular time spacing (the most common difference)."""
    if len(times) < 2:
        raise ValueError(f"the store has {len(times)} time(s); at least 2 are needed")
    diffs = np.diff(np.asarray(times).astype("datetime64[s]"))
    values, counts = np.unique(diffs, return_counts=True)
    step = values[np.argmax(counts)]
    if step <= np.timedelta64(0, "s"):
        raise ValueError("store times are not increasing; sort the store by time")
    return step


def find_gaps(times: np.ndarray) -> list[tuple[np.datetime64, np.datetime64]]:
    """(last time before, first time after) of every spacing larger than the regular step."""
    t = np.asarray(times).astype("datetime64[s]")
    step = native_step(t)
    at = np.nonzero(np.diff(t) != step)[0]
    return [(t[i], t[i + 1]) for i in at]


@dataclass(frozen=True)
class SampleTimes:
    """Input time indices in ``period`` whose ``lead_steps`` targets (``step_hours`` apart) exist.

    ``targets(i)`` gives the store indices of sample ``i``'s targets. A gap in the store inside
    the period is an error unless ``allow_gaps`` (then samples touching it are skipped).
    """

    inputs: np.ndarray
    target_index: np.ndarray  # (n_samples, lead_steps)

    @classmethod
    def build(cls, times: np.ndarray, period: tuple[str, str] | None, step_hours: int,
              lead_steps: int, allow_gaps: bool = False) -> SampleTimes:
        t = np.asarray(times).astype("datetime64[s]")
        step = native_step(t)
        want = np.timedelta64(int(step_hours), "h")
        if want % step:
            raise ValueError(f"step_hours={step_hours} is not a multiple of the store's spacing "
                             f"{step.astype('timedelta64[h]')}; use a multiple of it")
        lo = np.datetime64(period[0], "s") if period else t[0]
        hi = np.datetime64(period[1], "s") if period else t[-1]
        inside = np.nonzero((t >= lo) & (t <= hi))[0]
        if not len(inside):
            raise ValueError(f"period {period} holds no times of the store ({t[0]} … {t[-1]}); "
                             f"choose a period inside it")
        gaps = [(a, b) for a, b in find_gaps(t) if b >= lo and a <= hi]
        if gaps and not allow_gaps:
            a, b = gaps[0]
            raise ValueError(f"the store has {len(gaps)} time gap(s) in {period or 'its range'}, the first "
                             f"between {a} and {b} (spacing {step.astype('timedelta64[h]')}); fill the "
                             f"gap, choose a period without it, or pass allow_gaps=True to skip samples "
                             f"that need a missing time")
        wanted = t[inside][:, None] + want * np.arange(1, lead_steps + 1)[None, :]
        pos = np.clip(np.searchsorted(t, wanted), 0, len(t) - 1)
        ok = (t[pos] == wanted).all(axis=1)
        if not ok.any():
            raise ValueError(f"no time in {period} has {lead_steps} targets {step_hours} h apart inside "
                             f"the store (it ends {t[-1]}); widen the period or lower lead_steps")
        if allow_gaps and (~ok).any():
            log.warning("skipping %d of %d samples whose targets fall in a gap", (~ok).sum(), len(ok))
        return cls(inside[ok], pos[ok])

    def __len__(self) -> int:
        return len(self.inputs)


class EpochSampler:
    """Batches of sample positions for data-parallel rank ``rank`` of ``world``.

    Each epoch permutes ``range(n)`` with ``default_rng([seed, epoch])`` (or keeps the order
    if not ``shuffle``); rank ``r`` takes ``perm[r::world]`` cut to an equal length for every
    rank, then consecutive batches of ``batch_size`` (a last partial batch is dropped).
    """

    def __init__(self, n: int, batch_size: int, *, seed: int = 0, shuffle: bool = True,
                 rank: int = 0, world: int = 1):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        per_rank = n // world
        if per_rank < batch_size:
            raise ValueError(f"{n} samples over {world} data-parallel group(s) give {per_rank} per "
                             f"group, fewer than batch_size={batch_size}; use a longer period or a "
                             f"smaller batch")
        self.n, self.batch_size, self.seed, self.shuffle = n, batch_size, seed, shuffle
        self.rank, self.world = rank, world
        self.epoch, self.step = 0, 0

    def __len__(self) -> int:
        return (self.n // self.world) // self.batch_size

    def epoch_order(self, epoch: int) -> np.ndarray:
        perm = (np.random.default_rng([self.seed, epoch]).permutation(self.n) if self.shuffle
                else np.arange(self.n))
        return perm[self.rank :: self.world][: self.n // self.world]

    def batches(self) -> Iterator[tuple[int, int, np.ndarray]]:
        """(epoch, step, positions) from the current position onward, through this epoch."""
        order = self.epoch_order(self.epoch)
        for step in range(self.step, len(self)):
            yield self.epoch, step, order[step * self.batch_size : (step + 1) * self.batch_size]

    def advance(self, epoch: int, step: int) -> None:
        """Record that batch ``step`` of ``epoch`` was consumed."""
        self.epoch, self.step = epoch, step + 1
        if self.step >= len(self):
            self.epoch, self.step = epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "step": self.step, "seed": self.seed, "n": self.n,
                "world": self.world, "batch_size": self.batch_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        for key in ("seed", "n", "world", "batch_size"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(f"cannot resume: the saved sampler has {key}={state[key]} but this one "
                                 f"has {getattr(self, key)}; resume with the same data settings")
        self.epoch, self.step = int(state["epoch"]), int(state["step"])
