"""The model contract, checked where a model is built and on its first forward, one line per breach.

Every model — a built-in or your own (docs/models.md, "The contract") — is called as
``forward(state (B, n_state, h, w), static (n_static, h, w) or (B, n_static, h, w), time (B,
n_time))`` and returns the next state ``(B, n_state, h, w)`` on this rank's tile, with every
parameter made in its constructor. ``check_signature`` refuses a ``forward`` that cannot take
those three arguments before anything runs; ``guard`` watches the first forward and refuses an
output of another shape or a parameter created during the call (the optimizer, the checkpoints
and the other ranks would never see it: it would never be trained). The guard removes itself
after the first call, so it costs nothing afterwards. ``probe`` runs that first call at once, on
zeros of one sample (eval mode, no gradient), so a breach is refused before a run writes anything.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

__all__ = ["CONTRACT", "check_signature", "guard", "probe"]

CONTRACT = (
    "forward(state (B, n_state, h, w), static (n_static, h, w), time (B, n_time)) -> (B, n_state, h, w) "
    "on this rank's tile, every parameter made in __init__ (docs/models.md, 'The contract')"
)


def _name(model: nn.Module, name: str | None) -> str:
    return name or type(model).__name__


def check_signature(model: nn.Module, name: str | None = None) -> None:
    """Refuse a model whose ``forward`` cannot be called as ``forward(state, static, time)``."""
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return  # a builtin or C forward: nothing to check here
    try:
        sig.bind(None, None, None)
    except TypeError as err:
        raise ValueError(
            f"model {_name(model, name)}: {type(model).__name__}.forward{sig} cannot be called as "
            f"forward(state, static, time) ({err}); the contract is {CONTRACT}"
        ) from None


def guard(model: nn.Module, n_state: int, name: str | None = None) -> nn.Module:
    """Check ``model``'s first forward: the output's shape and no parameter made during it."""
    before = {id(p) for p in model.parameters()}
    handles: list[Any] = []

    def after(module: nn.Module, args: tuple, out: Any) -> None:
        for h in handles:
            h.remove()
        new = [n for n, p in module.named_parameters() if id(p) not in before]
        if new:
            raise ValueError(
                f"model {_name(module, name)}: parameter {new[0]!r} was created in forward, not in "
                f"__init__, so the optimizer, the checkpoints and the other ranks never see it (it would "
                f"never be trained); create it in __init__ ({len(new)} such parameter(s))"
            )
        state = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if state is None:
            return
        if not isinstance(out, torch.Tensor):
            raise ValueError(
                f"model {_name(module, name)}: forward returned a {type(out).__name__}, not a tensor; the "
                f"contract is {CONTRACT}"
            )
        want = (state.shape[0], n_state, *state.shape[-2:])
        if tuple(out.shape) != want:
            raise ValueError(
                f"model {_name(module, name)}: forward returned shape {tuple(out.shape)} for a state of "
                f"shape {tuple(state.shape)}; it must return the next state {want} (B, n_state={n_state}, "
                f"h, w) on this rank's tile"
            )

    handles.append(model.register_forward_hook(after))
    return model


def probe(
    model: nn.Module,
    n_state: int,
    n_static: int,
    n_time: int,
    tile: tuple[int, int],
    device: torch.device,
    name: str | None = None,
) -> None:
    """One forward of ``model`` on zeros of one sample of this rank's ``tile`` (collective: every
    rank of the mesh calls it), in eval mode without gradients: the first-forward checks of
    ``guard``, and any error of the forward itself as one line."""
    h, w = tile
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(
                torch.zeros(1, n_state, h, w, device=device),
                torch.zeros(n_static, h, w, device=device),
                torch.zeros(1, n_time, device=device),
            )
    except (RuntimeError, TypeError, IndexError, AttributeError) as err:
        first = (str(err).strip().splitlines() or [""])[0]
        raise ValueError(
            f"model {_name(model, name)}: forward fails on one sample of this rank's {h}x{w} tile "
            f"({n_state} state, {n_static} static, {n_time} time channels): {type(err).__name__}: {first}; "
            f"the contract is {CONTRACT}"
        ) from None
    finally:
        model.train(was_training)
