"""The training configuration: one YAML file, parsed into these documented dataclasses.

``jigsaw-earth config show`` prints every field with its type, default and documentation;
``jigsaw-earth config validate FILE [--world-size N]`` runs ``TrainConfig.check``.
"""

# ``doc(...)`` returns ``dataclasses.field(...)`` (with the documentation as metadata).
# ruff: noqa: RUF009

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..distributed.mesh import MeshShape
from .parse import doc

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
    "check_model_section",
]


@dataclass
class RunConfig:
    dir: str = doc("run directory: checkpoints, metrics.jsonl, config.yaml, wandb files", "runs/default")
    name: str = doc("run name shown in logs and wandb", "jigsaw-earth")
    seed: int = doc("seed of initialisation, data order and dropout (mesh-invariant)", 0)


@dataclass
class MeshConfig:
    data: int = doc("data-parallel replicas (the global batch is split over them)", 1)
    lat: int = doc("latitude tiles per domain group", 1)
    lon: int = doc("longitude tiles per domain group", 1)

    @property
    def shape(self) -> MeshShape:
        return MeshShape(self.data, self.lat, self.lon)


@dataclass
class DataConfig:
    store: str = doc("path or URL of the Zarr store (`jigsaw-earth data synth --out PATH` makes one)")
    train_period: list[str] = doc("[first, last] initialisation time of training samples", factory=list)
    val_period: list[str] = doc("[first, last] initialisation time of validation samples", factory=list)
    upper_air: list[str] = doc(
        "upper-air variables (WB2 names)", factory=lambda: ["geopotential", "temperature"]
    )
    levels: list[int] = doc("pressure levels (hPa) of the upper-air variables", factory=lambda: [500, 850])
    surface: list[str] = doc("surface variables (WB2 names)", factory=lambda: ["2m_temperature"])
    static: list[str] = doc(
        "static fields read from the store (geometry channels are always added)",
        factory=lambda: ["land_sea_mask", "geopotential_at_surface"],
    )
    step_hours: int = doc("model time step in hours (one forecast step)", 6)
    allow_gaps: bool = doc(
        "train on a store with missing times: samples whose window crosses a gap are skipped (and "
        "counted in the log); false refuses such a store and lists the first gap",
        False,
    )
    climatology: str | None = doc(
        "WB2-layout climatology store for the baseline; null = <store stem>-climatology.zarr", None
    )


@dataclass
class ModelConfig:
    name: str = doc("model architecture: weathermixer, unet or vit", "weathermixer")
    preset: str = doc("size preset: tiny, small, 1b, 3b", "tiny")
    overrides: dict[str, Any] = doc("keyword overrides passed to build_model", factory=dict)


@dataclass
class OptimConfig:
    lr: float = doc("peak learning rate (AdamW)", 1e-3)
    min_lr: float = doc("learning rate at the end of the cosine decay", 1e-5)
    warmup_steps: int = doc("linear warmup steps from 0 to lr", 10)
    weight_decay: float = doc("AdamW decoupled weight decay (matrices only, not biases/norms)", 0.01)
    betas: list[float] = doc("AdamW (beta1, beta2)", factory=lambda: [0.9, 0.95])
    eps: float = doc("AdamW epsilon", 1e-8)
    grad_clip: float = doc("clip the global gradient norm (over all shards) to this; 0 = off", 1.0)


@dataclass
class LossConfig:
    variable_weights: dict[str, float] = doc(
        "per-variable weight by WB2 name (or channel name such as geopotential@500); default 1", factory=dict
    )
    level_weights: dict[int, float] = doc("per-pressure-level weight (hPa → weight); default 1", factory=dict)
    tendency_scaling: bool = doc(
        "scale the model's residual per channel by the store's one-step difference std and weight the "
        "loss by its inverse square, so every channel's 6-h tendency counts equally (GraphCast-style)",
        True,
    )


@dataclass
class TrainingConfig:
    steps: int = doc("optimizer steps to train", 100)
    batch_size: int = doc("GLOBAL batch size: split over mesh.data replicas", 4)
    rollout_steps: int = doc("autoregressive steps per sample in the loss (1 = one-step training)", 1)
    precision: Literal["fp32", "bf16"] = doc("bf16 autocast of the forward pass (weights stay fp32)", "fp32")
    activation_checkpointing: bool = doc("recompute each rollout step in backward to save memory", False)
    nan_policy: Literal["stop", "skip"] = doc(
        "on a non-finite loss: stop with an error, or skip the step", "stop"
    )
    max_skipped_steps: int = doc("with nan_policy=skip: stop after this many skipped steps", 10)


@dataclass
class ValidationConfig:
    every: int = doc("validate every N steps (0 = only at the end)", 0)
    lead_hours: list[int] = doc(
        "forecast leads to score (multiples of data.step_hours)", factory=lambda: [24]
    )
    variables: list[str] = doc(
        "headline channels to score (variable@level or surface name)",
        factory=lambda: ["geopotential@500", "temperature@850", "2m_temperature"],
    )
    max_samples: int = doc("initialisation times scored (evenly spaced over val_period); 0 = all", 16)
    batch_size: int = doc("validation samples per replica and forward", 2)


@dataclass
class CheckpointConfig:
    every: int = doc("save a sharded checkpoint every N steps (0 = only the final one)", 50)
    keep: int = doc("periodic checkpoints kept (the newest; older ones are deleted)", 2)
    resume: str = doc("'auto' resumes from the newest checkpoint in run.dir, 'never', or a path", "auto")


@dataclass
class WandbConfig:
    mode: Literal["offline", "online", "disabled"] = doc(
        "offline writes to run.dir/wandb and never needs the network; `wandb sync` uploads later",
        "offline",
    )
    project: str = doc("wandb project", "jigsaw-earth")
    entity: str | None = doc("wandb entity (team or user); null = your default", None)


@dataclass
class LoggingConfig:
    every: int = doc("log one line per N steps on rank 0 (and to metrics.jsonl)", 1)
    progress: bool = doc("tqdm progress bar on rank 0 (off automatically when not a terminal)", True)
    wandb: WandbConfig = doc("Weights & Biases logging", factory=WandbConfig)


@dataclass
class DistributedConfig:
    backend: Literal["auto", "gloo", "nccl"] = doc(
        "process-group backend; auto = nccl on GPU, else gloo", "auto"
    )
    timeout_s: float = doc(
        "collective timeout: a peer that never arrives raises after this many seconds", 300.0
    )


@dataclass
class TrainConfig:
    data: DataConfig = doc("where samples come from")
    run: RunConfig = doc("run directory, name and seed", factory=RunConfig)
    mesh: MeshConfig = doc("data × lat × lon process mesh", factory=MeshConfig)
    model: ModelConfig = doc("architecture", factory=ModelConfig)
    optim: OptimConfig = doc("optimizer and schedule", factory=OptimConfig)
    loss: LossConfig = doc("latitude-weighted MSE weights", factory=LossConfig)
    training: TrainingConfig = doc("steps, batch, rollout, precision, NaN policy", factory=TrainingConfig)
    validation: ValidationConfig = doc("periodic validation in physical units", factory=ValidationConfig)
    checkpoint: CheckpointConfig = doc("sharded checkpoints and resume", factory=CheckpointConfig)
    logging: LoggingConfig = doc("console, JSON lines and wandb", factory=LoggingConfig)
    distributed: DistributedConfig = doc("process group settings", factory=DistributedConfig)

    def check(self, world_size: int | None = None) -> None:
        """Cross-field checks; ``world_size`` (when known) must equal the mesh's product."""
        m, t, v, o = self.mesh, self.training, self.validation, self.optim
        for axis in ("data", "lat", "lon"):
            _positive(f"mesh.{axis}", getattr(m, axis))
        shape = m.shape
        if world_size is not None and shape.world_size != world_size:
            raise ValueError(
                f"config mesh: data={m.data} × lat={m.lat} × lon={m.lon} = {shape.world_size} ranks, "
                f"but the job has {world_size}; set mesh.* so the product is {world_size} "
                f"or launch {shape.world_size} processes"
            )
        _positive("training.steps", t.steps)
        _positive("training.batch_size", t.batch_size)
        _positive("training.rollout_steps", t.rollout_steps)
        if t.batch_size % m.data:
            raise ValueError(
                f"config training.batch_size={t.batch_size} is the global batch and must split evenly over "
                f"mesh.data={m.data} replicas; use a multiple of {m.data}"
            )
        _positive("validation.batch_size", v.batch_size)
        _positive("data.step_hours", self.data.step_hours)
        for lead in v.lead_hours:
            if lead <= 0 or lead % self.data.step_hours:
                raise ValueError(
                    f"config validation.lead_hours contains {lead}; leads must be positive multiples of "
                    f"data.step_hours={self.data.step_hours}"
                )
        for key, period in (
            ("data.train_period", self.data.train_period),
            ("data.val_period", self.data.val_period),
        ):
            _check_period(key, period)
        if o.lr <= 0 or o.min_lr < 0 or o.min_lr > o.lr:
            raise ValueError(f"config optim: need 0 <= min_lr ({o.min_lr}) <= lr ({o.lr}) and lr > 0")
        if o.warmup_steps < 0 or (o.warmup_steps >= t.steps and t.steps > 1):
            raise ValueError(
                f"config optim.warmup_steps={o.warmup_steps} must be in [0, training.steps={t.steps})"
            )
        if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
            raise ValueError(f"config optim.betas={o.betas}: give two numbers in [0, 1), e.g. [0.9, 0.95]")
        if o.grad_clip < 0:
            raise ValueError(f"config optim.grad_clip={o.grad_clip} must be >= 0 (0 turns clipping off)")
        channels = {f"{u}@{lev}" for u in self.data.upper_air for lev in self.data.levels} | set(
            self.data.surface
        )
        for name in v.variables:
            if name not in channels:
                raise ValueError(
                    f"config validation.variables: {name!r} is not a trained channel; "
                    f"choose from {sorted(channels)}"
                )
        known = channels | set(self.data.upper_air)
        for name in self.loss.variable_weights:
            if name not in known:
                raise ValueError(
                    f"config loss.variable_weights: {name!r} is not a variable; choose from {sorted(known)}"
                )
        for lev in self.loss.level_weights:
            if lev not in self.data.levels:
                raise ValueError(
                    f"config loss.level_weights: level {lev} is not in data.levels={self.data.levels}"
                )
        if self.checkpoint.every < 0 or self.checkpoint.keep < 1:
            raise ValueError(
                f"config checkpoint: every={self.checkpoint.every} must be >= 0 "
                f"and keep={self.checkpoint.keep} >= 1"
            )
        _positive("logging.every", self.logging.every)
        _positive("distributed.timeout_s", self.distributed.timeout_s)
        check_model_section(self.model)


def _check_period(key: str, period: list[str]) -> None:
    """``[first, last]`` (or empty); both parse as dates and ``first <= last``."""
    example = "e.g. ['2000-01-01', '2000-12-31T18']"
    if len(period) not in (0, 2):
        raise ValueError(f"config {key}={period}: give [first, last] times, {example}")
    times = []
    for i, text in enumerate(period):
        try:
            times.append(np.datetime64(text, "h"))
        except ValueError:
            raise ValueError(
                f"config {key}[{i}]={text!r} is not a date; write YYYY-MM-DD or YYYY-MM-DDTHH, {example}"
            ) from None
    if times and times[0] > times[1]:
        raise ValueError(f"config {key}={period}: the first time is after the last; swap them")


def check_model_section(model: ModelConfig) -> None:
    """Name, preset and overrides checked against the model's own config dataclass (``models.presets``)."""
    import dataclasses
    import typing

    from pydantic import TypeAdapter, ValidationError

    from ..models.presets import _CONFIGS, PRESETS, make_config

    if model.name not in _CONFIGS:
        raise ValueError(
            f"config model.name={model.name!r} is not a model{_close(model.name, list(_CONFIGS))}; "
            f"choose one of {', '.join(_CONFIGS)}"
        )
    presets = list(PRESETS[model.name])
    if model.preset not in presets:
        raise ValueError(
            f"config model.preset={model.preset!r} is not a {model.name} preset"
            f"{_close(model.preset, presets)}; choose one of {', '.join(presets)}"
        )
    try:
        made = make_config(model.name, model.preset, **model.overrides)
    except (ValueError, TypeError) as err:
        raise ValueError(f"config model.overrides: {err}") from None
    hints = typing.get_type_hints(type(made))
    for key, value in dataclasses.asdict(made).items():
        try:  # pydantic checks each value against the type in the model's config dataclass
            TypeAdapter(hints[key]).validate_python(value, strict=True)
        except ValidationError as err:
            expected = str(hints[key]).replace("typing.", "").replace("<class '", "").replace("'>", "")
            raise ValueError(
                f"config model.overrides.{key}={value!r}: {err.errors()[0]['msg'].lower()}; "
                f"{type(made).__name__}.{key} is {expected}"
            ) from None


def _close(name: str, options: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, options, n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _positive(key: str, value: float) -> None:
    if value <= 0:
        raise ValueError(f"config {key}={value} must be positive; give a value > 0")
