"""Copy canonical jigsaw parameters into a plain twin, mapping by module path.

A twin has the jigsaw module paths and parameter names. Where a layout differs, the twin module
converts in ``canonical_to_twin(name, tensor)``; where it keeps a parameter under another name
(token mixing holds ``nn.Linear`` layers ``fc1``/``fc2`` for jigsaw's ``w1, b1, w2, b2``), the
module lists ``canonical_names = {twin name: jigsaw name}``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from ..layers.base import spec_of

__all__ = ["canonical_parameters", "load_jigsaw", "twin_sources"]

Convert = Callable[[torch.Tensor], torch.Tensor]


def canonical_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """The canonical global parameters of a one-rank jigsaw model, by module path."""
    params = {}
    for name, p in model.named_parameters():
        spec = getattr(p, "_jigsaw_spec", None)
        if spec is not None and tuple(spec_of(p).global_shape) != tuple(p.shape):
            raise ValueError(
                f"parameter {name!r} is a {tuple(p.shape)} shard of {spec.global_shape}: build the jigsaw "
                f"model on one rank (local_domain) or pass the gathered canonical tensors"
            )
        params[name] = p
    return params


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def twin_sources(twin: nn.Module) -> dict[str, tuple[str, Convert]]:
    """``{twin parameter path: (jigsaw parameter path, canonical → twin layout)}``."""
    sources: dict[str, tuple[str, Convert]] = {}
    for path, module in twin.named_modules():
        to_twin = getattr(module, "canonical_to_twin", None)
        names = getattr(module, "canonical_names", None)
        pairs = names.items() if names else ((n, n) for n, _ in module.named_parameters(recurse=False))
        for mine, theirs in pairs:
            convert = (lambda t, f=to_twin, n=theirs: f(n, t)) if to_twin is not None else (lambda t: t)
            sources.setdefault(_join(path, mine), (_join(path, theirs), convert))  # outer modules first
    return sources


@torch.no_grad()
def load_jigsaw(twin: nn.Module, source: nn.Module | Mapping[str, torch.Tensor]) -> nn.Module:
    """Copy ``source`` (a one-rank jigsaw module or its canonical tensors) into ``twin``; returns it."""
    canon = dict(canonical_parameters(source) if isinstance(source, nn.Module) else source)
    sources = twin_sources(twin)
    used = set()
    for name, p in twin.named_parameters():
        key, convert = sources[name]
        if key not in canon:
            raise ValueError(f"twin parameter {name!r} has no counterpart {key!r} in the jigsaw model")
        src = canon[key].detach()
        value = convert(src)
        if tuple(value.shape) != tuple(p.shape):
            raise ValueError(
                f"twin parameter {name!r}: jigsaw tensor {key!r} {tuple(src.shape)} maps to "
                f"{tuple(value.shape)}, the twin holds {tuple(p.shape)}; build the twin from the same config"
            )
        p.copy_(value)
        used.add(key)
    extra = sorted(set(canon) - used)
    if extra:
        raise ValueError(f"jigsaw parameters with no place in the twin: {', '.join(extra)}")
    return twin
