"""Compare a jigsaw module with its twin: outputs, input gradients and parameter gradients."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .load import twin_sources

__all__ = ["twin_errors"]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max|a - b| / max|b|`` (``max|a - b|`` when ``b`` is all zeros)."""
    a, b = a.detach().double(), b.detach().double()
    scale = b.abs().max().item() if b.numel() else 0.0
    diff = (a - b).abs().max().item() if b.numel() else 0.0
    return diff / scale if scale > 0 else diff


def twin_errors(
    jigsaw: nn.Module, twin: nn.Module, inputs: Sequence[torch.Tensor], seed: int = 0, convert: bool = True
) -> dict[str, float]:
    """Relative errors (see ``_rel``) of the twin against the jigsaw module for one forward and one
    backward with a random cotangent: ``output``, ``grad:input{i}`` for floating inputs and
    ``grad:{parameter path}`` for every parameter (twin gradients mapped to the canonical layout
    through the twin's ``canonical_to_twin``, unless ``convert=False``: two modules of one layout)."""
    results = []
    for module in (jigsaw, twin):
        module.zero_grad(set_to_none=True)
        xs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
        y = module(*xs)
        results.append((xs, y))
    (xj, yj), (xt, yt) = results
    g = torch.randn(yj.shape, generator=torch.Generator().manual_seed(seed), dtype=yj.dtype)
    yj.backward(g)
    yt.backward(g.to(yt.dtype))
    errors = {"output": _rel(yt, yj)}
    for i, (a, b) in enumerate(zip(xt, xj)):
        if b.grad is not None:
            errors[f"grad:input{i}"] = _rel(a.grad, b.grad)
    jig_params = dict(jigsaw.named_parameters())
    sources = twin_sources(twin)
    for name, p in twin.named_parameters():
        key, to_twin = sources[name] if convert else (name, lambda t: t)
        if key not in jig_params:
            raise ValueError(
                f"twin parameter {name!r} has no jigsaw parameter {key!r}; load it with load_jigsaw"
            )
        errors[f"grad:{key}"] = _rel(p.grad, to_twin(jig_params[key].grad))
    return errors
