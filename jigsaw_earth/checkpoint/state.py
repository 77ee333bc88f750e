"""What a checkpoint holds: parameter and optimizer blocks, scalar optimizer state, RNG state.

Tensors are named ``model/<parameter path>`` and ``optim/<parameter path>/<state key>``. An
optimizer state tensor shaped like its parameter (AdamW's ``exp_avg``, ``exp_avg_sq``) shares
the parameter's ``ShardSpec``; a 0-d state tensor (``step``) is a JSON number. Everything else
that is not a tensor goes to JSON, so nothing needs pickling.
"""

from __future__ import annotations

import base64
import random
from typing import Any

import torch
from torch import nn

from ..layers.base import ShardSpec, spec_of
from .planner import Block

__all__ = [
    "capture_rng",
    "model_blocks",
    "optimizer_blocks",
    "optimizer_json",
    "prepare_optimizer",
    "restore_optimizer_json",
    "restore_rng",
    "spec_or_replicated",
]


def spec_or_replicated(t: torch.Tensor) -> tuple[ShardSpec, bool]:
    """The tensor's ``ShardSpec`` and whether it is the whole tensor (then domain rank 0 saves it).

    A tensor without a spec (a plain ``nn.Parameter``) is whole, as is one made with
    ``sharded_parameter(shape, None)``: every domain rank holds the same copy.
    """
    spec = spec_of(t)
    return spec, tuple(t.shape) == tuple(spec.global_shape) and not any(spec.offsets)


def _block(t: torch.Tensor, spec: ShardSpec) -> Block:
    return Block(t, tuple(spec.global_shape), tuple(spec.offsets))


def model_blocks(model: nn.Module) -> dict[str, tuple[Block, bool]]:
    """``{"model/<path>": (block, replicated)}`` for every parameter and sharded buffer.

    Buffers without a ``ShardSpec`` are derived data (rebuilt with the model) and not saved.
    """
    out: dict[str, tuple[Block, bool]] = {}
    for name, p in model.named_parameters():
        spec, rep = spec_or_replicated(p)
        out[f"model/{name}"] = (_block(p.data, spec), rep)
    for name, b in model.named_buffers():
        if getattr(b, "_jigsaw_spec", None) is not None:
            out[f"model/{name}"] = (_block(b, b._jigsaw_spec), False)  # type: ignore[attr-defined]
    return out


def _param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[int, str]:
    names = {id(p): n for n, p in model.named_parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in names:
                raise ValueError(
                    f"the optimizer holds a parameter of shape {tuple(p.shape)} that is not in the model; "
                    "build the optimizer from model.parameters()"
                )
    return names


def optimizer_blocks(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, tuple[Block, bool]]:
    """``{"optim/<path>/<key>": (block, replicated)}`` for state tensors shaped like their parameter."""
    names = _param_names(model, optimizer)
    out: dict[str, tuple[Block, bool]] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            spec, rep = spec_or_replicated(p)
            for key, value in optimizer.state.get(p, {}).items():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    if value.shape != p.shape:
                        raise ValueError(
                            f"optimizer state {key!r} of {names[id(p)]} has shape {tuple(value.shape)}, "
                            f"not the parameter's {tuple(p.shape)}; only parameter-shaped or scalar "
                            "optimizer state can be checkpointed"
                        )
                    out[f"optim/{names[id(p)]}/{key}"] = (_block(value, spec), rep)
    return out


def optimizer_json(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Hyper-parameters per group and scalar state per parameter, as JSON-ready values."""
    names = _param_names(model, optimizer)
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    scalars: dict[str, dict[str, Any]] = {}
    tensors: dict[str, list[str]] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                name = names[id(p)]
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    tensors.setdefault(name, []).append(key)
                elif isinstance(value, torch.Tensor):
                    scalars.setdefault(name, {})[key] = [
                        value.item(),
                        str(value.dtype).removeprefix("torch."),
                    ]
                elif isinstance(value, (int, float, bool)):
                    scalars.setdefault(name, {})[key] = [value, None]
                else:
                    raise ValueError(f"optimizer state {key!r} of {name} is a {type(value).__name__}")
    return {"type": type(optimizer).__name__, "param_groups": groups, "scalars": scalars, "tensors": tensors}


def prepare_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """Create the optimizer state the checkpoint has (zeros, to be overwritten by the load)."""
    names = _param_names(model, optimizer)
    for group in optimizer.param_groups:
        for p in group["params"]:
            name = names[id(p)]
            state = optimizer.state[p]
            for key in saved["tensors"].get(name, []):
                state[key] = torch.zeros_like(p, memory_format=torch.preserve_format)
            for key, (value, dtype) in saved["scalars"].get(name, {}).items():
                state[key] = value if dtype is None else torch.tensor(value, dtype=getattr(torch, dtype))


def restore_optimizer_json(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    if saved["type"] != type(optimizer).__name__:
        raise ValueError(
            f"checkpoint optimizer is {saved['type']}, this run uses {type(optimizer).__name__}; "
            "use the same optimizer or load with optimizer=None (weights only)"
        )
    if len(saved["param_groups"]) != len(optimizer.param_groups):
        raise ValueError(
            f"checkpoint has {len(saved['param_groups'])} optimizer parameter groups, this run has "
            f"{len(optimizer.param_groups)}; build the optimizer the same way or load with optimizer=None"
        )
    for group, hyper in zip(optimizer.param_groups, saved["param_groups"], strict=True):
        for key, value in hyper.items():
            old = group.get(key)
            group[key] = tuple(value) if isinstance(old, tuple) and isinstance(value, list) else value


# --------------------------------------------------------------------------------- RNG state
def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def capture_rng() -> dict[str, Any]:
    """This process's torch (CPU and CUDA) and Python RNG states as JSON-ready values."""
    state: dict[str, Any] = {"torch": _b64(torch.get_rng_state())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    version, internal, gauss = random.getstate()
    state["python"] = [version, list(internal), gauss]
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(_unb64(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]])
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
