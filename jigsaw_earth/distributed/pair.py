"""The channel MLP ``act(X·W1 + b1)·W2 + b2`` as one distributed product (Megatron's pairing).

Rank ``q`` holds its token rows ``X_q`` (``n_q × Cin``), the column block ``W1[:, hid_q]`` with
``b1[hid_q]``, the *row* block ``W2[hid_q, :]`` and the bias block ``b2[out_q]``. Hidden block
``k`` of a token needs only ``W1``'s and ``W2``'s block ``k``, so the two products run as one:

* ``"weights"`` — rank ``k``'s four blocks travel as one message around the ring; each rank adds
  ``act(X_q·W1_k + b1_k)·W2_k`` to its output while the next message is in flight. The backward
  sends the blocks round the other way for ``dX`` and sums the blocks' gradients in a ring
  reduce-scatter that trails it by one step (block ``k``'s gradient needs ``W2_k`` in hand).
* ``"activations"`` — rank ``q`` sends ``X_q`` to every peer, which returns its hidden block's
  partial output ``act(X_q·W1_k + b1_k)·W2_k``; the backward sends ``[X_q, dY_q]`` and receives
  ``dX`` partial sums. Every weight gradient is computed where its block lives.

Against two column-sharded linears, the weight ring moves the same bytes in half the
rendezvous and the activation exchange fewer bytes (no hidden activations travel). ``"auto"``
picks by ``pair_bytes`` through ``matmul.decide``, the one rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .comm import run_exchange
from .matmul import (
    _ACC,
    _RING,
    _acc_dtype,
    _add,
    _addmm_,
    _as,
    _first,
    _like,
    _send_recv,
    autocast_operands,
    decide,
)
from .mesh import Axis
from .tiles import split_offsets

__all__ = ["matmul_pair", "pair_bytes", "pair_strategy", "pair_whole"]

Activation = Callable[[torch.Tensor], torch.Tensor]
ActivationGrad = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (dh, z) -> dz
# dropout between the products: (rank, start, stop) -> the factor (keep / (1 - p)) of hidden
# channels [start, stop) of that rank's tokens, (n_rank, stop - start); None: no dropout
Drop = Callable[[int, int, int], torch.Tensor] | None


def _block_sizes(cin: int, hid: int, cout: int, out_k: int) -> list[int]:
    """The four pieces of one rank's message: ``W1_k``, ``b1_k``, ``W2_k``, ``b2_k``."""
    return [cin * hid, hid, hid * cout, out_k]


def _pack(w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
    return torch.cat([w1.reshape(-1), b1, w2.reshape(-1), b2])


def _unpack(buf: torch.Tensor, cin: int, hid: int, cout: int, out_k: int) -> list[torch.Tensor]:
    w1, b1, w2, b2 = buf.split(_block_sizes(cin, hid, cout, out_k))
    return [w1.view(cin, hid), b1, w2.view(hid, cout), b2]


def _hidden(x, w1, b1, act, factor):
    """The pre-activation and the (dropped-out) activation of one hidden block."""
    z = torch.addmm(b1, x, w1)
    h = act(z)
    return z, h if factor is None else h * factor.to(h.dtype)


def _dropped(dh: torch.Tensor, factor: torch.Tensor | None) -> torch.Tensor:
    return dh if factor is None else dh * factor.to(dh.dtype)


# ------------------------------------------------------------------------------ moving weights
class _PairWeights(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, axis, hid_sizes, out_sizes, act, act_grad, drop):  # type: ignore[override]
        P, q = axis.size, axis.index
        cin, cout = x.shape[1], w2.shape[1]
        off, hoff = split_offsets(out_sizes), split_offsets(hid_sizes)
        size = [sum(_block_sizes(cin, hid_sizes[k], cout, out_sizes[k])) for k in range(P)]
        cur = _pack(w1, b1, w2, b2)
        zs, hs = [None] * P, [None] * P
        y = None
        for s in range(P):
            k = (q + s) % P
            nxt = None
            if s < P - 1:
                nxt = _send_recv(axis, -1, cur, 1, (size[(k + 1) % P],), op="mlp.weights", tag=_RING)
            w1k, b1k, w2k, b2k = _unpack(cur, cin, hid_sizes[k], cout, out_sizes[k])
            factor = drop(q, hoff[k], hoff[k + 1]) if drop is not None else None
            zs[k], hs[k] = _hidden(x, w1k, b1k, act, factor)
            y = _addmm_(y, hs[k], w2k)
            y[:, off[k] : off[k + 1]] += b2k
            if nxt is not None:
                cur = nxt.wait()[0]
        ctx.save_for_backward(x, w1, b1, w2, b2, *zs, *hs)
        ctx.args = (axis, hid_sizes, out_sizes, act_grad, drop)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x0, w10, b10, w20, b20, *saved = ctx.saved_tensors
        x, w1, b1, w2, b2, dy = _as(x0.dtype, x0, w10, b10, w20, b20, dy)
        axis, hid_sizes, out_sizes, act_grad, drop = ctx.args
        P, q = axis.size, axis.index
        zs, hs = saved[:P], saved[P:]
        cin, cout = x.shape[1], w2.shape[1]
        off, hoff = split_offsets(out_sizes), split_offsets(hid_sizes)
        size = [sum(_block_sizes(cin, hid_sizes[k], cout, out_sizes[k])) for k in range(P)]
        op = "mlp.weights.backward"
        need_dx = ctx.needs_input_grad[0]  # the same on every rank (SPMD), so peers agree
        need_g = any(ctx.needs_input_grad[1:5])  # frozen weights: no reduce-scatter of their gradients
        dx = None
        dzs: list = [None] * P
        pending, grads = None, None

        def reduce_step(t: int) -> None:  # the ring reduce-scatter's step t: block q-1-t
            nonlocal pending, grads
            k = (q - 1 - t) % P
            part = _pack(x.T @ dzs[k], dzs[k].sum(0), hs[k].T @ dy, dy[:, off[k] : off[k + 1]].sum(0))
            dzs[k] = None
            if pending is not None:
                part = _add(part, pending.wait()[0])
            if t < P - 1:
                pending = _send_recv(axis, 1, part, -1, (size[(k - 1) % P],), op=op, tag=_ACC)
            else:
                grads = part

        cur = _pack(w1, b1, w2, b2)
        for s in range(P):  # blocks q, q-1, ...: the reduce-scatter needs block q-1-t at step t
            k = (q - s) % P
            nxt = None
            if s < P - 1:
                nxt = _send_recv(axis, 1, cur, -1, (size[(k - 1) % P],), op=op, tag=_RING)
            w1k, _, w2k, _ = _unpack(cur, cin, hid_sizes[k], cout, out_sizes[k])
            factor = drop(q, hoff[k], hoff[k + 1]) if drop is not None else None
            dzs[k] = act_grad(_dropped(dy @ w2k.T, factor), zs[k])
            if need_dx:
                dx = _addmm_(dx, dzs[k], w1k.T)
            if not need_g:
                dzs[k] = None
            elif s > 0:
                reduce_step(s - 1)
            if nxt is not None:
                cur = nxt.wait()[0]
        if not need_g:
            return _like(dx, x0), *[None] * 10
        reduce_step(P - 1)
        g1, gb1, g2, gb2 = _unpack(grads, cin, hid_sizes[q], cout, out_sizes[q])
        g1, gb1, g2, gb2 = (
            g if ctx.needs_input_grad[i] else None for i, g in enumerate((g1, gb1, g2, gb2), 1)
        )
        return _like(dx, x0), _like(g1, w10), _like(gb1, b10), _like(g2, w20), _like(gb2, b20), *[None] * 6


# -------------------------------------------------------------------------- moving activations
class _PairActivations(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, axis, hid_sizes, out_sizes, counts, act, act_grad, drop):  # type: ignore[override]
        P, q = axis.size, axis.index
        cin, cout = x.shape[1], w2.shape[1]
        lo, hi = split_offsets(out_sizes)[q : q + 2]
        h0, h1 = split_offsets(hid_sizes)[q : q + 2]
        op = "mlp.activations"

        def partial(r, rows):  # this rank's hidden block of rank r's rows' output, with its bias block
            z, h = _hidden(rows, w1, b1, act, drop(r, h0, h1) if drop is not None else None)
            y = h @ w2
            y[:, lo:hi] += b2
            return z, h, y

        zs, hs = [None] * P, [None] * P
        incoming = _send_recv(axis, 1, x, -1, (counts[(q - 1) % P], cin), op=op, tag=_RING)
        zs[q], hs[q], y = partial(q, x)
        y = y.to(_acc_dtype(y.dtype))
        returns = []
        for s in range(1, P):
            r = (q - s) % P
            rows = incoming.wait()[0]
            if s < P - 1:
                shape = (counts[(q - s - 1) % P], cin)
                incoming = _send_recv(axis, s + 1, x, -(s + 1), shape, op=op, tag=_RING)
            zs[r], hs[r], part = partial(r, rows)
            returns.append(_send_recv(axis, -s, part, s, (x.shape[0], cout), op=op, tag=_ACC))
        for pending in returns:
            y += pending.wait()[0]
        ctx.save_for_backward(x, w1, b1, w2, b2, *zs, *hs)
        ctx.args = (axis, hid_sizes, out_sizes, counts, act_grad, drop)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x0, w10, b10, w20, b20, *saved = ctx.saved_tensors
        x, w1, b1, w2, b2, dy = _as(x0.dtype, x0, w10, b10, w20, b20, dy)
        axis, hid_sizes, out_sizes, counts, act_grad, drop = ctx.args
        P, q = axis.size, axis.index
        zs, hs = saved[:P], saved[P:]
        cin, cout, acc = x.shape[1], w2.shape[1], _acc_dtype(x.dtype)
        lo, hi = split_offsets(out_sizes)[q : q + 2]
        h0, h1 = split_offsets(hid_sizes)[q : q + 2]
        op = "mlp.activations.backward"
        need_dx = ctx.needs_input_grad[0]
        need_g = any(ctx.needs_input_grad[1:5])  # frozen weights: the peers' rows need not travel
        xin = cin if need_g else 0
        g1 = torch.zeros(w1.shape, dtype=acc, device=x.device)
        gb1 = torch.zeros(b1.shape, dtype=acc, device=x.device)
        g2 = torch.zeros(w2.shape, dtype=acc, device=x.device)
        gb2 = torch.zeros(b2.shape, dtype=acc, device=x.device)

        def block(r: int, rows: torch.Tensor, dyr: torch.Tensor) -> torch.Tensor:
            """Rank r's tokens through this rank's hidden block: adds the weight gradients, returns dz."""
            dz = act_grad(_dropped(dyr @ w2.T, drop(r, h0, h1) if drop is not None else None), zs[r])
            if need_g:
                _addmm_(g1, rows.T, dz)
                gb1.add_(dz.sum(0, dtype=acc))
                _addmm_(g2, hs[r].T, dyr)
                gb2.add_(dyr[:, lo:hi].sum(0, dtype=acc))
            return dz

        def post(s: int):
            send = torch.cat([x, dy], dim=1) if need_g else dy.contiguous()
            return _send_recv(axis, s, send, -s, (counts[(q - s) % P], xin + cout), op=op, tag=_RING)

        incoming = post(1) if P > 1 else None
        dz = block(q, x, dy)
        dx = _first(dz, w1.T) if need_dx else None
        returns = []
        for s in range(1, P):
            r = (q - s) % P
            rows, dyr = incoming.wait()[0].split([xin, cout], dim=1)
            if s < P - 1:
                incoming = post(s + 1)
            dz = block(r, rows, dyr)
            if need_dx:
                returns.append(_send_recv(axis, -s, dz @ w1.T, s, x.shape, op=op, tag=_ACC))
        for pending in returns:
            dx += pending.wait()[0]
        g1, gb1, g2, gb2 = (
            g if ctx.needs_input_grad[i] else None for i, g in enumerate((g1, gb1, g2, gb2), 1)
        )
        return _like(dx, x0), _like(g1, w10), _like(gb1, b10), _like(g2, w20), _like(gb2, b20), *[None] * 7


# ------------------------------------------------------------------------------ cost and API
def pair_bytes(
    strategy: str,
    counts: Sequence[int],
    cin: int,
    hid_sizes: Sequence[int],
    out_sizes: Sequence[int],
    elsize: int = 4,
    input_grad: bool = True,
) -> tuple[int, int]:
    """Bytes sent over all ranks by ``matmul_pair``: (forward, backward); arguments as for
    ``matmul.channel_bytes``. Moving weights, the backward rings run with or without ``dX``
    (block ``k``'s ``dW1`` needs ``W2_k``)."""
    P, N, hid, cout = len(counts), sum(counts), sum(hid_sizes), sum(out_sizes)
    if P == 1:
        return 0, 0
    if strategy == "weights":
        blocks = (P - 1) * (cin * hid + hid + hid * cout + cout) * elsize
        return blocks, 2 * blocks
    fwd = (P - 1) * N * (cin + cout)
    bwd = (P - 1) * N * (cin + cout) + ((P - 1) * N * cin if input_grad else 0)
    return fwd * elsize, bwd * elsize


def pair_strategy(
    strategy: str,
    counts: Sequence[int],
    cin: int,
    hid_sizes: Sequence[int],
    out_sizes: Sequence[int],
    training: bool = True,
    input_grad: bool = True,
) -> str:
    """The strategy ``matmul_pair`` runs (``decide`` on ``pair_bytes``)."""
    return decide(
        strategy, lambda s: pair_bytes(s, counts, cin, hid_sizes, out_sizes, input_grad=input_grad), training
    )


def pair_whole(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor,
               act: Activation, factor: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """The pair with whole weights on one rank's rows, no message: one rank's ``matmul_pair``, and
    a forecast's on weights gathered once (``layers/replicas.py``); ``factor``: dropout's."""
    x, w1, b1, w2, b2 = autocast_operands(x, w1, b1, w2, b2)
    return torch.addmm(b2, _hidden(x, w1, b1, act, factor)[1], w2)


def matmul_pair(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor,
    w2: torch.Tensor,
    b2: torch.Tensor,
    axis: Axis,
    hid_sizes: Sequence[int],
    out_sizes: Sequence[int],
    counts: Sequence[int],
    act: Activation,
    act_grad: ActivationGrad,
    strategy: str = "auto",
    drop: Drop = None,
) -> torch.Tensor:
    """``act(X·W1 + b1)·W2 + b2`` for token rows ``x`` (``n_q × Cin``), the column block ``w1``
    (``Cin × H_q``) with ``b1``, the row block ``w2`` (``H_q × Cout``) and the bias block ``b2``
    (``Cout_q``). ``act_grad(dh, z)`` is ``act``'s backward at its input ``z``; ``drop``, dropout
    between the products (``Drop``)."""
    q = axis.index
    held = (x.shape[0], w1.shape[1], w2.shape[0], b2.shape[0])
    if held != (counts[q], hid_sizes[q], hid_sizes[q], out_sizes[q]):
        raise ValueError(
            f"matmul_pair: rank {q} holds x {tuple(x.shape)}, w1 {tuple(w1.shape)}, w2 {tuple(w2.shape)} "
            f"and b2 {tuple(b2.shape)}, but counts={tuple(counts)}, hidden sizes={tuple(hid_sizes)} "
            f"and out_sizes={tuple(out_sizes)}"
        )
    if axis.size == 1:
        return pair_whole(x, w1, b1, w2, b2, act, drop(0, 0, w1.shape[1]) if drop else None)
    x, w1, b1, w2, b2 = autocast_operands(x, w1, b1, w2, b2)
    training = torch.is_grad_enabled() and any(t.requires_grad for t in (x, w1, b1, w2, b2))
    input_grad = torch.is_grad_enabled() and x.requires_grad
    chosen = pair_strategy(strategy, counts, x.shape[1], hid_sizes, out_sizes, training, input_grad)
    hid, out = tuple(hid_sizes), tuple(out_sizes)
    if chosen == "weights":
        return run_exchange(_PairWeights.apply, x, w1, b1, w2, b2, axis, hid, out, act, act_grad, drop)
    args = (x, w1, b1, w2, b2, axis, hid, out, tuple(counts), act, act_grad, drop)
    return run_exchange(_PairActivations.apply, *args)
