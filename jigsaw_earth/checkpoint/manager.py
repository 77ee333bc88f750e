"""Save, find and load checkpoints of a run: sharded, atomic, loadable on any mesh.

Layout of ``RUN_DIR/checkpoints/``::

    step_000120/            a complete checkpoint
        .metadata           DCP index of every saved chunk (global shape, offsets, file)
        __<rank>_0.distcp   tensor data written by each rank (only data-replica 0 writes)
        meta.json           step, mesh, tensor shapes, optimizer hyper-parameters, user state
        rank_state/rank_00003.json   optional per-rank JSON state (RNG, loader position)
    step_000240.tmp/        a save in progress (or one that crashed): never loaded
    latest                  name of the newest complete checkpoint (replaced atomically)
    step_000120/.pin-HOST-PID-TOKEN   a reader (predict) holds it: pruning skips it

A reader pins the checkpoint it loads (``pinned``), renewing the pin's lease while it reads; pruning
skips a pinned checkpoint (a stale pin, judged as a lock is by ``locks.holder_alive``: its process
gone from this host, or another host's lease run out, is removed), and renames a checkpoint aside
before removing it, checking for a pin once more, so a reader and a pruning training run never race.

A save writes into ``step_N.tmp/``; after every rank has written, rank 0 writes ``meta.json``
last, renames the folder to ``step_N/`` and replaces ``latest``. A crash at any point leaves the
previous checkpoint and ``latest`` untouched; the next save removes the leftover ``.tmp`` folder.
All functions that take a ``mesh`` are collective: every rank of the job calls them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from ..distributed.comm import all_reduce_
from ..distributed.mesh import DomainMesh
from ..fs_errors import os_error_in
from ..locks import holder_alive, renew, slurm_attempt, start_time, stop_renewing
from .planner import Block, BlockSavePlanner
from .state import (
    model_blocks,
    optimizer_blocks,
    optimizer_json,
)

__all__ = [
    "CHECKPOINT_DIR",
    "CheckpointWriteError",
    "SaveJob",
    "SaveRequest",
    "capture",
    "latest_checkpoint",
    "list_checkpoints",
    "pinned",
    "read_meta",
    "save_checkpoint",
    "write_checkpoint",
]

log = logging.getLogger(__name__)
CHECKPOINT_DIR = "checkpoints"
FORMAT = "jigsaw-earth-checkpoint"
VERSION = 1
_STEP_RE = re.compile(r"^step_(\d+)$")


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _quiet(fn: Any, *args: Any, **kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        return fn(*args, **kwargs)


def _write_json(path: Path, data: Any) -> None:
    def fail(obj: Any) -> Any:
        raise ValueError(
            f"{path.name}: cannot store a {type(obj).__name__} ({obj!r:.80}) as JSON; pass numbers/str"
        )

    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=fail)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints of a run (those with ``meta.json``), oldest first."""
    root = Path(run_dir) / CHECKPOINT_DIR
    found = [(int(m.group(1)), p) for p in root.glob("step_*") if (m := _STEP_RE.match(p.name))]
    return [p for _, p in sorted(found) if (p / "meta.json").is_file()]


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint of ``run_dir`` (via ``latest``), or ``None`` if there is none."""
    root = Path(run_dir) / CHECKPOINT_DIR
    pointer = root / "latest"
    if pointer.is_file():
        target = root / pointer.read_text().strip()
        if (target / "meta.json").is_file():
            return target
        log.warning("%s names %s, which is incomplete; using the newest complete checkpoint", pointer, target)
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


@dataclass(frozen=True)
class SaveRequest:
    """One checkpoint save: ``model`` (and ``optimizer``) at ``step`` into ``RUN_DIR/checkpoints/``, as
    ``save_checkpoint`` and ``BackgroundSaver.save`` take it.

    ``state`` (JSON-ready; rank 0's copy is stored) holds what else a resume needs: data-loader
    position, scheduler state, config hash. ``rank_state`` is per rank (e.g. ``capture_rng()``).
    The save keeps the newest ``keep_last`` checkpoints (``None``: all) and never removes the one
    ``latest`` names. With ``expected_bytes`` (the checkpoint's estimated size) and too little free space, the
    checkpoints that this save would prune anyway are pruned *before* it (never ``latest``'s).
    """

    run_dir: str | os.PathLike
    step: int
    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    mesh: DomainMesh
    state: dict[str, Any] | None = None
    _: KW_ONLY
    rank_state: dict[str, Any] | None = None
    keep_last: int | None = 3
    expected_bytes: int | None = None


@dataclass
class SaveJob:
    """What one save writes, captured at its step: this rank's blocks (the live tensors, or host
    copies for a save written in the background), ``meta.json`` and this rank's state."""

    root: Path
    step: int
    blocks: dict[str, Block]
    meta: dict[str, Any]
    rank_state: dict[str, Any] | None
    keep_last: int | None
    expected_bytes: int | None

    @property
    def final(self) -> Path:
        return self.root / f"step_{self.step:09d}"

    @property
    def tmp(self) -> Path:
        return self.root / f"step_{self.step:09d}.tmp"


def capture(
    request: SaveRequest, stage: Callable[[dict[str, Block]], dict[str, Block]] | None = None
) -> SaveJob:
    """The ``SaveJob`` of ``request``; ``stage`` copies the blocks this rank writes (e.g. into host
    memory) so that training may change the live tensors meanwhile."""
    model, optimizer, mesh, step = request.model, request.optimizer, request.mesh, request.step
    tensors = model_blocks(model)
    if optimizer is not None:
        tensors.update(optimizer_blocks(model, optimizer))
    writes_shards = mesh.replicas.index == 0  # data × ensemble replicas hold identical shards: 0 writes
    writes_whole = writes_shards and mesh.domain.index == 0
    blocks = {k: b for k, (b, rep) in tensors.items() if (writes_whole if rep else writes_shards)}
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "step": step,
        "mesh": str(mesh.shape),
        "world_size": mesh.shape.world_size,
        "torch": torch.__version__,
        "tensors": {k: {"global_shape": list(b.global_shape)} for k, (b, _) in tensors.items()},
        "optimizer": None if optimizer is None else optimizer_json(model, optimizer),
        "state": request.state or {},
    }
    root = Path(request.run_dir) / CHECKPOINT_DIR
    staged = blocks if stage is None else stage(blocks)
    return SaveJob(root, step, staged, meta, request.rank_state, request.keep_last, request.expected_bytes)


def save_checkpoint(request: SaveRequest) -> Path:
    """Write the checkpoint ``request`` describes; collective over the job. Returns the final path.
    ``BackgroundSaver`` writes the same files from a thread, training meanwhile.

    A save that fails on any rank (a full disk, a blocked directory) removes its ``.tmp``
    folder on every rank's behalf and raises on every rank: the filesystem's ``OSError`` where
    it happened, ``CheckpointWriteError`` elsewhere; a later save can succeed.
    """
    t0 = time.perf_counter()
    final = write_checkpoint(capture(request), lambda failed: _any_rank(request.mesh, failed))
    log.info("saved checkpoint %s in %.2f s", final, time.perf_counter() - t0)
    return final


def write_checkpoint(
    job: SaveJob, any_rank: Callable[[bool], bool], group: dist.ProcessGroup | None = None
) -> Path:
    """Write ``job``'s files into ``step_N.tmp/`` and commit them; collective over the job.

    ``any_rank(failed)`` tells every rank whether any rank failed (one all-reduce); DCP's own
    collectives run on ``group`` (``None``: the default group).
    """
    tmp, rank = job.tmp, _rank()
    failure: BaseException | None = None
    if rank == 0:
        try:
            job.root.mkdir(parents=True, exist_ok=True)
            for stale in job.root.glob("step_*.tmp"):
                shutil.rmtree(stale, ignore_errors=True)
            if job.expected_bytes and job.keep_last is not None:
                _make_room(job.root, job.expected_bytes, job.keep_last)
            tmp.mkdir()
        except OSError as err:
            failure = err
    _agree(any_rank, failure, tmp, job.step)
    try:
        writer = dcp.FileSystemWriter(tmp)
        _quiet(dcp.save, {}, storage_writer=writer, planner=BlockSavePlanner(job.blocks), process_group=group)
        if job.rank_state is not None:
            (tmp / "rank_state").mkdir(exist_ok=True)
            _write_json(tmp / "rank_state" / f"rank_{rank:05d}.json", job.rank_state)
    except (Exception, CheckpointException) as err:  # DCP's CheckpointException is a BaseException
        failure = os_error_in(err) or err
    _agree(any_rank, failure, tmp, job.step)
    try:
        _commit(tmp, job.final, job.meta, job.keep_last)
    except OSError as err:
        failure = err
    _agree(any_rank, failure, tmp, job.step)
    return job.final


class CheckpointWriteError(ValueError):
    """Another rank could not write its part of a checkpoint (its own error names the cause)."""


def _any_rank(mesh: DomainMesh, failed: bool) -> bool:
    """Collective over the mesh: whether any rank ``failed``."""
    flag = torch.tensor([1.0 if failed else 0.0], device=mesh.device)
    if dist.is_initialized():
        all_reduce_(flag, mesh.world, op="checkpoint.agree", reduce=dist.ReduceOp.MAX)
    return bool(flag.item())


def _agree(any_rank: Callable[[bool], bool], failure: BaseException | None, tmp: Path, step: int) -> None:
    """Collective: if any rank failed, rank 0 removes ``tmp`` and every rank raises."""
    if not any_rank(failure is not None):
        return
    if _rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    if failure is None:
        raise CheckpointWriteError(
            f"checkpoint of step {step} not saved: another rank could not write its part (its error "
            f"names the path and the cause); {tmp} was removed and the previous checkpoint is untouched"
        )
    raise failure


def _make_room(root: Path, expected_bytes: int, keep_last: int) -> None:
    """Before a save on a nearly full disk: prune what the save would prune anyway (not ``latest``)."""
    free = _free_bytes(root)
    if free >= expected_bytes:
        return
    for old in _prunable(root, max(keep_last - 1, 0)):
        log.warning(
            "only %.1f MiB free for a ~%.1f MiB checkpoint: removing %s before saving (checkpoint.keep=%d)",
            free / 2**20,
            expected_bytes / 2**20,
            old,
            keep_last,
        )
        _remove_unpinned(old)
        free = _free_bytes(root)
        if free >= expected_bytes:
            return


def _free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def _prunable(root: Path, keep: int) -> list[Path]:
    """Complete checkpoints beyond the newest ``keep``, oldest first, never the one ``latest`` names."""
    pointer = root / "latest"
    named = pointer.read_text().strip() if pointer.is_file() else None
    found = list_checkpoints(root.parent)
    old = found[: max(len(found) - keep, 0)]
    return [p for p in old if p.name != named and not _pinned_by(p)]


_PIN = ".pin-"


@contextmanager
def pinned(path: str | os.PathLike) -> Iterator[Path]:
    """Pin checkpoint ``path`` while it is read (pruning skips it); yields the path.

    Raises ``FileNotFoundError`` if the checkpoint was pruned before the pin was in place. A
    checkpoint on a read-only filesystem cannot be pinned, nor pruned: it is read unpinned.
    """
    path = Path(path)
    read_meta(path)  # a complete checkpoint, or an error naming what is missing
    pin = path / f"{_PIN}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    me = {"host": socket.gethostname(), "pid": os.getpid(), "start": start_time(os.getpid()),
          **slurm_attempt(), "time": time.time()}  # fmt: skip
    try:
        pin.write_text(json.dumps(me))
        renew(pin)
    except OSError as err:
        log.debug("cannot pin %s (%s); reading it unpinned", path, err)
        pin = None
    try:
        if not (path / "meta.json").is_file():  # pruned between read_meta and the pin
            raise FileNotFoundError(
                f"checkpoint {path} was pruned by a training run while predict started; "
                f"run again (the newest checkpoint is used)"
            )
        yield path
    finally:
        if pin is not None:
            stop_renewing(pin)
            pin.unlink(missing_ok=True)


def _pinned_by(path: Path) -> list[Path]:
    """Live pins of a checkpoint; a stale one (``locks.holder_alive``) is removed."""
    live = []
    for pin in path.glob(f"{_PIN}*"):
        try:
            info = json.loads(pin.read_text())
        except (OSError, ValueError):
            live.append(pin)  # being written: count it
            continue
        if not holder_alive(info, pin):
            pin.unlink(missing_ok=True)
            continue
        live.append(pin)
    if live:
        log.info("not pruning %s: read by %s (a pin is stale once its process is gone, or, on another "
                 "host, once its lease runs out)", path, live[0].name)  # fmt: skip
    return live


def _remove_unpinned(path: Path) -> None:
    """Remove an old checkpoint unless a reader pinned it meanwhile (renamed aside, pins re-checked)."""
    aside = path.with_name(path.name + ".pruning.tmp")
    try:
        os.replace(path, aside)
    except OSError:
        return
    if _pinned_by(aside):
        os.replace(aside, path)
        return
    shutil.rmtree(aside, ignore_errors=True)


def _commit(tmp: Path, final: Path, meta: dict[str, Any], keep_last: int | None) -> None:
    """Rank 0: write meta.json last, rename into place, move ``latest``, prune old checkpoints."""
    if _rank() != 0:
        return
    _write_json(tmp / "meta.json", meta)
    if final.exists():  # re-saving a step (e.g. after a resume): swap, then drop the old one
        old = final.with_name(final.name + ".old.tmp")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _write_json_text(final.parent / "latest", final.name)
    if keep_last is not None:
        for old in _prunable(final.parent, keep_last):
            _remove_unpinned(old)


def _write_json_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint's ``meta.json``, with errors that say what is wrong and what to do."""
    path = Path(path)
    meta_file = path / "meta.json"
    if not meta_file.is_file():
        hint = " (a save that did not finish)" if path.name.endswith(".tmp") else ""
        raise FileNotFoundError(
            f"{meta_file} not found: {path} is not a complete jigsaw-earth checkpoint{hint}; pass a "
            "step_N folder of RUN_DIR/checkpoints, or use latest_checkpoint(RUN_DIR) to find the newest one"
        )
    try:
        meta = json.loads(meta_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{meta_file} is corrupted ({e}); delete {path} and resume from an older checkpoint"
        ) from e
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ValueError(
            f"{meta_file} has format {meta.get('format')!r} version {meta.get('version')!r}; this code reads "
            f"{FORMAT!r} version {VERSION}"
        )
    return meta
