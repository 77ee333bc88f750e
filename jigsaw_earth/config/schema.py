"""The training configuration: one YAML file, parsed into these documented pydantic sections.

Single-field rules (types, limits such as ``gt=0``, finite numbers, dates) live on the fields and
are checked on parsing; ``TrainConfig.check`` adds the rules that span fields.
``jigsaw-earth config show`` prints every field with its type, default and documentation;
``jigsaw-earth config validate FILE [--world-size N]`` parses and checks a file.
"""

from __future__ import annotations

import datetime
from typing import Annotated, Literal

import numpy as np
from pydantic import AfterValidator, BeforeValidator, Field

from ..data.batch import DEFAULT_LEVELS, DEFAULT_STATIC, TRAIN_SURFACE, TRAIN_UPPER_AIR
from ..distributed.mesh import MeshShape
from .base import Section, doc, is_time
from .model_section import DEFAULT_MODEL, MODEL_SECTIONS, ModelConfig

__all__ = [
    "CheckpointConfig",
    "DataConfig",
    "DistributedConfig",
    "LoggingConfig",
    "LossConfig",
    "MeshConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "TrainConfig",
    "TrainingConfig",
    "ValidationConfig",
    "WandbConfig",
]

_EXAMPLE = "e.g. ['2000-01-01', '2000-12-31T18']"


def _unquoted_date(value: object) -> object:
    """An unquoted YAML date (``2020-01-01``) reads as a date: keep it as ISO text."""
    return value.isoformat() if isinstance(value, datetime.date) else value


def _a_time(text: str) -> str:
    if not is_time(text):
        raise ValueError(f"not a date; write YYYY-MM-DD or YYYY-MM-DDTHH, {_EXAMPLE}")
    return text


def _first_last(period: list[str]) -> list[str]:
    if len(period) not in (0, 2):
        raise ValueError(f"give [first, last] times, {_EXAMPLE}")
    if period and np.datetime64(period[0], "h") > np.datetime64(period[1], "h"):
        raise ValueError("the first time is after the last; swap them")
    return period


def _two_betas(betas: list[float]) -> list[float]:
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise ValueError("give two numbers in [0, 1), e.g. [0.9, 0.95]")
    return betas


Time = Annotated[
    str, BeforeValidator(_unquoted_date), AfterValidator(_a_time), Field(examples=["2020-01-31T18"])
]
Period = Annotated[list[Time], AfterValidator(_first_last)]
Betas = Annotated[list[float], AfterValidator(_two_betas)]
PositiveInt = Annotated[int, Field(gt=0)]


class RunConfig(Section):
    dir: str = doc("run directory: checkpoints, metrics.jsonl, config.yaml, wandb files", "runs/default")
    name: str = doc("run name shown in logs and wandb", "jigsaw-earth")
    seed: int = doc("seed of initialisation, data order and dropout (mesh-invariant)", 0)


class MeshConfig(Section):
    data: int = doc("data-parallel replicas (the global batch is split over them)", 1, gt=0)
    ensemble: int = doc(
        "groups the ensemble members are spread over (training.members split evenly over them; each "
        "group is a lat × lon domain holding the same weights; docs/ensembles.md)",
        1,
        gt=0,
    )
    lat: int = doc("latitude tiles per domain group", 1, gt=0)
    lon: int = doc("longitude tiles per domain group", 1, gt=0)

    @property
    def shape(self) -> MeshShape:
        return MeshShape(self.data, self.lat, self.lon, self.ensemble)


class DataConfig(Section):
    store: str = doc("path or URL of the Zarr store (`jigsaw-earth data synth --out PATH` makes one)")
    train_period: Period = doc("[first, last] initialisation time of training samples", factory=list)
    val_period: Period = doc("[first, last] initialisation time of validation samples", factory=list)
    upper_air: list[str] = doc("upper-air variables (WB2 names)", factory=lambda: list(TRAIN_UPPER_AIR))
    levels: list[int] = doc(
        "pressure levels (hPa) of the upper-air variables", factory=lambda: list(DEFAULT_LEVELS)
    )
    surface: list[str] = doc("surface variables (WB2 names)", factory=lambda: list(TRAIN_SURFACE))
    static: list[str] = doc(
        "static fields read from the store (geometry channels are always added)",
        factory=lambda: list(DEFAULT_STATIC),
    )
    step_hours: int = doc("model time step in hours (one forecast step)", 6, gt=0)
    allow_gaps: bool = doc(
        "train on a store with missing times: samples whose window crosses a gap are skipped (and "
        "counted in the log); false refuses such a store and lists the first gap",
        False,
    )
    climatology: str | None = doc(
        "WB2-layout climatology store for the baseline; null = <store stem>-climatology.zarr", None
    )
    prefetch: int = doc(
        "training batches read ahead on background threads while the step computes (0 = read in the "
        "step); host memory per rank: (prefetch + 1) x the batch's bytes, logged at the start",
        2,
        ge=0,
    )
    read_threads: PositiveInt | Literal["auto"] = doc(
        "threads reading one batch's fields in parallel (file reads, decompression and copies release "
        "the GIL); auto = the cores this rank has: the CPUs the process may run on (its affinity) "
        "shared by the ranks of its host (LOCAL_WORLD_SIZE, or Slurm's tasks per node); a number is "
        "capped at that too. From a bucket (s3://, gs://) the threads mostly wait on the link: auto = 16 "
        "requests in flight per rank (docs/data.md, Object storage), a number as given",
        "auto",
    )


class OptimConfig(Section):
    lr: float = doc("peak learning rate (AdamW)", 1e-3, gt=0)
    min_lr: float = doc("learning rate at the end of the cosine decay (<= lr)", 1e-5, ge=0)
    warmup_steps: int = doc("linear warmup steps from 0 to lr", 10, ge=0)
    weight_decay: float = doc("AdamW decoupled weight decay (matrices only, not biases/norms)", 0.01)
    betas: Betas = doc("AdamW (beta1, beta2)", factory=lambda: [0.9, 0.95])
    eps: float = doc("AdamW epsilon", 1e-8)
    grad_clip: float = doc("clip the global gradient norm (over all shards) to this; 0 = off", 1.0, ge=0)
    implementation: Literal["auto", "loop", "fused"] = doc(
        "AdamW's kernels: loop (one parameter at a time), fused (one kernel for every parameter); auto = "
        "fused on GPU, loop on CPU; both give the same update within float32 rounding",
        "auto",
    )


class LossConfig(Section):
    kind: Literal["mse", "crps", "fair_crps", "almost_fair_crps"] = doc(
        "mse (of each member, averaged over training.members), or an ensemble CRPS per grid point "
        "over the members: crps (of the empirical distribution), fair_crps (unbiased, Zamo & Naveau "
        "2018), almost_fair_crps (anemoi's, Lang et al. 2024, with loss.alpha); same weights as mse "
        "(docs/ensembles.md); with loss.tendency_scaling the CRPS kinds compare fields in units of the "
        "tendency std, so each channel's tendency counts equally as for mse",
        "mse",
    )
    alpha: float = doc("almost_fair_crps's α in [0, 1]: 1 = fair CRPS, 0 = plain CRPS", 0.95, ge=0, le=1)
    mse_weight: float = doc("CRPS kinds: add this multiple of the members' mean squared error", 0.0, ge=0)
    variable_weights: dict[str, float] = doc(
        "per-variable weight by WB2 name (or channel name such as geopotential@500); default 1", factory=dict
    )
    level_weights: dict[int, float] = doc("per-pressure-level weight (hPa → weight); default 1", factory=dict)
    tendency_scaling: bool = doc(
        "scale the model's residual per channel by the store's one-step difference std and weight the "
        "loss by its inverse square, so every channel's 6-h tendency counts equally (GraphCast-style)",
        True,
    )


class TrainingConfig(Section):
    steps: int = doc("optimizer steps to train", 100, gt=0)
    batch_size: int = doc("GLOBAL batch size: split over mesh.data replicas", 4, gt=0)
    rollout_steps: int = doc("autoregressive steps per sample in the loss (1 = one-step training)", 1, gt=0)
    members: int = doc(
        "ensemble members per sample: split evenly over the mesh.ensemble groups, the rest batched "
        "within a group (members = mesh.ensemble x batched); members differ by their noise "
        "(model.noise_channels); 1 = one forecast per sample",
        1,
        gt=0,
    )
    precision: Literal["fp32", "tf32", "bf16"] = doc(
        "fp32; tf32 (fp32 with TF32 matrix products on GPU, the Jigsaw paper's; fp32 on CPU); bf16 "
        "(autocast of the forward pass; weights, optimizer and loss stay fp32)",
        "fp32",
    )
    activation_checkpointing: bool | Literal["auto"] = doc(
        "recompute each rollout step in backward to save memory (about a third more compute); auto = only "
        "when plan's estimate of a step exceeds 90 % of the device's free memory",
        False,
    )
    compile: bool = doc(
        "torch.compile the model (inductor): norms, activations, dropout masks and casts fuse around the "
        "matrix products; the first steps compile (minutes for large models); on a mesh each exchange is "
        "one graph break (docs/layers.md)",
        False,
    )
    nan_policy: Literal["stop", "skip"] = doc(
        "on a non-finite loss: stop with an error, or skip the step", "stop"
    )
    max_skipped_steps: int = doc("with nan_policy=skip: stop after this many skipped steps", 10, ge=0)
    init_from: str | None = doc(
        "fine-tune: start from another run's weights, a checkpoint (RUN_DIR/checkpoints/step_N), a run "
        "directory (its newest checkpoint) or a shared model's folder (model export), with a fresh "
        "optimizer, step and schedule; data, mesh, loss and schedule may differ; channels are matched by "
        "name (added ones start at zero weight, removed ones are dropped); another model or grid is refused "
        "(docs/training.md, Fine-tuning). Read at the run's first start only: a resume continues from the "
        "run's own checkpoints; null = from run.seed",
        None,
    )
    freeze: list[str] = doc(
        "module patterns (fnmatch on module paths, e.g. 'blocks' or 'blocks.*') whose parameters are not "
        "trained: no gradient, no optimizer state, not in the gradient norm, clipping or gradient sums",
        factory=list,
    )


class ValidationConfig(Section):
    every: int = doc("validate every N steps (0 = only at the end)", 0, ge=0)
    lead_hours: list[PositiveInt] = doc(
        "forecast leads to score (multiples of data.step_hours)", factory=lambda: [24]
    )
    variables: list[str] = doc(
        "headline channels to score (variable@level or surface name)",
        factory=lambda: ["geopotential@500", "temperature@850", "2m_temperature"],
    )
    max_samples: int = doc("initialisation times scored (evenly spaced over val_period); 0 = all", 16, ge=0)
    batch_size: int = doc("validation samples per replica and forward", 2, gt=0)


class CheckpointConfig(Section):
    every: int = doc("save a sharded checkpoint every N steps (0 = only the final one)", 50, ge=0)
    keep: int = doc("periodic checkpoints kept (the newest; older ones are deleted)", 2, ge=1)
    resume: str = doc("'auto' resumes from the newest checkpoint in run.dir, 'never', or a path", "auto")
    background: bool = doc(
        "write the periodic checkpoints from a background thread while training goes on: a save stalls "
        "training only for the copy of this rank's blocks into host memory (which it keeps: host memory "
        "the size of the rank's part of a checkpoint); the final and the stop-signal checkpoints are "
        "complete before the run ends. false: every save writes before training goes on",
        True,
    )


class WandbConfig(Section):
    mode: Literal["offline", "online", "disabled"] = doc(
        "offline writes to run.dir/wandb and never needs the network; `wandb sync` uploads later",
        "offline",
    )
    project: str = doc("wandb project", "jigsaw-earth")
    entity: str | None = doc("wandb entity (team or user); null = your default", None)


class LoggingConfig(Section):
    every: int = doc("log one line per N steps on rank 0 (and to metrics.jsonl)", 1, gt=0)
    progress: bool = doc("tqdm progress bar on rank 0 (off automatically when not a terminal)", True)
    wandb: WandbConfig = doc("Weights & Biases logging", factory=WandbConfig)
    peak_tflops: float | None = doc(
        "peak dense TFLOP/s of one rank for the utilisation in the step line (default: the known "
        "devices table for A100/H100/H200/V100, none on CPU)",
        None,
        gt=0,
    )
    compile_report: bool = doc(
        "with training.compile: per step, what torch.compile compiled (graphs, graph breaks with their "
        "reason and place, recompiles with the guard that failed), logged on rank 0 when a step compiled "
        "anything, and compile-report-rankR.json in run.dir (docs/training.md)",
        False,
    )
    profile_step: int = doc(
        "profile this optimizer step with torch.profiler (CPU and CUDA activities) on every rank: "
        "profile-step-N-rankR.txt in run.dir (the costliest kernels, the matrix products' share of "
        "device time) and a Chrome trace beside it; 0 = off",
        0,
        ge=0,
    )


class DistributedConfig(Section):
    device: str = doc(
        "compute device of each rank: auto = its GPU (LOCAL_RANK) when torch sees one, else the CPU; "
        "cpu; cuda (or cuda:N)",
        "auto",
    )
    backend: Literal["auto", "gloo", "nccl"] = doc(
        "process-group backend; auto = nccl on GPU, else gloo", "auto"
    )
    timeout_s: float = doc(
        "seconds until a lost peer ends the job: a rank silent this long (its host crashed or cut off) "
        "stops every other rank, which exit 75 naming it (distributed/heartbeat.py, docs/multinode.md); "
        "also how long the process group waits for a peer at the start and in a collective",
        120.0,
        gt=0,
    )
    overlap: Literal["on", "off"] = doc(
        "transfers in flight while the rank computes (on), or waited for at once (off: the same "
        "messages and numbers; faster only on a CPU host loaded beyond its cores, docs/scaling.md)",
        "on",
    )
    transport: Literal["auto", "host", "backend"] = doc(
        "how messages travel between ranks (distributed/transport.py): auto = shared-memory rings "
        "between CPU ranks of one host (no socket, no transport thread; docs/scaling.md), NCCL between "
        "GPUs with one rank each, and, when a host's ranks outnumber its GPUs, ranks sharing them with "
        "every message staged through pinned host memory (NCCL refuses two ranks on one GPU); host = "
        "stage GPU messages through host memory even with a GPU per rank; backend = the process "
        "group's own (no rings)",
        "auto",
    )


class TrainConfig(Section):
    """jigsaw-earth training config; every field with its default: jigsaw-earth config show."""

    data: DataConfig = doc("where samples come from")
    run: RunConfig = doc("run directory, name and seed", factory=RunConfig)
    mesh: MeshConfig = doc("data × ensemble × lat × lon process mesh", factory=MeshConfig)
    model: ModelConfig = doc(
        "architecture: model.name picks the model; preset and overrides are that model's",
        factory=MODEL_SECTIONS[DEFAULT_MODEL],
    )
    optim: OptimConfig = doc("optimizer and schedule", factory=OptimConfig)
    loss: LossConfig = doc("loss kind (MSE or ensemble CRPS) and its weights", factory=LossConfig)
    training: TrainingConfig = doc("steps, batch, rollout, precision, NaN policy", factory=TrainingConfig)
    validation: ValidationConfig = doc("periodic validation in physical units", factory=ValidationConfig)
    checkpoint: CheckpointConfig = doc("sharded checkpoints and resume", factory=CheckpointConfig)
    logging: LoggingConfig = doc("console, JSON lines and wandb", factory=LoggingConfig)
    distributed: DistributedConfig = doc("process group settings", factory=DistributedConfig)

    def check(self, world_size: int | None = None) -> None:
        """Cross-field checks; ``world_size`` (when known) must equal the mesh's product."""
        m, t, v, o, d = self.mesh, self.training, self.validation, self.optim, self.data
        shape = m.shape
        if world_size is not None and shape.world_size != world_size:
            raise ValueError(
                f"config mesh: {shape.describe()} = {shape.world_size} ranks, "
                f"but the job has {world_size}; set mesh.* so the product is {world_size} "
                f"or launch {shape.world_size} processes"
            )
        if t.members % m.ensemble:
            raise ValueError(
                f"config training.members={t.members} must split evenly over mesh.ensemble={m.ensemble} "
                f"groups; use a multiple of {m.ensemble}"
            )
        if t.members > 1 and not self.model.noise_channels:
            raise ValueError(
                f"config training.members={t.members} with model.noise_channels=0 gives identical "
                f"members; set model.noise_channels (e.g. 4) to make the model stochastic"
            )
        if t.batch_size % m.data:
            raise ValueError(
                f"config training.batch_size={t.batch_size} is the global batch and must split evenly over "
                f"mesh.data={m.data} replicas; use a multiple of {m.data}"
            )
        for lead in v.lead_hours:
            if lead % d.step_hours:
                raise ValueError(
                    f"config validation.lead_hours contains {lead}; leads must be positive multiples of "
                    f"data.step_hours={d.step_hours}"
                )
        resume = self.checkpoint.resume
        if t.init_from is not None and resume not in ("auto", "never"):
            raise ValueError(
                f"config training.init_from={t.init_from!r} and checkpoint.resume={resume!r} both "
                "name weights to start from; init_from starts a new run from another run's weights, resume "
                "continues a run: keep one (checkpoint.resume=auto resumes this run once it has checkpoints)"
            )
        if self.logging.compile_report and not t.compile:
            raise ValueError(
                "config logging.compile_report=true reports what torch.compile compiles, but "
                "training.compile=false; set training.compile=true, or drop logging.compile_report"
            )
        if o.min_lr > o.lr:
            raise ValueError(f"config optim: need min_lr ({o.min_lr}) <= lr ({o.lr}); lower min_lr")
        if o.warmup_steps >= t.steps and t.steps > 1:
            raise ValueError(
                f"config optim.warmup_steps={o.warmup_steps} must be in [0, training.steps={t.steps})"
            )
        channels = {f"{u}@{lev}" for u in d.upper_air for lev in d.levels} | set(d.surface)
        for name in v.variables:
            if name not in channels:
                raise ValueError(
                    f"config validation.variables: {name!r} is not a trained channel; "
                    f"choose from {sorted(channels)}"
                )
        known = channels | set(d.upper_air)
        for name in self.loss.variable_weights:
            if name not in known:
                raise ValueError(
                    f"config loss.variable_weights: {name!r} is not a variable; choose from {sorted(known)}"
                )
        for lev in self.loss.level_weights:
            if lev not in d.levels:
                raise ValueError(f"config loss.level_weights: level {lev} is not in data.levels={d.levels}")
