"""Every value a model computes, in the order it is computed: module outputs and the torch calls of
your own code, for ``validate --model`` to say where a sharded run first departs from the serial
one, and whether the serial run reproduces itself.

``traced(model)`` records, in completion order:

* each submodule's first output (forward hooks), keyed by its path;
* each call into torch made **from the model's own source** — a ``torch.mean`` or ``torch.roll``
  written inline in ``predict``, ``x - m``, ``F.interpolate`` — through a ``TorchFunctionMode``,
  keyed by its call site (file, line) and how many times that site ran. Calls made inside torch or
  inside jigsaw-earth (the layers' own exchanges and kernels) are not recorded: they differ between
  a one-rank and a sharded layer by design, and the layer's output is compared instead.

Both runs of one model execute the same source, so their records pair up by key. ``explain``
says why the first diverging item fails.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

__all__ = ["Item", "Trace", "explain", "traced"]

_TORCH = os.path.dirname(torch.__file__) + os.sep
_STDLIB = os.path.dirname(os.__file__) + os.sep
_HERE = os.path.abspath(__file__)


def _library_dirs() -> tuple[str, ...]:
    import jigsaw_earth
    import jigsaw_earth.data
    import jigsaw_earth.models

    dirs = [*jigsaw_earth.__path__, *jigsaw_earth.models.__path__, *jigsaw_earth.data.__path__]
    return tuple(os.path.abspath(d) + os.sep for d in dirs)


@dataclass
class Item:
    """One recorded value: ``key`` pairs it across runs; ``label`` and ``inside`` name it."""

    key: tuple
    label: str
    inside: str  # the innermost module running when it was computed ("" at the top)
    kind: str  # "module" or "op"
    value: torch.Tensor
    cls: type | None = None  # a module's class
    op: str = ""  # an op's function name (e.g. "mean")


@dataclass
class Trace:
    items: list[Item] = field(default_factory=list)

    def by_key(self) -> dict[tuple, Item]:
        return {i.key: i for i in self.items}


def _op_name(func: Any) -> tuple[str, str]:
    """(display name, bare name) of a torch function: ``torch.roll``, ``Tensor.mean``, ``F.gelu``."""
    qual = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
    bare = qual.rsplit(".", 1)[-1]
    if qual.startswith("_VariableFunctionsClass."):
        return f"torch.{bare}", bare
    if qual.startswith(("TensorBase.", "Tensor.")):
        return f"Tensor.{bare}", bare
    module = getattr(func, "__module__", None) or "torch"
    module = {"torch.nn.functional": "F", "torch._C._nn": "F", "torch.functional": "torch"}.get(
        module, module
    )
    return f"{module}.{bare}", bare


class _UserOps(TorchFunctionMode):
    def __init__(self, trace: Trace, stack: list[str], library: tuple[str, ...]):
        super().__init__()
        self.trace, self.stack, self.library = trace, stack, library
        self.count: Counter = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        frame = sys._getframe(1)
        while frame is not None:
            name = frame.f_code.co_filename
            if not (name.startswith((_TORCH, _STDLIB)) or os.path.abspath(name) == _HERE):
                break
            frame = frame.f_back
        if frame is None or os.path.abspath(frame.f_code.co_filename).startswith(self.library):
            return out
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return out
        site = (frame.f_code.co_filename, frame.f_lineno)
        self.count[site] += 1
        shown, bare = _op_name(func)
        code = frame.f_code
        where = f"{os.path.relpath(site[0])}:{site[1]} in {getattr(code, 'co_qualname', code.co_name)}"
        key = ("op", *site, self.count[site])
        inside = self.stack[-1] if self.stack else ""
        self.trace.items.append(Item(key, f"{shown} at {where}", inside, "op", out.detach().clone(), op=bare))
        return out


@contextmanager
def traced(model: nn.Module) -> Iterator[Trace]:
    """Record ``model``'s module outputs and its own torch calls while the block runs."""
    trace, stack, handles = Trace(), [], []
    seen: set[str] = set()
    for path, module in model.named_modules():
        if not path:
            continue

        def pre(_m: nn.Module, _inp: tuple, path: str = path) -> None:
            stack.append(path)

        def post(m: nn.Module, _inp: tuple, out: object, path: str = path) -> None:
            if stack and stack[-1] == path:
                stack.pop()
            if path in seen or not isinstance(out, torch.Tensor):
                return
            seen.add(path)
            inside = stack[-1] if stack else ""
            trace.items.append(Item(("module", path), path, inside, "module", out.detach().clone(), type(m)))

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))
    try:
        with _UserOps(trace, stack, _library_dirs()):
            yield trace
    finally:
        for h in handles:
            h.remove()


_REDUCTIONS = {"mean", "sum", "std", "var", "std_mean", "var_mean", "amax", "amin", "max", "min", "norm",
               "logsumexp", "softmax", "log_softmax", "cumsum", "cumprod", "median", "quantile", "nanmean",
               "nansum", "prod", "argmax", "argmin", "topk", "sort"}  # fmt: skip
_NEIGHBOURS = {"roll", "flip", "conv1d", "conv2d", "conv_transpose2d", "pad", "interpolate", "avg_pool2d",
               "max_pool2d", "unfold", "fold", "diff", "gradient", "pixel_shuffle", "pixel_unshuffle",
               "upsample", "grid_sample", "rot90"}  # fmt: skip
_TORCH_TILE_MODULES = {
    "Conv1d": "Conv2d", "Conv2d": "Conv2d", "ConvTranspose2d": "ConvTranspose2d", "Upsample": "Upsample",
    "AvgPool2d": "Downsample", "MaxPool2d": "Downsample", "LayerNorm": "LayerNorm",
    "GroupNorm": "GroupNorm", "InstanceNorm2d": "InstanceNorm", "BatchNorm2d": "GroupNorm",
    "MultiheadAttention": "GlobalAttention", "Dropout": "Dropout",
}  # fmt: skip


def explain(item: Item) -> str:
    """Why ``item``, the first value to diverge from the serial run, computes the wrong thing."""
    if item.kind == "op":
        if item.op in _REDUCTIONS:
            why = (
                "it reduces over this rank's tile only; a statistic over the field needs the whole domain "
                "(a jigsaw norm layer, or layers.gather_field for a small field)"
            )
        elif item.op in _NEIGHBOURS:
            why = (
                "it reads neighbours across the tile's edge, which this rank does not hold (its tile wraps "
                "or pads alone); use the jigsaw layer that exchanges halos (Conv2d, Upsample, Downsample, "
                "…) or gather the field first"
            )
        else:
            why = "it computes on this rank's tile alone; use a jigsaw layer or gather the field first"
        return why
    cls = item.cls
    name = cls.__name__ if cls else "?"
    if cls is not None and cls.__module__.startswith("torch.nn") and name in _TORCH_TILE_MODULES:
        return (
            f"{cls.__module__}.{name} sees only this rank's tile; use jigsaw_earth.layers."
            f"{_TORCH_TILE_MODULES[name]}, which computes over the whole domain"
        )
    if cls is not None and (getattr(cls, "jigsaw_layer", False) or cls.__module__.startswith("jigsaw_earth")):
        return (
            "a jigsaw layer that diverges though its input agreed where it could be compared: was it "
            "built on another domain than the one its input lives on (a layer after PatchEmbed needs "
            "PatchEmbed.out_domain)?"
        )
    return (
        "it computes on its tile alone (a plain torch op over the field, called through another "
        "library?): use the jigsaw layer or gather the field first"
    )
