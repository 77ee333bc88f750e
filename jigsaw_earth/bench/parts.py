"""Where a model's step goes: the forward and backward time of each of its layers
(``jigsaw-earth bench models --parts``).

A part is an outermost jigsaw layer of the model (``embed``, ``blocks.*.token_mixing``,
``down.*.conv``, …), named with its block indices as ``*`` and summed over the blocks; ``other``
is the rest of the step (input assembly, residual adds, the activations between layers). The
jigsaw model and its twin have the same module paths, so both are timed part by part on one
rank; on a mesh, a rank's parts include the waits at their exchanges. Module hooks (forward and
``register_full_backward_*``; CUDA synchronised at each) time every part of every step after a
warm-up; each figure is the median over the steps.
"""

from __future__ import annotations

import re
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence

import torch
from torch import nn

from ..twins import PLAIN
from .measure import Step

__all__ = ["layer_paths", "part_rows", "part_times"]

PHASES = ("forward", "backward")


def layer_paths(model: nn.Module) -> list[str]:
    """Paths of the outermost jigsaw layers of ``model``, in registration order."""
    paths: list[str] = []
    for path, module in model.named_modules():
        layer = getattr(module, "jigsaw_layer", False) or type(module) in PLAIN
        if layer and path and not any(path.startswith(p + ".") for p in paths):
            paths.append(path)
    return paths


def _part(path: str) -> str:
    return re.sub(r"\.\d+(?=\.|$)", ".*", path)


def part_times(
    module: nn.Module,
    inputs: Sequence[torch.Tensor],
    paths: Sequence[str],
    steps: int,
    autocast: torch.dtype | None = None,
    device: str = "cpu",
) -> dict[str, dict[str, float]]:
    """``{phase: {part: ms}}`` of one forward + backward of ``module`` (see the module docstring),
    with ``total`` and ``other`` per phase."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    spent: dict[str, dict[str, float]] = {p: defaultdict(float) for p in PHASES}
    started: dict[tuple[str, str], float] = {}

    def begin(phase: str, path: str):
        def hook(*_):
            sync()
            started[phase, path] = time.perf_counter()

        return hook

    def end(phase: str, path: str):
        def hook(*_):
            sync()
            spent[phase][_part(path) or "total"] += time.perf_counter() - started[phase, path]

        return hook

    handles = []
    for path in ("", *paths):
        m = module.get_submodule(path)
        handles += [
            m.register_forward_pre_hook(begin("forward", path)),
            m.register_forward_hook(end("forward", path)),
        ]
        if path:
            handles.append(m.register_full_backward_pre_hook(begin("backward", path)))
            handles.append(m.register_full_backward_hook(end("backward", path)))
    step = Step(module, inputs, autocast)
    per_step: dict[str, dict[str, list[float]]] = {p: defaultdict(list) for p in PHASES}
    try:
        for i in range(steps + 1):  # the first is a warm-up
            for phase in PHASES:
                spent[phase].clear()
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            spent["backward"]["total"] = time.perf_counter() - t0 - spent["forward"]["total"]
            for phase in PHASES if i else ():
                parts = sum(v for k, v in spent[phase].items() if k != "total")
                spent[phase]["other"] = spent[phase]["total"] - parts
                for part, seconds in spent[phase].items():
                    per_step[phase][part].append(seconds * 1e3)
    finally:
        for h in handles:
            h.remove()
    return {phase: {k: statistics.median(v) for k, v in parts.items()} for phase, parts in per_step.items()}


def part_rows(parts: dict[str, dict]) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """Header and rows of a parts table: ``parts`` is ``{column: {phase: {part: ms}}}``
    (``jigsaw``, ``twin``, a mesh's rank 0); forward and backward ms per column."""
    columns = list(parts)
    names = list(
        dict.fromkeys(k for c in columns for k in parts[c]["forward"] if k not in ("other", "total"))
    )
    header = ("part", *(f"{c} {p} ms" for c in columns for p in ("fwd", "bwd")))
    rows = [
        (name, *(f"{parts[c][p].get(name, 0.0):.2f}" for c in columns for p in PHASES))
        for name in [*names, "other", "total"]
    ]
    return header, rows
