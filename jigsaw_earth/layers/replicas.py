"""Weights gathered once for a forecast, so that each step's forward sends fewer messages.

A forecast runs the same weights at every step, without gradients. Inside ``replicated_weights(model)``
each replicating layer holds what its own tokens need of the weights, gathered once (an all-gather
per layer on entry, collective, in module order):

* the channel MLP (``MLP``): the whole ``W1``, ``b1``, ``W2``, ``b2``; its forward is then the
  one-rank product on this rank's tokens, no message (the sharded one exchanges tokens or weights);
* the token mixing (``TokenMixing``): the columns of ``W1`` that multiply this rank's tokens, for
  every hidden row, and the whole ``b1`` (no more memory than its own shard on two ranks); the first
  product is then this rank's partial sum over its tokens, the partial sums are added over the ranks
  in one exchange (in rank order, so every rank holds the same hidden activations), and the second
  product uses the rank's own ``W2`` block: one exchange per block instead of two;
* the norms (``LayerNorm``, ``GroupNorm``): their whole affine weight and bias, no gather per forward;
* the patch embedding and recovery (``PatchEmbed``, ``PatchRecovery``): their whole weight and bias;
  each then convolves (multiplies) its own window with it, so only the window's halo, if any, moves.

The gathered weights apply only while gradients are off (``Replicating.replica``): a forward with
autograd inside the context runs the sharded path, so training is untouched. Outputs equal the
sharded forward's to rounding (the order of a few sums differs; ``tests/test_replicas.py`` compares
both with the serial model on uneven meshes). ``replica_bytes`` is what the gathered weights cost
a rank; ``predict`` gathers them when that fits (``inference/predict.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

__all__ = ["Replicating", "replica_bytes", "replicated_weights"]


class Replicating:
    """A layer that can run on weights gathered once (``replicated_weights``): it implements
    ``gather_replica`` (collective over its domain axis) and ``replica_numel`` (their elements)."""

    _replica: tuple[torch.Tensor, ...] | None = None

    def gather_replica(self) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def replica_numel(self) -> int:
        raise NotImplementedError

    def replica(self) -> tuple[torch.Tensor, ...] | None:
        """The gathered weights when they apply: inside ``replicated_weights``, gradients off."""
        return None if self._replica is None or torch.is_grad_enabled() else self._replica


def _replicating(model: nn.Module) -> list[Replicating]:
    return [m for m in model.modules() if isinstance(m, Replicating) and m.domain.size > 1]  # type: ignore[attr-defined]


def replica_bytes(model: nn.Module) -> int:
    """Bytes the gathered weights take on this rank (float32), over every replicating layer."""
    return 4 * sum(m.replica_numel() for m in _replicating(model))


@contextmanager
def replicated_weights(model: nn.Module) -> Iterator[int]:
    """Gather every replicating layer's weights (collective; every rank enters with the same
    model); yields how many layers hold them, and drops them on exit."""
    layers = _replicating(model)
    with torch.no_grad():
        for m in layers:
            m._replica = m.gather_replica()
    try:
        yield len(layers)
    finally:
        for m in layers:
            m._replica = None
