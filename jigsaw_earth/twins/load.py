"""Copy canonical jigsaw parameters into a plain twin, mapping by module path.

The twins use the jigsaw module paths and parameter names; where the layouts differ a twin
module converts in ``canonical_to_twin(name, tensor)``. A bias that the jigsaw model does not
have (a layer built with ``bias=False``) is removed from the twin, so both compute the same.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ..layers.base import spec_of

__all__ = ["canonical_parameters", "load_jigsaw"]


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


@torch.no_grad()
def load_jigsaw(twin: nn.Module, source: nn.Module | Mapping[str, torch.Tensor]) -> nn.Module:
    """Copy ``source`` (a one-rank jigsaw module or its canonical tensors) into ``twin``; returns it."""
    canon = dict(canonical_parameters(source) if isinstance(source, nn.Module) else source)
    used = set()
    for path, module in twin.named_modules():
        convert = getattr(module, "canonical_to_twin", None)
        for name, p in list(module.named_parameters(recurse=False)):
            key = f"{path}.{name}" if path else name
            if key not in canon:
                if name.startswith("bias"):
                    setattr(module, name, None)
                    continue
                raise ValueError(f"twin parameter {key!r} has no counterpart in the jigsaw model")
            src = canon[key].detach()
            value = convert(name, src) if convert is not None else src
            if tuple(value.shape) != tuple(p.shape):
                raise ValueError(
                    f"twin parameter {key!r}: jigsaw tensor {tuple(src.shape)} maps to {tuple(value.shape)}, "
                    f"the twin holds {tuple(p.shape)}; build the twin from the same config and grid"
                )
            p.copy_(value)
            used.add(key)
    extra = sorted(set(canon) - used)
    if extra:
        raise ValueError(f"jigsaw parameters with no place in the twin: {', '.join(extra)}")
    return twin
