"""The plain twin of a one-rank jigsaw layer or model: every jigsaw layer swapped for its plain form.

``plain(module)`` copies the module, replaces each jigsaw layer in it (``layers.PLAIN``) by the
plain form built from that layer, and loads the jigsaw weights in: the models keep their own
classes, blocks, ``forward`` and ``predict`` (the structure is written once, in ``models/``),
the layers compute with torch's own ops. Any model made of jigsaw layers has a twin, yours too;
a layer with no plain form is named.
"""

from __future__ import annotations

import copy

from torch import nn

from ..layers.base import local_domain
from ..models import build_model
from .layers import PLAIN
from .load import canonical_parameters, load_jigsaw

__all__ = ["build_twin", "plain"]


def _swap(module: nn.Module) -> nn.Module:
    make = PLAIN.get(type(module))
    if make is not None:
        return make(module)
    for name, child in list(module.named_children()):
        setattr(module, name, _swap(child))
    return module


def _jigsaw(module: nn.Module) -> bool:
    return getattr(module, "jigsaw_layer", False)


def plain(module: nn.Module) -> nn.Module:
    """The plain-PyTorch twin of ``module`` (a jigsaw layer or model on one rank), holding its
    weights; ``module`` is left as it was."""
    canon = canonical_parameters(module)
    twin = _swap(copy.deepcopy(module))
    left = [f"{p or 'the module'} ({type(m).__name__})" for p, m in twin.named_modules() if _jigsaw(m)]
    if left:
        raise ValueError(
            f"no plain form for the jigsaw layer(s) {', '.join(left)}: add one to "
            "jigsaw_earth.twins.layers.PLAIN, or compare the model with its serial self"
        )
    return load_jigsaw(twin, canon)


def build_twin(
    name: str,
    grid: tuple[int, int],
    n_state: int,
    n_static: int,
    n_time: int,
    preset: str = "tiny",
    **overrides,
) -> nn.Module:
    """The plain twin of ``build_model(name, ...)`` on the global ``grid``."""
    return plain(build_model(name, local_domain(*grid), n_state, n_static, n_time, preset, **overrides))
