"""Frozen weights in the distributed products (``training.freeze``): no weight gradient, no traffic for it.

On 4 ranks with uneven shards, every autograd function of the distributed core that holds a weight
(``matmul_channels``, ``matmul_tokens`` and ``matmul_pair`` under both strategies, ``conv_ring``)
runs once with every operand requiring a gradient and once with the weights frozen (and once
with only the last bias trainable): the output is the same bit for bit and the input gradient
within float32 rounding (a frozen weight's backward multiplies contiguous copies of what the full
one slices from a message), a frozen weight gets no gradient, a trainable bias the same one, and
the backward sends fewer bytes (the weight gradients' reduce rings and the rows they need are left
out).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from jigsaw_earth.distributed.comm import ledger
from jigsaw_earth.distributed.conv_ring import conv_ring
from jigsaw_earth.distributed.matmul import matmul_channels, matmul_tokens
from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.distributed.pair import matmul_pair
from jigsaw_earth.distributed.spawn import spawn

COUNTS, OUTS, HIDS = (3, 5, 2, 4), (2, 3, 1, 2), (3, 1, 2, 2)
CIN = 5


def _gelu_grad(dh: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    with torch.enable_grad():
        zz = z.detach().requires_grad_()
        return torch.autograd.grad(F.gelu(zz), zz, dh)[0]


def _run(op: Callable, inputs: list[torch.Tensor], train: list[bool]) -> dict:
    """Forward and backward of ``op`` with ``inputs[i]`` requiring a gradient where ``train[i]``."""
    leaves = [t.detach().clone().requires_grad_(g) for t, g in zip(inputs, train, strict=True)]
    y = op(*leaves)
    dy = torch.linspace(-1, 1, y.numel()).view_as(y)
    ledger.reset()
    y.backward(dy)
    return {"y": y.detach(), "grads": [t.grad for t in leaves], "sent": ledger.bytes_sent}


def _cases(mesh: DomainMesh) -> dict:
    axis, q = mesh.domain, mesh.domain.index
    g = torch.Generator().manual_seed(10 + q)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    cases = {
        f"channels.{s}": (
            lambda x, w, b, s=s: matmul_channels(x, w, b, axis, OUTS, COUNTS, s),
            [rand(COUNTS[q], CIN), rand(CIN, OUTS[q]), rand(OUTS[q])],
        )
        for s in ("weights", "activations")
    }
    for s in ("weights", "activations"):  # a row block of A (M_q × N) times the token rows
        cases[f"tokens.{s}"] = (
            lambda x, a, b, s=s: matmul_tokens(x, a, b, axis, COUNTS, OUTS, s),
            [rand(COUNTS[q], CIN), rand(OUTS[q], sum(COUNTS)), rand(OUTS[q])],
        )
        cases[f"pair.{s}"] = (
            lambda x, w1, b1, w2, b2, s=s: matmul_pair(
                x, w1, b1, w2, b2, axis, HIDS, OUTS, COUNTS, F.gelu, _gelu_grad, s
            ),
            [rand(COUNTS[q], CIN), rand(CIN, HIDS[q]), rand(HIDS[q]), rand(HIDS[q], 8), rand(OUTS[q])],
        )
    cases["conv_ring"] = (
        lambda x, w, b: conv_ring(x, w, b, axis, OUTS, (1, 1)),
        [rand(2, CIN, 6, 7), rand(OUTS[q], CIN, 3, 3), rand(OUTS[q])],
    )
    out = {}
    for name, (op, inputs) in cases.items():
        n = len(inputs)
        full = _run(op, inputs, [True] * n)
        frozen = _run(op, inputs, [True] + [False] * (n - 1))
        bias_only = _run(op, inputs, [True] + [False] * (n - 2) + [True])
        out[name] = {
            "same_y": torch.equal(full["y"], frozen["y"]),
            "same_dx": all(
                torch.allclose(full["grads"][0], other["grads"][0], rtol=1e-5, atol=1e-5)
                for other in (frozen, bias_only)
            ),
            "frozen_grads_none": all(gr is None for gr in frozen["grads"][1:])
            and all(gr is None for gr in bias_only["grads"][1:-1]),
            "same_bias_grad": torch.equal(full["grads"][-1], bias_only["grads"][-1]),
            "sent": [full["sent"], frozen["sent"], bias_only["sent"]],
        }
    return out


def test_frozen_weights_get_no_gradient_and_send_no_weight_gradient() -> None:
    for rank, result in enumerate(spawn(MeshShape(1, 1, 4), _cases)):
        for name, r in result.items():
            assert r["same_y"] and r["same_dx"], (rank, name, r)
            assert r["frozen_grads_none"] and r["same_bias_grad"], (rank, name, r)
            full, frozen, bias_only = r["sent"]
            assert frozen < full and bias_only <= full, (rank, name, r["sent"])
