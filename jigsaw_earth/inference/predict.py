"""Sharded inference: roll a trained model forward and write a WB2-layout forecast store.

Every rank reads only its tile of the initial conditions, runs the model on its tile (weights
sharded as in training), and writes its tile of every forecast into one Zarr store
(``ForecastWriter``). Data-parallel replicas take disjoint initialisation times. With ``members``
the store has a member dimension ``number`` and every rank runs its members batched, each with its
own noise stream (``members.py``), its initial state perturbed with ``perturb`` (``perturb.py``,
made on the tiles by ``perturb_fields.py``). The forecast step is the trainer's (``models.run.model_step``:
autocast and tendency scaling as configured), and the weights come from a sharded checkpoint written
on any mesh. The batches run in ``rollout.py`` (outputs through ``write_pool.py``, its account in
``timing.py``), on weights gathered once when several ranks share the domain and they fit
(``layers/replicas.py``: fewer messages per step); the first batch's inputs are read while the
checkpoint loads.

Inference is read-only on the run (``load.py``): no run-directory claim, no ``config.yaml`` or
``history.jsonl`` write, no optimizer; the checkpoint is pinned while read. ``--out`` is checked
before any work (``ownership.check_output``): never the truth store, the checkpoints, or a
path that is not predict's own. The store is written as ``OUT.in-progress`` and renamed when complete
(a bucket's in place, committed last: ``bucket_output.py``);
SIGTERM, SIGUSR1 and Ctrl-C stop every rank before the next model step with every batch done recorded
there, and the same command resumes it (``progress.py``); on a complete ``--out`` of the same request it
does nothing (``rerun.py``). Rank 0 holds ``OUT.lock`` while writing,
refuses a store its filesystem cannot hold, and logs the model steps done (``campaign.py``).
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from ..checkpoint import load_checkpoint, pinned, read_meta
from ..config.schema import TrainConfig
from ..data.samples import TrainData
from ..data.times import evenly_spaced, hour_dayofyear, period_mask
from ..device import set_precision
from ..distributed.heartbeat import watched
from ..distributed.mesh import DomainMesh
from ..distributed.rank0 import on_rank0
from ..layers.replicas import replicated_weights
from ..mesh_setup import setup_mesh
from ..models.run import build_run_model, model_step
from ..sharing.folder import ModelFolder
from ..sharing.use import check_analysis, check_config, check_store, use_contract
from ..signals import rerun_hint
from .bucket_output import check_forecast_output, forecast_progress, output_path
from .campaign import check_room, lock_output
from .forecast_store import ForecastLayout, store_chunks
from .formats import TEMPLATES, check_format, open_writer
from .load import check_against_checkpoint, find_checkpoint, protected_paths
from .members import Members, check, noise_channels
from .perturb import Perturbation, check_history, check_perturbation, log_choice
from .prediction import Prediction
from .progress import BATCH, Progress, forecast_request
from .request import PredictRequest
from .rerun import finished, finished_request
from .rollout import Rollout, run_batches
from .score_files import check_score_files, scorecard, write_score_files
from .scoring import TileScorer
from .selection import Selection, select
from .throughput import Pipeline, auto_batch, replicas_fit, training_forward_rate
from .write_pool import ForecastOutput, WriterPool

if TYPE_CHECKING:
    from ..data.analysis import Analysis

__all__ = ["PredictRequest", "Prediction", "run_prediction", "select_inits"]

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
    return evenly_spaced(idx, max_inits)


def _layout(data: TrainData, init_times: np.ndarray, selection: Selection, members: int | None,
            first_member: int = 0) -> ForecastLayout:  # fmt: skip
    layout = ForecastLayout(
        init_times=np.asarray(init_times),
        leads=selection.leads,
        upper_air=selection.upper_air,
        levels=selection.levels,
        surface=selection.surface,
        latitude=np.asarray(data.source.lat),
        longitude=np.asarray(data.source.view.lon),
        members=members,
        first_member=first_member,
    )
    missing = sorted(set(layout.channels) - set(data.channels))
    if missing:
        raise ValueError(f"forecast channels {missing} are not among the data's {data.channels}")
    return layout


@torch.no_grad()
def run_prediction(cfg: TrainConfig, request: PredictRequest, mesh: DomainMesh | None = None) -> Prediction:
    """Forecast from every init ``request`` selects (``init``: from the initial states of that
    analysis, at ``init_times`` or all of its times, instead of data.store's inits in ``first_init`` …
    ``last_init``, default ``data.val_period``); write the selected variables, levels and leads to
    ``out`` and/or score them (``score``) as the rollout runs (collective). ``mesh``: run on this
    existing mesh (of ``cfg.mesh``'s shape; it stays up) instead of forming and ending one. ``members``:
    an ensemble of that many members (a ``number`` dimension; None: deterministic, no dimension), their
    noise drawn with ``seed`` (default ``run.seed``), numbered from ``first_member``, the initial states
    perturbed with ``perturb`` (any model; ``perturb.py``). ``scores``: the scores' files, written
    at the end (rank 0; ``score_files.py``), and a score-only run's in-progress folder
    (``PREFIX.in-progress``); a stop signal raises ``progress.Stopped`` after
    recording what is done. ``format``: ``zarr`` (one store), ``grib2`` or ``netcdf`` (a folder of files
    named by ``template``, ``formats.py``). ``model``: a shared model's folder (``model export``) instead
    of ``cfg.run.dir``'s checkpoint, its contract checked against the store and ``init`` before the model
    is built (``sharing/use.py``)."""
    r = request
    period = r.period(cfg.data.val_period)
    check_score_files(r, cfg)
    if r.perturb is not None:
        check_perturbation(r.perturb, r.members, r.first_member, cfg.data.step_hours, r.init is not None)
    if r.members is not None:
        check(cfg, r.members, cfg.mesh.ensemble, r.first_member, r.perturb is not None)
    elif cfg.mesh.ensemble > 1:
        raise ValueError(
            f"mesh.ensemble={cfg.mesh.ensemble} spreads ensemble members over groups of ranks; give "
            f"--members N (a multiple of {cfg.mesh.ensemble}) or set mesh.ensemble=1 for one forecast"
        )
    elif noise_channels(cfg):
        raise ValueError(
            f"model.noise_channels={noise_channels(cfg)}: a stochastic model's forecasts are ensemble "
            f"members; give --members N (--members 1 for one member, in a store with a 'number' dimension)"
        )
    selection = select(cfg, variables=r.variables, levels=r.levels, steps=r.steps, lead_hours=r.lead_hours,
                       lead_every=r.lead_every)  # fmt: skip
    out, score = r.out, r.score
    progress = forecast_progress(out, r.scores)
    recorded = finished_request(out)  # a complete output of predict's: the same request is a no-op
    shared = None if r.model is None else ModelFolder.open(r.model)
    ckpt = shared.path if shared is not None else find_checkpoint(cfg, progress.checkpoint(r.checkpoint))
    protected = protected_paths(cfg, ckpt, shared is not None)
    if r.init is not None:
        protected += (("--init source", r.init),)
    if score is not None:
        protected += (("--truth store", score.truth), ("--climatology", score.climatology))
    run_dir = () if shared is not None else (("run directory run.dir", cfg.run.dir),)
    if out is not None:
        check_forecast_output(out, r.format, overwrite=r.overwrite or recorded is not None,
                              protected=protected, may_hold_outputs=run_dir)  # fmt: skip
    progress.check(protected, run_dir)
    if shared is not None:  # the contract, before any model is built
        check_config(shared, cfg)
        check_store(shared, cfg.data.store)
    else:
        check_against_checkpoint(cfg, ckpt)
    analysis = None
    if r.init is not None:  # checked against the model's grid, variables and levels before any model is built
        from ..data.analysis import open_analysis

        analysis = open_analysis(r.init, cfg.data, r.init_times)
        if shared is not None:
            check_analysis(shared, analysis)
    own = mesh is None
    if mesh is not None and mesh.shape != cfg.mesh.shape:
        raise ValueError(f"mesh {mesh.shape} differs from the config's mesh {cfg.mesh.shape}")
    with progress.watching():
        mesh = setup_mesh(cfg) if mesh is None else mesh
        lock = None
        try:
            lock = None if out is None else on_rank0(mesh, lambda: lock_output(out))  # OUT.lock
            ens = None if r.members is None else Members.plan(cfg, mesh, r.members, r.seed, r.first_member,
                                                              r.perturb is not None)  # fmt: skip
            batch = progress.batch_size(r.batch_size)
            if batch is None and recorded is not None:  # the complete output's, as a resume's
                batch = recorded.get(BATCH)
            run = _Run(cfg, mesh, r, ckpt, protected, period, selection, batch, ens, progress, analysis,
                       shared, recorded)  # fmt: skip
            with _watched(cfg, mesh, progress) if own else nullcontext():
                result = _predict(run)
                if not result.complete:
                    result.scorecard = scorecard(result)
                    result.score_files = tuple(write_score_files(r, cfg, result) if mesh.rank == 0 else ())
                return result
        finally:
            if lock is not None:
                lock.release()
            if own and dist.is_initialized():
                dist.destroy_process_group()


@dataclass
class _Run:
    """What ``run_prediction`` resolved before the mesh's work: the request, the checkpoint (or
    ``shared`` model), the paths never written, the period of data.store's inits, the selection, the
    batch (None: chosen by memory), the ensemble plan, the progress, the ``init`` analysis, and the
    request a complete ``out`` recorded."""

    cfg: TrainConfig
    mesh: DomainMesh
    request: PredictRequest
    ckpt: Path
    protected: Any
    period: tuple[str, str]
    selection: Selection
    batch_size: int | None
    ens: Members | None
    progress: Progress
    analysis: Analysis | None
    shared: ModelFolder | None
    recorded: dict[str, Any] | None


def _watched(cfg: TrainConfig, mesh: DomainMesh, progress: Progress) -> Any:
    """The run under a ``PeerWatch``: a lost host ends every rank fast, the recorded batches kept."""
    kept = f"the batches recorded so far stay in {progress.folder}; " if progress.folder else ""
    hint = f"{kept}resume: {rerun_hint()}"
    release = progress.lock.release if progress.lock is not None else lambda: None  # any host resumes
    return watched(mesh.rank, mesh.shape.world_size, mesh.hosts, cfg.distributed.timeout_s, lambda v: hint,
                   release)  # fmt: skip


def _shared(mesh: DomainMesh, value: Any) -> Any:
    """Collective: rank 0's ``value`` on every rank."""
    box = [value]
    if mesh.is_distributed and dist.is_initialized():
        dist.broadcast_object_list(box, src=0)
    return box[0]


def _training_rate(model: torch.nn.Module, data: TrainData, batch: Any, bf16: bool,
                   tendency: torch.Tensor | None, ens: Members | None) -> float:  # fmt: skip
    """Model steps per second of the training forward on this mesh (the last batch's inputs, cycled
    to the training batch; a stochastic model with member 0's noise)."""
    take = torch.arange(data.local_batch) % batch.inputs.shape[0]
    x, tf = batch.inputs[take], batch.time_features[take].to(batch.inputs.device)
    noise = None
    if ens is not None:
        first = Members(ens.total, range(1), ens.seed, ens.channels)
        noise = first.noise(data, np.asarray(batch.times)[take.numpy()], 0, x.device)

    def forward() -> torch.Tensor:
        return model_step(model, x, batch.static, tf, bf16=bf16, tendency=tendency, noise=noise)

    return training_forward_rate(model, forward, data.local_batch * data.mesh.axis("data").size)


def _perturber(perturb: Perturbation | None, ens: Members | None, data: TrainData, model: torch.nn.Module,
               bf16: bool, tendency: torch.Tensor | None) -> Any:  # fmt: skip
    """The members' perturbations on this rank's tile, made with the forecast's model step."""
    if perturb is None or ens is None:
        return None
    from .perturb_fields import Perturber

    def step(
        x: torch.Tensor, static: torch.Tensor, tf: torch.Tensor, noise: torch.Tensor | None
    ) -> torch.Tensor:
        return model_step(model, x, static, tf, bf16=bf16, tendency=tendency, noise=noise)

    return Perturber(perturb, ens, data, step)


def _predict(run: _Run) -> Prediction:
    """The forecast on the mesh: inits, layout, model, then the batches (``rollout.py``)."""
    from ..data.sources import build_data

    cfg, mesh, r, ckpt, selection, ens, progress = (run.cfg, run.mesh, run.request, run.ckpt, run.selection,
                                                    run.ens, run.progress)  # fmt: skip
    out, score, perturb, fmt, shared, analysis = r.out, r.score, r.perturb, r.format, run.shared, run.analysis
    batch_size = run.batch_size
    data = build_data(cfg, mesh, training=False)
    if shared is not None:
        use_contract(shared, data)  # the model's own normalisation and static fields
    dev = mesh.device
    set_precision(cfg.training.precision)
    steps = selection.steps
    if analysis is None:
        inits = select_inits(data, *run.period, steps, r.every_hours, r.max_inits)
        init_times = np.asarray(data.times)[inits]
    else:
        init_times = inits = analysis.times
    if perturb is not None and ens is not None:  # the earlier analyses bred and lagged members need
        check_history(perturb, range(ens.first, ens.first + ens.total), data.times, inits)
        if mesh.rank == 0:
            log_choice(perturb)
    total = None if ens is None else ens.total
    layout = _layout(data, init_times, selection, total, 0 if ens is None else ens.first)
    check_format(fmt, r.template, layout)
    files = None if fmt == "zarr" else r.template or TEMPLATES[fmt]
    source = digest = None
    if analysis is not None:  # the analysis's content, read once (rank 0), is part of the request
        source = analysis.path
        from ..data.analysis import fingerprint

        digest = _shared(mesh, on_rank0(mesh, lambda: fingerprint(analysis.path)))

    def request_for(batch: int, step: int) -> dict[str, Any]:
        return forecast_request(cfg, ckpt, step, layout.init_times, selection, ens, mesh, batch, score,
                                source, digest, fmt, files, perturb)  # fmt: skip

    if run.recorded is not None and batch_size is not None and out is not None:
        step = shared.step if shared is not None else int(read_meta(ckpt)["step"])
        if finished(out, run.recorded, request_for(batch_size, step), r.overwrite):
            if mesh.rank == 0:
                log.info("--out %s already holds this forecast: nothing to do", out)
            return Prediction(output_path(out), None, layout.init_times, steps, data.grid.n_lon, float("nan"),
                              batch_size, float("nan"), total, complete=True)  # fmt: skip
    if out is not None:  # the size of what will be written, refused before any forecast if it cannot fit
        line = on_rank0(mesh, lambda: check_room(out, layout, fmt))
        if line:
            log.info("%s", line)
    scorer = None
    if score is not None:
        scorer = TileScorer(score, cfg, data, selection, layout.init_times, members=total)
    model = build_run_model(cfg, mesh, data)
    tendency = data.tendency_std.to(dev) if cfg.loss.tendency_scaling else None
    bf16 = cfg.training.precision == "bf16"
    chans = torch.tensor(selection.channel_index(data.channels), device=dev)
    lead_of = {s: i for i, s in enumerate(selection.lead_steps)}
    replicas, replica = mesh.axis("data").size, mesh.axis("data").index
    mine = np.arange(len(inits))[replica::replicas]
    per_init = 1 if ens is None else len(ens.mine)  # forward rows per init
    if batch_size is None:
        batch_size = max(1, auto_batch(model, data, max(1, len(mine)) * per_init, 2 if bf16 else 4, mesh)
                         // per_init)  # fmt: skip
    rollout = Rollout(model, data, inits, steps, lead_of, chans, bf16, tendency, ens, layout.init_times,
                      analysis, _perturber(perturb, ens, data, model, bf16, tendency))  # fmt: skip
    pipe, pool, writer, output = Pipeline(), None, None, None
    try:
        # the first batch's inputs are read while the checkpoint loads (a resume reads its own)
        first = (
            (mine[:batch_size], pipe.read(partial(rollout.read, mine[:batch_size]))) if len(mine) else None
        )
        if shared is not None:
            step = shared.load(model)
        else:
            with pinned(ckpt):
                step = int(load_checkpoint(ckpt, model, None, mesh)["step"])
        model.eval()
        record = request_for(batch_size, step)  # what the output records: a resume must ask for the same
        progress.open(mesh, record, len(inits), batch_size)  # collective: lock, compare, where to start
        if out is not None:
            # a file format converts its store at the end, field by field: one field a chunk there
            chunks = (
                store_chunks(layout, data.grid, batch_size, replicas, per_init) if fmt == "zarr" else None
            )
            writer = open_writer(fmt, out, layout, data.grid, mesh.rank, r.template,
                                 overwrite=r.overwrite, protected=run.protected, resume=not progress.fresh,
                                 chunks=chunks)  # fmt: skip
            pool = WriterPool()
            mine_members = None if ens is None else ens.mine
            output = ForecastOutput(writer.store, data.tile, dev, batch_size, mine_members, pool)
        progress.begin(scorer)  # the scores of batches an earlier run recorded
        batches = progress.remaining([mine[k : k + batch_size] for k in range(0, len(mine), batch_size)])
        gathered = replicas_fit(model, mesh)  # collective: weights gathered once, fewer messages
        with replicated_weights(model) if gathered else nullcontext():
            if gathered and mesh.rank == 0:
                log.info("the forecast runs on weights gathered once: %.1f MB per rank", gathered / 1e6)
            times, last = run_batches(rollout, batches, progress, pipe, output, pool, scorer,
                                      cfg.training.compile, first)  # fmt: skip
        times = times.reduce(mesh.world, dev)
        train_rate = float("nan") if last is None else _training_rate(model, data, last, bf16, tendency, ens)
        rows = scorer.finish() if scorer is not None else None
        path = writer.close(record, progress.check_stop) if writer is not None else None
        progress.finish()
    except BaseException as err:
        progress.abort(err)
        raise
    finally:
        pipe.close()
        if pool is not None:
            pool.close()
        if scorer is not None:
            scorer.close()
    # every replica ran its share in the same time; a member's forecast is one model sample
    rate = progress.inits_this_run() * (1 if ens is None else ens.total) * steps / max(times.loop_s, 1e-9)
    if mesh.rank == 0:
        log.info("forecast %d inits × %d steps from checkpoint %s (step %d), batch %d: %.2f steps/s; the "
                 "training forward on this mesh: %.2f steps/s%s", len(inits), steps, ckpt, step, batch_size,
                 rate, train_rate, f"; wrote {path}" if path else "")  # fmt: skip
        log.info("%s", times.line())
        limit = times.disk_limit()
        if limit:
            log.warning("%s", limit)
    return Prediction(path, rows, layout.init_times, steps, data.grid.n_lon, rate, batch_size, train_rate,
                      total, None if scorer is None else scorer.stats, times)  # fmt: skip
