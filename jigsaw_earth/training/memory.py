"""Whether a training step needs activation checkpointing (``training.activation_checkpointing:
auto``): ``plan``'s estimate of this rank's step memory against what its device has free.

The estimate is the one ``jigsaw-earth plan`` prints (each layer's declared saved activations and
the backward's peak of gradients and activations, ``models.plan.backward_peak``), with AdamW's two
moments; the parameters are already on the device, so they are in its used memory.
"""

from __future__ import annotations

import logging

from torch import nn

from ..device import free_bytes
from ..distributed.mesh import DomainMesh, local_ranks
from ..layers.cost import model_cost
from ..models.plan import backward_peak

__all__ = ["MEMORY_FRACTION", "needs_checkpointing"]

log = logging.getLogger(__name__)

MEMORY_FRACTION = 0.9  # of the free memory a step may plan to take without recomputation


def needs_checkpointing(
    model: nn.Module, rows: int, elsize: int, rollout_steps: int, mesh: DomainMesh
) -> bool:
    """True when ``rows`` samples per rank (``elsize``-byte activations, ``rollout_steps`` steps
    kept for backward) would need more than ``MEMORY_FRACTION`` of the device's free memory."""
    costs = model_cost(model, rows, elsize, input_grad=False)
    grads, activations = backward_peak(model, costs)
    moments = 2 * sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    need = moments + grads + rollout_steps * activations
    free = free_bytes(mesh.device, local_ranks())
    on = need > MEMORY_FRACTION * free
    log.info(
        "activation checkpointing %s: a step needs about %.1f GiB (activations %.1f GiB) of the %.1f GiB "
        "free on %s",
        "on" if on else "off", need / 2**30, rollout_steps * activations / 2**30, free / 2**30, mesh.device,
    )  # fmt: skip
    return on
