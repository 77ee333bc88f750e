"""``model export``: a trained run's model as one folder that needs nothing else (``folder.py``).

Collective: every rank of the mesh builds the run's model on its tile, loads the checkpoint (any
mesh) and writes its own blocks of every weight into consolidated safetensors files (rank 0 wrote
each file's header and size first; ``checkpoint.safetensors_files``): no rank gathers a tensor. As
a checkpoint is written, only data replica 0 writes, and a replicated weight only its domain rank
0. The static fields and the reference forecast's initial state are written the same way, as
tiles of global fields; the reference forecast runs on the mesh (``reference.py``). Each rank then
hashes some of the files; rank 0 writes the contract, the reference's statistics, the index, the
model card and the record, and renames the folder into place.

The folder is written as ``OUT.tmp-<token>`` and renamed when complete; ``--out`` is checked first
(``ownership.check_output``): an existing folder is replaced, with ``--overwrite``, only if it is
empty or an earlier export; a failure on any rank removes the temporary folder on every rank's
behalf and raises everywhere.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from ..checkpoint import load_checkpoint, pinned, read_meta
from ..checkpoint.planner import Block
from ..checkpoint.safetensors_files import FileLayout, create_files, plan_files, write_block
from ..checkpoint.state import model_blocks
from ..config.schema import TrainConfig
from ..data.samples import model_channels
from ..distributed.comm import all_reduce_
from ..distributed.mesh import DomainMesh
from ..distributed.rank0 import on_rank0
from ..mesh_setup import setup_mesh
from ..models.run import build_run_model
from ..ownership import FOLDER_MARKER, MARKER, check_output, replace_output, unique_tmp
from .card import model_card
from .contract import FORMAT, VERSION, make_contract
from .folder import CARD, CONTRACT, INDEX, KIND, REFERENCE, REFERENCE_STATE, STATIC, file_sha256
from .reference import run_reference

__all__ = ["ExportRequest", "export_model", "write_weights"]

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class ExportRequest:
    """What ``model export`` writes: ``out``; the card's ``license``, ``datasets`` and ``scores`` (a
    ``score`` PREFIX.json); weight files of at most ``max_file_bytes``; the reference's steps."""

    out: Path
    license: str
    overwrite: bool = False
    max_file_bytes: int = 5 * 10**9
    scores: Path | None = None
    datasets: tuple[str, ...] = ()
    reference_steps: int = 2


def _shared(mesh: DomainMesh, fn: Callable[[], T]) -> T:
    """``fn()`` on rank 0, its result on every rank (its error raised on every rank)."""
    result = on_rank0(mesh, fn)
    if mesh.is_distributed and dist.is_initialized():
        box = [result]
        dist.broadcast_object_list(box, src=0)
        result = box[0]
    return result  # type: ignore[return-value]


def _any_rank(mesh: DomainMesh, failed: bool) -> bool:
    flag = torch.tensor([1.0 if failed else 0.0], device=mesh.device)
    if mesh.is_distributed and dist.is_initialized():
        all_reduce_(flag, mesh.world, op="export.agree", reduce=dist.ReduceOp.MAX)
    return bool(flag.item())


def write_weights(
    folder: Path, model: torch.nn.Module, mesh: DomainMesh, max_file_bytes: int, metadata: dict[str, str]
) -> tuple[list[FileLayout], dict[str, str]]:
    """Write ``model``'s weights into ``folder`` (collective): rank 0 creates the files, every
    writing rank puts its blocks in place. Returns the files and the index (tensor → file)."""
    blocks = model_blocks(model)
    tensors = {
        k.removeprefix("model/"): (tuple(b.global_shape), b.tensor.dtype) for k, (b, _) in blocks.items()
    }
    layouts = plan_files(tensors, max_file_bytes, "model", metadata)
    on_rank0(mesh, lambda: create_files(folder, layouts))
    where = {name: layout for layout in layouts for name in layout.tensors}
    writes_shards = mesh.replicas.index == 0  # as a checkpoint: data x ensemble replica 0 writes
    writes_whole = writes_shards and mesh.domain.index == 0
    failure: BaseException | None = None
    try:
        for key, (block, replicated) in blocks.items():
            if writes_whole if replicated else writes_shards:
                name = key.removeprefix("model/")
                write_block(folder, where[name], name, block)
    except (OSError, ValueError) as err:
        failure = err
    if _any_rank(mesh, failure is not None):
        raise failure or OSError(
            f"another rank could not write its weights into {folder} (its error names it)"
        )
    return layouts, {name: layout.name for name, layout in where.items()}


def _write_field(folder: Path, mesh: DomainMesh, stem: str, name: str, tile: torch.Tensor | np.ndarray,
                 global_shape: tuple[int, ...], offsets: tuple[int, ...]) -> FileLayout:  # fmt: skip
    """A global field ``(C, H, W)`` written by the tiles of domain ranks of replica 0 (collective)."""
    tile = torch.as_tensor(np.asarray(tile, np.float32))
    (layout,) = plan_files({name: (global_shape, torch.float32)}, 2**62, stem)
    on_rank0(mesh, lambda: create_files(folder, [layout]))
    failure: BaseException | None = None
    try:
        if mesh.replicas.index == 0:
            write_block(folder, layout, name, Block(tile, global_shape, offsets))
    except OSError as err:
        failure = err
    if _any_rank(mesh, failure is not None):
        raise failure or OSError(f"another rank could not write its tile of {folder / layout.name}")
    return layout


def _hashes(mesh: DomainMesh, folder: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """Size and SHA-256 of each file, the files shared out over the ranks (collective)."""
    mine = {n: {"bytes": (folder / n).stat().st_size, "sha256": file_sha256(folder / n)}
            for k, n in enumerate(sorted(names)) if k % mesh.shape.world_size == mesh.rank}  # fmt: skip
    if not (mesh.is_distributed and dist.is_initialized()):
        return mine
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return {k: v for part in everyone for k, v in part.items()}


def _checks(cfg: TrainConfig, ckpt: Path, request: ExportRequest) -> tuple[tuple[str, Any], ...]:
    """Before any work, on every rank: ``--out`` may be written, the scores and license are usable."""
    if not request.license.strip() or "\n" in request.license:
        raise ValueError(
            f"--license {request.license!r}: give the license's identifier, e.g. apache-2.0, cc-by-4.0"
        )
    if request.reference_steps < 1:
        raise ValueError(f"--reference-steps {request.reference_steps}: give 1 or more")
    if request.max_file_bytes < 2**20:
        raise ValueError(f"--max-file-size {request.max_file_bytes} bytes: give 1MB or more, e.g. 5GB")
    protected = (
        ("training store data.store", cfg.data.store),
        ("checkpoint folder", ckpt),
        ("checkpoints of run.dir", Path(cfg.run.dir) / "checkpoints"),
    )
    check_output(request.out, KIND, overwrite=request.overwrite, protected=protected,
                 may_hold_outputs=(("run directory run.dir", cfg.run.dir),))  # fmt: skip
    if request.scores is not None:
        from ..metrics.scorecard import read_scores

        read_scores(request.scores)  # a score file of `jigsaw-earth score`, or an error saying so
    return protected


def export_model(
    cfg: TrainConfig, ckpt: Path, request: ExportRequest, mesh: DomainMesh | None = None
) -> Path:
    """Write the model of checkpoint ``ckpt`` (of the run ``cfg``) as a shared-model folder at
    ``request.out`` (collective; ``mesh``: an existing mesh of ``cfg.mesh``'s shape, kept up)."""
    protected = _checks(cfg, ckpt, request)
    own = mesh is None
    mesh = setup_mesh(cfg) if mesh is None else mesh
    try:
        return _export(cfg, ckpt, request, mesh, protected)
    finally:
        if own and dist.is_initialized():
            dist.destroy_process_group()


def _export(cfg: TrainConfig, ckpt: Path, request: ExportRequest, mesh: DomainMesh, protected: Any) -> Path:
    from ..data.sources import build_data

    data = build_data(cfg, mesh, training=False)
    model = build_run_model(cfg, mesh, data)
    with pinned(ckpt):
        step = int(load_checkpoint(ckpt, model, None, mesh)["step"])
    model.eval()
    n_params = sum(int(np.prod(b.global_shape)) for k, (b, _) in model_blocks(model).items())
    training = {
        "run": cfg.run.name,
        "step": step,
        "mesh": read_meta(ckpt)["mesh"],
        "torch": torch.__version__,
        "exported_on": f"{mesh.shape} ranks, {mesh.device.type}",
        "parameters": n_params,
        **_run_summary(Path(cfg.run.dir), step),
    }
    ch = model_channels(cfg, data)
    channels = {"state": list(ch.state), "static": list(ch.static), "time": list(ch.time)}
    contract_text = _shared(
        mesh, lambda: json.dumps(make_contract(cfg, data, channels, training), indent=1) + "\n"
    )
    contract = json.loads(contract_text)
    contract_sha = hashlib.sha256(contract_text.encode()).hexdigest()
    tmp = _shared(mesh, lambda: _make_tmp(request.out))
    try:
        meta = {"format": "pt", "jigsaw_earth": FORMAT, "contract_sha256": contract_sha}
        layouts, weight_map = write_weights(tmp, model, mesh, request.max_file_bytes, meta)
        init = int(data.val_inits(request.reference_steps, 1)[0])
        state, static, expected = run_reference(model, data, mesh, init, request.reference_steps,
                                                cfg.training.precision, cfg.loss.tendency_scaling,
                                                cfg.model.noise_channels)  # fmt: skip
        at, grid = (0, data.tile.lat_start, data.tile.lon_start), (data.grid.n_lat, data.grid.n_lon)
        _write_field(tmp, mesh, "static", "static", static, (static.shape[0], *grid), at)
        _write_field(tmp, mesh, "reference", "state", state, (state.shape[0], *grid), at)
        files = [*(lay.name for lay in layouts), STATIC, REFERENCE_STATE]
        sums = _hashes(mesh, tmp, files)
        total = sum(lay.size - len(lay.header) for lay in layouts)
        on_rank0(mesh, lambda: _finish(tmp, request, contract, contract_text, contract_sha, expected, sums,
                                       weight_map, total, protected, cfg))  # fmt: skip
    except BaseException:
        if mesh.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if mesh.rank == 0:
        log.info("exported %s (step %d of run %r, %d parameters in %d weight file(s)) to %s", ckpt, step,
                 cfg.run.name, n_params, len(layouts), request.out)  # fmt: skip
    return Path(request.out)


def _run_summary(run_dir: Path, step: int) -> dict[str, Any]:
    """The training's wall time, rate and final loss from the run's ``summary.json`` when it ended at
    ``step`` (empty otherwise: the checkpoint is an earlier one, or the run left none)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    if summary.get("steps") != step:
        return {}
    keys = ("train_wall_s", "samples_per_s", "final_loss")
    return {k: summary[k] for k in keys if isinstance(summary.get(k), int | float)}


def _make_tmp(out: Path) -> Path:
    tmp = unique_tmp(Path(out).expanduser().resolve())
    tmp.mkdir(parents=True)
    return tmp


def _finish(tmp: Path, request: ExportRequest, contract: dict[str, Any], contract_text: str,
            contract_sha: str, expected: dict[str, Any], sums: dict[str, Any], weight_map: dict[str, str],
            total: int, protected: Any, cfg: TrainConfig) -> None:  # fmt: skip
    """Rank 0: the contract, reference, index, card and record; then the rename into place."""
    (tmp / CONTRACT).write_text(contract_text)
    (tmp / REFERENCE).write_text(json.dumps(expected, indent=1) + "\n")
    index = {
        "metadata": {"total_size": total, "format": FORMAT},
        "weight_map": dict(sorted(weight_map.items())),
    }
    (tmp / INDEX).write_text(json.dumps(index, indent=1) + "\n")
    scores = None
    if request.scores is not None:
        from ..metrics.scorecard import read_scores

        scores = read_scores(request.scores)
    files = dict(sums)
    for name in (CONTRACT, REFERENCE, INDEX):
        files[name] = {"bytes": (tmp / name).stat().st_size, "sha256": file_sha256(tmp / name)}
    (tmp / CARD).write_text(model_card(contract, files, expected, request, scores))
    files[CARD] = {"bytes": (tmp / CARD).stat().st_size, "sha256": file_sha256(tmp / CARD)}
    record = {"kind": KIND, "complete": True, "format": FORMAT, "version": VERSION,
              "contract_sha256": contract_sha, "files": dict(sorted(files.items()))}  # fmt: skip
    (tmp / FOLDER_MARKER).write_text(json.dumps({MARKER: record}, indent=1) + "\n")
    check_output(request.out, KIND, overwrite=request.overwrite, protected=protected,
                 may_hold_outputs=(("run directory run.dir", cfg.run.dir),))  # fmt: skip
    replace_output(tmp, Path(request.out).expanduser().resolve())
