"""Constructing models without allocating them: every parameter on the ``meta`` device.

Shapes and shard specs are real, storage and initialisation are not, so a 3-billion-parameter
model on a 721 × 1440 grid is built in a fraction of a second (``model summary``, ``plan``).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch
from jigsaw_earth.models import MODELS, model_class
from torch.overrides import TorchFunctionMode

__all__ = ["meta_construction"]

_FACTORIES = {torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn, torch.empty_like}


class _MetaFactories(TorchFunctionMode):
    """Tensor factories without an explicit device allocate on ``meta``; ``torch.tensor`` (used
    for small host-side scalars during initialisation) stays on the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = dict(kwargs or {})
        if func in _FACTORIES and kwargs.get("device") is None:
            kwargs["device"] = "meta"
        return func(*args, **kwargs)


def _skip_fill(p: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    """Initialisation of a ``meta`` parameter: nothing to fill."""


@contextlib.contextmanager
def meta_construction() -> Iterator[None]:
    """Construct modules with every parameter on the ``meta`` device (no storage, no init cost).

    The layers' counter-based fills are skipped while inside (the values of a meta tensor do not
    exist; computing them on meta would only cost time), and restored on exit.
    """
    for name in MODELS:
        model_class(name)  # import every model's layers before patching them (yours import them too)
    saved = []
    for mod_name, mod in list(sys.modules.items()):
        if mod_name.startswith("jigsaw_earth.layers") and mod is not None:
            for fn in ("fill_uniform_", "fill_normal_"):
                if hasattr(mod, fn):
                    saved.append((mod, fn, getattr(mod, fn)))
                    setattr(mod, fn, _skip_fill)
    try:
        with _MetaFactories():
            yield
    finally:
        for mod, fn, orig in saved:
            setattr(mod, fn, orig)
