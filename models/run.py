"""The model of a config and one forecast step with it: shared by training and inference.

``build_run_model`` builds (and initialises) the configured model on this rank's domain, its
``forward`` checked against the model contract (``models/contract.py``: signature when built,
output shape and no parameter made in forward on the first call, which for a model of your own is
a forward on zeros before anything is written);
``model_step`` is one autoregressive step (bf16 autocast as configured; with
``loss.tendency_scaling`` the residual ``Δ = model(x) − x`` is scaled per channel by the
one-step tendency std, so an output of order 1 is a typical 6-h change). The trainer and
``predict`` both call these, so a forecast is the step the model was trained with.

A stochastic model (``model.noise_channels = K > 0``) is built with ``n_static + K`` static
channels; ``model_step(..., noise=...)`` appends the ``(B, K, h, w)`` noise of ``noise.member_noise``
to the static fields, which then reach the model per sample as ``(B, n_static + K, h, w)``.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from jigsaw_earth.data.samples import TrainData
from jigsaw_earth.data.times import N_TIME_FEATURES
from torch import nn

from jigsaw_earth.config.schema import TrainConfig
from jigsaw_earth.distributed.comm import arm_for_compile
from jigsaw_earth.distributed.mesh import DomainMesh
from jigsaw_earth.layers.base import Domain, init_model

__all__ = ["build_run_model", "compile_model", "model_step"]


def build_run_model(cfg: TrainConfig, mesh: DomainMesh, data: TrainData) -> nn.Module:
    """The configured model on this rank's tile of the data's grid, initialised (mesh-invariant);
    compiled in place with ``training.compile``."""
    from jigsaw_earth.models import (
        model_from_config,  # the model registry: built-ins, entry points, package.module:Class
    )
    from jigsaw_earth.models.contract import check_signature, guard, probe

    domain = Domain.create(mesh, data.grid.n_lat, data.grid.n_lon)
    n_static = data.n_static + cfg.model.noise_channels
    model = model_from_config(cfg.model, domain, len(data.channels), n_static, N_TIME_FEATURES)
    check_signature(model, cfg.model.name)  # the contract, one line per breach (models/contract.py)
    model = init_model(model.to(mesh.device), cfg.run.seed)
    if not type(model).__module__.startswith("jigsaw_earth."):  # your own model: its first forward now
        guard(model, len(data.channels), cfg.model.name)
        probe(
            model,
            len(data.channels),
            n_static,
            N_TIME_FEATURES,
            domain.tile.shape,
            mesh.device,
            cfg.model.name,
        )
    if cfg.training.compile:
        compile_model(model)
    return model


def compile_model(model: nn.Module, backend: str = "inductor") -> None:
    """``torch.compile`` the model in place (parameters, state dict and checkpoints stay the eager
    model's), every exchange a graph break (``distributed.comm.arm_for_compile``)."""
    arm_for_compile()
    model.compile(backend=backend)


def model_step(
    model: nn.Module,
    state: torch.Tensor,
    static: torch.Tensor,
    time_features: torch.Tensor,
    *,
    bf16: bool,
    tendency: torch.Tensor | None,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """One model step from ``state`` ``(B, C, h, w)``; output float32, same shape.

    ``noise`` ``(B, K, h, w)`` (a stochastic model's noise channels) is appended to ``static``
    ``(S, h, w)``, giving the model per-sample static fields ``(B, S + K, h, w)``.
    """
    if noise is not None:
        if noise.dim() != 4 or noise.shape[0] != state.shape[0] or noise.shape[2:] != static.shape[-2:]:
            raise ValueError(
                f"noise {tuple(noise.shape)} must be (B={state.shape[0]}, K, {static.shape[-2]}, "
                f"{static.shape[-1]}): one field per sample on this rank's tile"
            )
        if static.dim() == 3:
            static = static.unsqueeze(0).expand(state.shape[0], -1, -1, -1)
        static = torch.cat([static.to(noise.dtype), noise], dim=1)
    autocast = torch.autocast(state.device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    with autocast:
        out = model(state, static, time_features).float()
    if tendency is None:
        return out
    return state + (out - state) * tendency.view(1, -1, 1, 1)
