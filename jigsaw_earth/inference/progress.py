"""A forecast that survives its time limit: stop on a signal, record each batch, resume where it stopped.

Signals (``PredictSignals``: training's ``StopSignals`` with Ctrl-C added): ``SIGTERM``, ``SIGUSR1`` and
``SIGINT`` only set a flag. Before every model step of a batch that every data replica has, every rank
learns whether any rank got one (one all-reduce of a flag on a gloo group of host tensors,
``signals.host_group``, so all ranks stop at the same step and a GPU's rollout is never synchronised
for it), so a stop takes one model step however large the batch. Before a batch, each rank waits until
its earlier batches are written, scored and recorded; within one, its inits are not complete (they
complete together, at its last step), so its leads written so far are dropped (its writes in flight
finish first) and the resume forecasts it again. Then ``Stopped`` is raised on every rank
(``jigsaw-earth predict`` exits 75, ``EX_TEMPFAIL``, as training does). The conversion of
``--format grib2|netcdf`` asks before each round of files (``check_stop``), and a resume converts
again. A second Ctrl-C raises ``KeyboardInterrupt`` at once; what was recorded is kept.

Recording (``Progress``, in the output's in-progress folder ``unfinished.py``): after a batch's last lead
is written and scored (on the recording thread, in order), each rank saves its score shares of that batch
(``TileScorer.last_batch``) to ``_progress/scores/rank-R/batch-B.pt``, then the count of its batches
done to ``_progress/rank-R.json``. A resume starts at the batch every rank has recorded (the minimum),
restores each rank's shares of the batches before it, in order, and writes nothing before it again; a
batch in flight when a process was killed is written again (a bucket ``--out``: the same records are
objects under it, ``bucket_output.py``). Forecasts and shares are those of a run that
never stopped, so the store and the scores are the same bit for bit (same mesh, batch and device).

A resume must ask for the same forecast (``forecast_request``): checkpoint (by default the recorded one),
data store, initial conditions (an ``--init`` source's path and content), init times, variables, levels,
leads, members, seed, mesh, batch (by default the recorded one), precision, device, output format and
file names, and scoring (truth, climatology, regions). Anything else may change (``--overwrite``,
``--scores``, logging, the launcher). A different request is refused naming each difference. A
complete output keeps its request (``rerun.py``): the same command again is a no-op.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..distributed.heartbeat import communication_error
from ..ownership import MARKER, check_output, in_progress_path, read_marker
from ..signals import EXIT_PREEMPTED, STOP_SIGNALS, StopSignals, host_group
from .unfinished import (
    FORMAT,
    KIND,
    PROGRESS,
    REQUEST,
    Lock,
    batches_done,
    describe,
    find_unfinished,
    foreign_files,
    foreign_text,
    mark_folder,
    read_request,
    record_arrays,
)

__all__ = [
    "BATCH",
    "EXIT_STOPPED",
    "PredictSignals",
    "Progress",
    "Stopped",
    "differences",
    "forecast_request",
]

log = logging.getLogger(__name__)
EXIT_STOPPED = EXIT_PREEMPTED
CHECKPOINT, BATCH = "checkpoint (--checkpoint)", "batch (--batch-size)"


class Stopped(Exception):
    """Predict stopped on a signal, with every batch done recorded."""

    exit_code = EXIT_STOPPED


class PredictSignals(StopSignals):
    """``SIGTERM``, ``SIGUSR1`` and ``SIGINT`` set ``received``; a second ``SIGINT`` interrupts at once."""

    signals = (*STOP_SIGNALS, signal.SIGINT)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and self.received is not None:
            raise KeyboardInterrupt
        if self.received is None:
            self.received = signal.Signals(signum).name
            log.warning("received %s: predict stops before the next model step, once the batches done "
                        "are recorded (Ctrl-C again: stop at once)", self.received)  # fmt: skip


def _where(path: str | Path) -> str:
    """A local path made absolute (a resume may run from another directory); a URL as given."""
    return str(path) if "://" in str(path) else str(Path(path).expanduser().resolve())


def forecast_request(cfg: Any, checkpoint: Path, step: int, init_times: np.ndarray, selection: Any,
                     members: Any, mesh: Any, batch_size: int, score: Any, init: str | None = None,
                     init_digest: str | None = None, fmt: str = "zarr", template: str | None = None,
                     perturb: Any = None) -> dict[str, Any]:  # fmt: skip
    """What decides a forecast's output: a resume must ask for exactly this (JSON values); ``init``:
    the analysis the initial states come from (``--init``; None: ``data.store``) and ``init_digest`` its
    content's; ``fmt`` and ``template``: the output's format and file names (as resolved); ``perturb``:
    the members' perturbation."""
    times = [str(t) for t in np.asarray(init_times).astype("datetime64[h]")]
    hours = [int(h) for h in selection.leads / np.timedelta64(1, "h")]
    scoring = None
    if score is not None:
        regions = list(score.regions) if score.regions else None
        scoring = {"truth": _where(score.truth or cfg.data.store),
                   "climatology": _where(score.climatology) if score.climatology else None,
                   "regions": regions}  # fmt: skip
    request = {
        CHECKPOINT: str(Path(checkpoint).resolve()),
        "checkpoint step": step,
        "data.store": _where(cfg.data.store),
        "initial conditions (--init)": None if init is None else _where(init),
        "content of the initial conditions (--init)": init_digest,
        "initialisation times (--start, --end, --every-hours, --max-inits)": times,
        "variables (--variables)": [*selection.upper_air, *selection.surface],
        "levels (--levels)": list(selection.levels),
        "leads in hours (--lead-hours, --lead-every, --steps)": hours,
        "model steps (--steps)": selection.steps,
        "members (--members)": None if members is None else members.total,
        "noise seed (--seed)": None if members is None else members.seed,
        "first member (--first-member)": None if members is None else members.first,
        "perturbation (--perturb, --amplitude …)": None if perturb is None else perturb.describe(),
        "mesh (data x [ensemble x] lat x lon)": str(mesh.shape),
        BATCH: batch_size,
        "precision (training.precision)": cfg.training.precision,
        "device": mesh.device.type,
        "scoring (--score --truth --climatology --regions)": scoring,
        "output format (--format)": fmt,
        "file names (--template)": template,
    }
    return json.loads(json.dumps(request))


def _short(value: Any) -> str:
    if isinstance(value, list) and len(value) > 4:
        return f"{len(value)} values {value[0]} … {value[-1]}"
    return json.dumps(value)


def differences(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``item: now (recorded: then)`` for each item of two requests that differs."""
    keys = list(now) + [k for k in recorded if k not in now]
    return [f"{k}: {_short(now.get(k))} (recorded: {_short(recorded.get(k))})"
            for k in keys if recorded.get(k) != now.get(k)]  # fmt: skip


def _atomic(path: Path, write: Any) -> None:
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        write(f)
    os.replace(tmp, path)


class Progress:
    """The progress of one output (``folder`` None: a score-only run without ``--scores``: a signal
    still stops it cleanly, but nothing is recorded)."""

    def __init__(self, folder: Path | None):
        self.folder = folder
        self.lock = Lock(folder) if folder is not None else None
        self.signals: PredictSignals | None = None
        self.first, self.fresh, self.done, self.rank, self.world = 0, True, 0, 0, 1
        self.total = self.common = self.own = self.batch = self.replica = 0
        self.sizes: list[int] = []
        self.request: dict[str, Any] = {}
        self._checked: tuple[Any, Any] = ((), ())
        self._group: Any = None  # the stop flag's gloo group (``signals.host_group``)
        self._failed = False  # a batch's writes or scores failed: nothing after it is recorded

    @classmethod
    def for_output(cls, out: str | Path | None, scores: str | Path | None = None) -> Progress:
        """The progress of ``--out`` (of ``--scores`` without it) in a local folder (a bucket's:
        ``bucket_output.forecast_progress``)."""
        target = out if out is not None else scores
        return cls(None if target is None else in_progress_path(Path(target).expanduser().absolute()))

    def recorded(self, key: str) -> Any:
        info = self._request_info() if self.folder is not None else None
        return None if info is None else info["request"].get(key)

    def checkpoint(self, given: str | None) -> str | None:
        """``--checkpoint`` as given, else the one the recorded progress used (if it still exists)."""
        recorded = self.recorded(CHECKPOINT) if given is None else None
        if recorded is not None and (Path(recorded) / "meta.json").is_file():
            return recorded
        return given

    def batch_size(self, given: int | None) -> int | None:
        return given if given is not None else self.recorded(BATCH)

    def check(self, protected: Any = (), may_hold_outputs: Any = ()) -> None:
        """Before any work: the in-progress folder is predict's own, or new and where ``--out`` may be
        (never the truth store, the checkpoints, ...; ``ownership.check_output``)."""
        self._checked = (protected, may_hold_outputs)
        if self.folder is None:
            return
        if (self.folder / PROGRESS).is_dir() and describe(self.folder) is not None:  # predict's (its mark)
            foreign = foreign_files(self.folder)
            if foreign:
                raise ValueError(
                    f"the in-progress folder {foreign_text(self.folder, foreign)}; nothing was deleted. Move "
                    f"your files out of it and run again"
                )
            return
        if (read_marker(self.folder) or {}).get("complete") is True:
            raise ValueError(
                f"{self.folder} is a complete forecast store, not a forecast in progress; nothing was "
                f"deleted: rename or remove it, or choose another output"
            )
        check_output(self.folder, KIND, overwrite=True, protected=protected,
                     may_hold_outputs=may_hold_outputs, option="the in-progress folder")  # fmt: skip

    @contextmanager
    def watching(self) -> Iterator[PredictSignals]:
        """Stop signals set a flag while inside (collective checks need ``open``'s mesh)."""
        with PredictSignals(None) as stop:  # type: ignore[arg-type]
            self.signals = stop
            yield stop

    # ------------------------------------------------------------------ start
    def open(self, mesh: Any, request: dict[str, Any], n_inits: int, batch_size: int) -> None:
        """Collective: lock the folder, compare a recorded request, find the batch to start from."""
        if self.signals is not None:
            self.signals.mesh = mesh
            self._group = host_group(mesh)
        self.rank, self.world = mesh.rank, mesh.shape.world_size
        replicas, replica = mesh.axis("data").size, mesh.axis("data").index
        self.sizes = [len(range(r, n_inits, replicas)) for r in range(replicas)]  # inits per replica
        counts = [math.ceil(n / batch_size) for n in self.sizes]
        self.total, self.common, self.own, self.replica = max(counts), min(counts), counts[replica], replica
        self.batch, self.request = batch_size, request
        if self.folder is None:
            if self.rank == 0:
                log.warning("a score-only run without --scores PREFIX records no progress: a signal stops "
                            "it cleanly, but a rerun starts over")  # fmt: skip
            return
        answer: list[Any] = [None]
        if self.rank == 0:
            try:
                answer = [self._claim(mesh.shape.world_size)]
            except (ValueError, OSError) as err:
                answer = [f"{type(err).__name__}: {err}"]
        if dist.is_initialized():
            dist.broadcast_object_list(answer, src=0)
        if isinstance(answer[0], str):
            raise ValueError(answer[0].split(": ", 1)[1])
        self.first, self.fresh = answer[0]
        self.done = self.first

    def _claim(self, world: int) -> tuple[int, bool]:
        folder = self.folder
        assert folder is not None and self.lock is not None
        self.check(*self._checked)  # again, just before it is written: never clear what predict did not write
        self.lock.acquire()
        try:
            info = self._request_info()
            if info is not None:
                diffs = differences(info["request"], self.request)
                if diffs:
                    raise ValueError(
                        f"{folder} holds an unfinished forecast of another request; it differs in: "
                        f"{'; '.join(diffs)}. A resume needs the same checkpoint, store, initial conditions, "
                        f"inits, variables, levels, leads, members, seed, mesh, batch, precision, device, "
                        f"format, file names and scoring "
                        f"(--overwrite, --scores, logging and the launcher may change). Run it as recorded "
                        f"to finish it, or remove it: {self._removal()}"
                    )
                first = min(self._batches_done(world), self.total)
                log.info("resuming %s: %d of %d batches recorded; starting at batch %d", folder, first,
                         self.total, first + 1)  # fmt: skip
            else:  # new, or its creation was cut short: start it (again), marked as predict's
                first = 0
                self._start()
            self._others()
        except BaseException:
            self.lock.release()
            raise
        return first, info is None

    # ------------------------------------------------------------------ records (BucketProgress: a bucket's)
    def _request_info(self) -> dict[str, Any] | None:
        assert self.folder is not None
        return read_request(self.folder)

    def _batches_done(self, world: int) -> int:
        assert self.folder is not None
        return batches_done(self.folder, world)

    def _removal(self) -> str:
        """The command that removes this unfinished forecast."""
        return f"jigsaw-earth predict --remove-unfinished {self.folder}"

    def _start(self) -> None:
        """A new folder (or one whose start was cut short): emptied but for the lock, and marked."""
        assert self.folder is not None
        self._clear(self.folder)
        mark_folder(self.folder)

    def _others(self) -> None:
        """Warn of the abandoned unfinished forecasts beside this one."""
        assert self.folder is not None
        for item in find_unfinished(self.folder.parent, besides=self.folder):
            log.warning("%s; remove it: jigsaw-earth predict --remove-unfinished %s", item.text(),
                        item.path)  # fmt: skip

    def _record_start(self) -> bool:
        """Rank 0, a new run: mark a score-only folder, record the arrays the writer made; whether
        the run is score-only (no store)."""
        import zarr

        assert self.folder is not None
        scores_only = not (self.folder / "zarr.json").exists()
        if scores_only:  # no store: the marker alone
            group = zarr.open_group(self.folder, mode="a", zarr_format=3)
            group.attrs[MARKER] = {"kind": KIND, "complete": False}
        record_arrays(self.folder)  # what predict's writer made: the only arrays it may hold
        return scores_only

    def _get(self, key: str) -> bytes | None:
        """The record ``key`` (a path under the folder), None if absent."""
        assert self.folder is not None
        try:
            return (self.folder / key).read_bytes()
        except FileNotFoundError:
            return None

    def _put(self, key: str, data: bytes) -> None:
        """Write the record ``key`` whole (a reader sees the old one or the new one)."""
        assert self.folder is not None
        path = self.folder / key
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic(path, lambda f: f.write(data))

    def _finished(self) -> None:
        """Rank 0, the output complete: its records go (a store's went with its rename)."""
        assert self.folder is not None
        if self.folder.exists():
            shutil.rmtree(self.folder)

    def _discard(self) -> None:
        """Rank 0, nothing recorded: the output in progress goes."""
        assert self.folder is not None
        shutil.rmtree(self.folder, ignore_errors=True)

    @staticmethod
    def _clear(folder: Path) -> None:
        for entry in folder.iterdir():
            inner = list(entry.iterdir()) if entry.name == PROGRESS else [entry]
            for path in inner:
                if path.name != "lock":
                    shutil.rmtree(path) if path.is_dir() else path.unlink()

    def begin(self, scorer: Any) -> None:
        """After the store exists: record the request (rank 0, new runs), restore earlier scores."""
        if self.folder is None:
            return
        if self.rank == 0 and self.fresh:
            scores_only = self._record_start()
            info = {"format": FORMAT, "request": self.request, "batches": self.total,
                    "batch_size": self.batch, "inits": sum(self.sizes), "world": self.world,
                    "scores_only": scores_only, "created": time.time()}  # fmt: skip
            self._put(f"{PROGRESS}/{REQUEST}", json.dumps(info, indent=1).encode())
        if scorer is not None:
            batches = []
            for g in range(min(self.first, self.own)):
                data = self._get(self._shares(g))
                if data is None:
                    raise FileNotFoundError(
                        f"{self.folder}/{self._shares(g)} is missing: the recorded progress of {self.folder} "
                        f"is damaged; remove it ({self._removal()}) and run again"
                    )
                batches.append(torch.load(io.BytesIO(data), map_location="cpu", weights_only=True))
            scorer.restore(batches)
        if self.first >= self.own:  # nothing left for this rank
            self._record_count(self.total)

    # ------------------------------------------------------------------ each batch
    def remaining(self, chunks: list[Any]) -> list[Any]:
        """The batches still to run (the loop's index ``i`` is then batch ``first + i``)."""
        return chunks[self.first :]

    def _asked(self) -> bool:
        """Collective: whether any rank received a stop signal."""
        return self.signals is not None and self.signals.should_stop(self._group)

    def boundary(self, i: int, pipe: Any) -> None:
        """Collective before batch ``first + i``: on a signal to any rank, record and raise ``Stopped``."""
        g = self.first + i
        if g >= self.common or not self._asked():
            return
        self._stop(pipe, f"before batch {g + 1} of {self.total}", g)

    def within(self, i: int, step: int, steps: int, pipe: Any,
               writes: Callable[[], Sequence[Future]]) -> None:  # fmt: skip
        """Collective before model step ``step + 1`` (of ``steps``, ``step`` ≥ 1) of batch ``first + i``:
        on a signal to any rank, drop the batch (its inits are not complete: ``writes()``, its write jobs
        so far, are cancelled or finish first), record the earlier ones and raise ``Stopped``."""
        g = self.first + i
        if g >= self.common or not self._asked():
            return
        for job in writes():  # nothing of this run may write after its lock is released
            job.cancel() or job.exception()
        where = (f"in batch {g + 1} of {self.total}, after model step {step} of {steps} (its inits, not "
                 f"complete, are forecast again on resume)")  # fmt: skip
        self._stop(pipe, where, g)

    def check_stop(self, what: str) -> None:
        """Collective, once every batch is recorded (``what``: the work under way, e.g. the conversion
        to files): on a signal to any rank, raise ``Stopped``; the resume does that work again."""
        if self._asked():
            self._stop(None, f"during {what} (done again on resume)", self.total)

    def _stop(self, pipe: Any, where: str, g: int) -> None:
        if pipe is not None:
            pipe.drain()  # every earlier batch written, scored and recorded
        if dist.is_initialized():
            dist.barrier()
        if self.lock is not None:
            self.lock.release()
        done = sum(min(g * self.batch, n) for n in self.sizes)
        recorded = (f"{min(g, self.total)} of {self.total} batches ({done} of {sum(self.sizes)} inits) are "
                    f"recorded in {self.folder}: run the same command again (sbatch --requeue does) to resume"
                    if self.folder is not None else "nothing is recorded for a score-only run without "
                    "--scores PREFIX: a rerun starts over")  # fmt: skip
        assert self.signals is not None
        raise Stopped(f"stopped on {self.signals.received} {where}; {recorded}")

    def record(self, i: int, scored: Future | None, written: Sequence[Future] = ()) -> None:
        """On the recording thread, once batch ``first + i`` is written (``written``: its write jobs)
        and scored (``scored``: the scoring thread's future of its shares; None without ``--score``):
        record it, with its score shares. After a batch that failed, no later one is recorded."""
        if self._failed:
            raise RuntimeError(f"batch {self.first + i + 1} is not recorded: an earlier batch failed")
        try:
            for job in written:
                job.result()
            shares = None if scored is None else scored.result()
        except BaseException:
            self._failed = True
            raise
        if self.folder is None:
            return
        g = self.first + i
        if shares is not None:
            shares = {m: t.cpu() for m, t in shares.items()}  # any device may resume them
            data = io.BytesIO()
            torch.save(shares, data)
            self._put(self._shares(g), data.getvalue())
        self._record_count(self.total if g + 1 >= self.own else g + 1)

    @property
    def skipped(self) -> int:
        """This replica's inits in the batches an earlier run recorded."""
        return min(self.first * self.batch, self.sizes[self.replica]) if self.sizes else 0

    def inits_this_run(self) -> int:
        """Inits forecast by this invocation, every replica together."""
        return sum(n - min(self.first * self.batch, n) for n in self.sizes)

    # ------------------------------------------------------------------ the end
    def finish(self) -> None:
        """Collective, after success: remove the progress (a store's left with its rename)."""
        if self.folder is None:
            return
        if dist.is_initialized():
            dist.barrier()
        if self.rank == 0:
            self._finished()
        if self.lock is not None:
            self.lock.held = False

    def abort(self, err: BaseException) -> None:
        """A failure or a second Ctrl-C: keep what is recorded (rank 0 removes a folder of nothing)."""
        if self.folder is None or isinstance(err, Stopped) or self.lock is None or not self.lock.held:
            return
        self.lock.release()
        if self.done == 0:
            self._discard()
        else:  # a lost peer's verdict names the folder in its one line (distributed/heartbeat.py)
            say = log.debug if communication_error(err) else log.warning
            say("kept %s: %d of %d batches recorded; run the same command again to resume, or remove it: "
                "%s", self.folder, self.done, self.total, self._removal())  # fmt: skip

    # ------------------------------------------------------------------ files
    def _shares(self, batch: int) -> str:
        return f"{PROGRESS}/scores/rank-{self.rank:05d}/batch-{batch:06d}.pt"

    def _record_count(self, done: int) -> None:
        text = json.dumps({"batches": done, "time": time.time()}).encode()
        self._put(f"{PROGRESS}/rank-{self.rank:05d}.json", text)
        self.done = done
