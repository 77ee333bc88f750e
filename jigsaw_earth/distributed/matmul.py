"""Jigsaw's distributed matmul: activations sharded by tokens, weights sharded over the same ranks.

Two forms, both with forward and backward distributed (custom autograd):

* **channel form** ``Y = X·W + b``: rank ``q`` holds token rows ``X_q`` (``N_q × Cin``) and the
  column block ``W[:, cols_q]`` (``Cin × Cout_q``) with ``b[cols_q]``; it returns ``Y_q``
  (``N_q × Cout``).
* **token form** ``Y = A·X + b``: contraction over the sharded token dimension (WeatherMixer's
  token mixing). Rank ``q`` holds ``X_q`` (``N_q × C``) and the row block ``A[rows_q, :]``
  (``M_q × N``, columns in rank order) with ``b[rows_q]``; it returns ``Y_q`` (``M_q × C``).

Strategies (no rank ever holds the full weight):

* ``"weights"`` — move weight shards. Channel form: the shards circulate in a ring, each transfer
  overlapped with the GEMM on the shard in hand; backward re-circulates them for ``dX`` and
  accumulates ``dW`` in a ring reduce-scatter. Token form: each rank sends the block of ``A``
  that multiplies a peer's tokens to that peer, which returns the partial product.
* ``"activations"`` — move activation blocks (Jigsaw's exchange). Channel form: each rank sends
  its tokens to every peer, which returns ``X_q·W_k``. Token form: token blocks circulate in a
  ring and ``dX`` is accumulated in a ring reduce-scatter.

``"auto"`` picks the cheaper by the byte counts of ``channel_bytes``/``token_bytes``, which are
exact: the ledger in ``comm`` measures the same numbers. ``decide`` is that rule, the only one:
the matmuls, the convolutions, the layers' cost declarations and the validator all call it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch

from .comm import exchange, run_exchange
from .mesh import Axis
from .tiles import split_offsets

__all__ = [
    "Strategy",
    "autocast_operands",
    "channel_bytes",
    "channel_strategy",
    "decide",
    "matmul_channels",
    "matmul_tokens",
    "token_bytes",
    "token_strategy",
]

Strategy = Literal["auto", "weights", "activations"]
_RING, _ACC = 1, 2  # message tags: circulating operands, accumulating partial sums


def _send_recv(axis: Axis, to: int, tensor: torch.Tensor, frm: int, shape, *, op: str, tag: int):
    """Send to the rank ``to`` steps ahead, receive from ``frm`` steps ahead; no wait."""
    return exchange(
        axis,
        [(axis.peer(to), tensor)],
        [(axis.peer(frm), tuple(shape))],
        op=op,
        dtype=tensor.dtype,
        device=tensor.device,
        tag=tag,
    )


def ring_backward(
    axis: Axis,
    wb: torch.Tensor,
    msg_shape: Callable[[int], tuple[int, ...]],
    add_dx: Callable[[torch.Tensor | None, int, torch.Tensor], torch.Tensor | None] | None,
    grad_part: Callable[[int], torch.Tensor] | None,
    add: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    op: str,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The backward of a weight ring on rank ``q`` of ``P``: ``(dx, gradient of wb)``.

    At step ``s`` the weight block ``kw = q + s`` (this rank's ``wb`` first, then what came from
    rank ``q + 1``) meets ``add_dx(dx, kw, block)`` and moves on to rank ``q - 1``; the partial
    gradient of block ``kg = q - 1 - s`` (``grad_part(kg)``, added to the one from rank ``q - 1``
    with ``add``) moves on to rank ``q + 1``, so after the last step this rank holds the whole
    gradient of its own block. ``None`` skips a side (no dX; frozen weights: ``wb`` is returned).
    ``msg_shape(k)``: the shape of block ``k``'s message.
    """
    P, q = axis.size, axis.index
    dx, acc_in, cur, grad = None, None, wb, wb
    for s in range(P):
        kw, kg = (q + s) % P, (q - 1 - s) % P
        w_next = None
        if add_dx is not None:
            if s < P - 1:
                w_next = _send_recv(axis, -1, cur, 1, msg_shape((kw + 1) % P), op=op, tag=_RING)
            dx = add_dx(dx, kw, cur)
        if grad_part is not None:
            part = grad_part(kg)
            if acc_in is not None:
                part = add(part, acc_in.wait()[0])
            if s < P - 1:
                acc_in = _send_recv(axis, 1, part, -1, msg_shape((kg - 1) % P), op=op, tag=_ACC)
            else:
                grad = part
        if w_next is not None:
            cur = w_next.wait()[0]
    return dx, grad


_LOW = (torch.bfloat16, torch.float16)


def autocast_operands(*tensors: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """Cast floating operands to the autocast dtype when autocast is on (as autocast would cast a
    ``matmul``'s or ``conv2d``'s inputs), so a distributed op sees one dtype in forward and
    backward and its messages travel in the lower precision."""
    dev = next(t for t in tensors if t is not None).device.type
    if not torch.is_autocast_enabled(dev):
        return tensors
    dtype = torch.get_autocast_dtype(dev)
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() else t for t in tensors)


def _as(dtype: torch.dtype, *tensors: torch.Tensor | None) -> list:
    """Backward runs outside autocast: compute every product (and send it) in the forward's dtype."""
    return [t if t is None or t.dtype == dtype else t.to(dtype) for t in tensors]


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Sums over blocks accumulate in fp32 under bf16/fp16; messages stay in ``dtype``."""
    return torch.float32 if dtype in _LOW else dtype


def _addmm_(acc: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``acc += a @ b``, summed inside the GEMM (no temporary product, no second pass) when the
    dtypes agree; a low-precision product under autocast is added to its fp32 sum. With no
    ``acc`` yet, the product starts the sum (``_first``)."""
    if acc is None:
        return _first(a, b)
    if acc.dtype == a.dtype:
        return acc.addmm_(a, b)
    acc += a @ b
    return acc


def _first(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The first block of a ring's sum, ``a @ b (+ bias)``, in the accumulation dtype."""
    y = a @ b if bias is None else torch.addmm(bias, a, b)
    return y.to(_acc_dtype(y.dtype))


def _add(part: torch.Tensor, incoming: torch.Tensor) -> torch.Tensor:
    """A partial sum plus a received one, added in the accumulation dtype, kept in ``part``'s."""
    if part.dtype in _LOW:
        return (part.float() + incoming.float()).to(part.dtype)
    return part + incoming


def _needed(ctx: Any, i: int, grad: torch.Tensor | None) -> torch.Tensor | None:
    """``grad`` if input ``i`` of the autograd function needs one, else ``None`` (a frozen weight)."""
    return grad if ctx.needs_input_grad[i] else None


def _like(grad: torch.Tensor | None, ref: torch.Tensor | None) -> torch.Tensor | None:
    """Return a gradient in the dtype of the tensor it belongs to."""
    return grad if grad is None or ref is None or grad.dtype == ref.dtype else grad.to(ref.dtype)


def _with_bias(w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return w if b is None else torch.cat([w, b.unsqueeze(0)], dim=0)


def _affine(x: torch.Tensor, wb: torch.Tensor, cin: int, bias: bool) -> torch.Tensor:
    return torch.addmm(wb[cin], x, wb[:cin]) if bias else x @ wb


# ---------------------------------------------------------------- channel form, moving weights
class _ChannelWeights(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, axis, out_sizes):  # type: ignore[override]
        P, q = axis.size, axis.index
        cin, bias = w.shape[0], b is not None
        ctx.save_for_backward(x, w, b)
        ctx.args = (axis, out_sizes)
        cur = _with_bias(w, b)
        outs: list[torch.Tensor] = [x] * P
        for s in range(P):
            k = (q + s) % P
            nxt = None
            if s < P - 1:
                shape = (cur.shape[0], out_sizes[(k + 1) % P])
                nxt = _send_recv(axis, -1, cur, 1, shape, op="matmul.weights", tag=_RING)
            outs[k] = _affine(x, cur, cin, bias)
            if nxt is not None:
                cur = nxt.wait()[0]
        return torch.cat(outs, dim=-1)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x0, w0, b0 = ctx.saved_tensors
        x, w, b, dy = _as(x0.dtype, x0, w0, b0, dy)
        axis, out_sizes = ctx.args
        cin, bias = w.shape[0], b is not None
        need_dx = ctx.needs_input_grad[0]  # the same on every rank (SPMD), so peers agree
        need_wb = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]  # frozen weights: no dW ring
        dys = dy.split(list(out_sizes), dim=-1)
        wb = _with_bias(w, b)
        dx, grad_wb = ring_backward(
            axis,
            wb,
            lambda k: (wb.shape[0], out_sizes[k]),
            (lambda acc, k, wb_k: _addmm_(acc, dys[k], wb_k[:cin].T)) if need_dx else None,
            (lambda k: _with_bias(x.T @ dys[k], dys[k].sum(0) if bias else None)) if need_wb else None,
            _add,
            "matmul.weights.backward",
        )
        gw, gb = (grad_wb[:cin], grad_wb[cin]) if bias else (grad_wb, None)
        gw, gb = _needed(ctx, 1, gw), _needed(ctx, 2, gb)
        return _like(dx, x0), _like(gw, w0), _like(gb, b0), None, None


# ------------------------------------------------------------ channel form, moving activations
class _ChannelActivations(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, axis, out_sizes, counts):  # type: ignore[override]
        P, q = axis.size, axis.index
        ctx.save_for_backward(x, w, b)
        ctx.args = (axis, out_sizes, counts)
        wb, cin, bias = _with_bias(w, b), w.shape[0], b is not None
        outs: list = [None] * P
        x_in = _send_recv(axis, 1, x, -1, (counts[(q - 1) % P], cin), op="matmul.activations", tag=_RING)
        outs[q] = _affine(x, wb, cin, bias)
        y_in = []
        for s in range(1, P):
            xr = x_in.wait()[0]
            if s < P - 1:
                shape = (counts[(q - s - 1) % P], cin)
                x_in = _send_recv(axis, s + 1, x, -(s + 1), shape, op="matmul.activations", tag=_RING)
            z = _affine(xr, wb, cin, bias)
            shape = (x.shape[0], out_sizes[(q + s) % P])
            y_in.append(_send_recv(axis, -s, z, s, shape, op="matmul.activations", tag=_ACC))
        for s, pending in enumerate(y_in, start=1):
            outs[(q + s) % P] = pending.wait()[0]
        return torch.cat(outs, dim=-1)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x0, w0, b0 = ctx.saved_tensors
        x, w, b, dy = _as(x0.dtype, x0, w0, b0, dy)
        axis, out_sizes, counts = ctx.args
        P, q = axis.size, axis.index
        cin, acc = w.shape[0], _acc_dtype(x.dtype)
        need_dx = ctx.needs_input_grad[0]  # the same on every rank (SPMD), so peers agree
        need_wb = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]  # frozen weights: dY only
        xin = cin if need_wb else 0  # the peers' rows travel only for the weight gradient
        dys = dy.split(list(out_sizes), dim=-1)
        op = "matmul.activations.backward"

        def post(s: int):
            send = torch.cat([x, dys[(q + s) % P]], dim=1) if need_wb else dys[(q + s) % P].contiguous()
            shape = (counts[(q - s) % P], xin + out_sizes[q])
            return _send_recv(axis, s, send, -s, shape, op=op, tag=_RING)

        incoming = post(1) if P > 1 else None
        dx = _first(dys[q], w.T) if need_dx else None
        dw = _first(x.T, dys[q]) if need_wb else None
        db = dys[q].sum(0, dtype=acc) if b is not None and need_wb else None
        dx_in = []
        for s in range(1, P):
            buf = incoming.wait()[0]
            if s < P - 1:
                incoming = post(s + 1)
            xr, dyr = buf.split([xin, out_sizes[q]], dim=1)
            if need_dx:
                dx_in.append(_send_recv(axis, -s, dyr @ w.T, s, x.shape, op=op, tag=_ACC))
            if dw is not None:
                _addmm_(dw, xr.T, dyr)
            if db is not None:
                db += dyr.sum(0, dtype=acc)
        for pending in dx_in:
            dx += pending.wait()[0]
        dw, db = _needed(ctx, 1, dw), _needed(ctx, 2, db)
        return _like(dx, x0), _like(dw, w0), _like(db, b0), None, None, None


# -------------------------------------------------------------- token form, moving activations
# The token form's ``a`` is either ``M_q × N`` with its columns in rank order, or a weight
# ``M_q × H × W`` over the token grid with ``tiles[k]`` = rank ``k``'s (lat0, lat1, lon0, lon1):
# then rank k's columns are read from its tile on the fly, so no rank-ordered copy of the weight
# lives through the step.
Tiles = tuple[tuple[int, int, int, int], ...] | None


def _cols(a: torch.Tensor, off: Sequence[int], tiles: Tiles, k: int) -> torch.Tensor:
    """The columns of ``a`` that multiply rank ``k``'s tokens, ``M_q × N_k``."""
    if tiles is None:
        return a[:, off[k] : off[k + 1]]
    i0, i1, j0, j1 = tiles[k]
    return a[:, i0:i1, j0:j1].reshape(a.shape[0], (i1 - i0) * (j1 - j0))


def _set_cols(da: torch.Tensor, off: Sequence[int], tiles: Tiles, k: int, block: torch.Tensor) -> None:
    """Write rank ``k``'s columns of ``da`` (the inverse of ``_cols``)."""
    if tiles is None:
        da[:, off[k] : off[k + 1]] = block
    else:
        i0, i1, j0, j1 = tiles[k]
        da[:, i0:i1, j0:j1] = block.view(da.shape[0], i1 - i0, j1 - j0)


class _TokenActivations(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, a, b, axis, counts, tiles):  # type: ignore[override]
        P, q = axis.size, axis.index
        ctx.save_for_backward(x, a, b)
        ctx.args = (axis, counts, tiles)
        off = split_offsets(counts)
        op = "matmul.tokens"
        # the ring: post each block's onward transfer before multiplying by it
        nxt = _send_recv(axis, -1, x, 1, (counts[(q + 1) % P], x.shape[1]), op=op, tag=_RING)
        y = _first(_cols(a, off, tiles, q), x, None if b is None else b.unsqueeze(-1))
        for s in range(1, P):
            k = (q + s) % P
            cur = nxt.wait()[0]
            if s < P - 1:
                nxt = _send_recv(axis, -1, cur, 1, (counts[(k + 1) % P], x.shape[1]), op=op, tag=_RING)
            _addmm_(y, _cols(a, off, tiles, k), cur)
        return y

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x0, a0, b0 = ctx.saved_tensors
        x, a, b, dy = _as(x0.dtype, x0, a0, b0, dy)
        axis, counts, tiles = ctx.args
        P, q = axis.size, axis.index
        off = split_offsets(counts)
        op = "matmul.tokens.backward"
        need_dx = ctx.needs_input_grad[0]  # the same on every rank (SPMD), so peers agree
        need_da = ctx.needs_input_grad[1]  # a frozen weight: the tokens' ring is not needed
        da = torch.empty_like(a) if need_da else None
        cur, acc_in, dx = x, None, None
        for s in range(P):
            kx, kg = (q + s) % P, (q - 1 - s) % P
            x_next = None
            if need_da and s < P - 1:
                shape = (counts[(kx + 1) % P], x.shape[1])
                x_next = _send_recv(axis, -1, cur, 1, shape, op=op, tag=_RING)
            if need_da:
                _set_cols(da, off, tiles, kx, dy @ cur.T)
            if need_dx:
                part = _cols(a, off, tiles, kg).T @ dy
                if acc_in is not None:
                    part = _add(part, acc_in.wait()[0])
                if s < P - 1:
                    shape = (counts[(kg - 1) % P], x.shape[1])
                    acc_in = _send_recv(axis, 1, part, -1, shape, op=op, tag=_ACC)
                else:
                    dx = part
            if x_next is not None:
                cur = x_next.wait()[0]
        db = dy.sum(-1, dtype=_acc_dtype(dy.dtype)) if b is not None and ctx.needs_input_grad[2] else None
        return _like(dx, x0), _like(da, a0), _like(db, b0), None, None, None


# ------------------------------------------------------------------ token form, moving weights
class _TokenWeights(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, a, b, axis, in_counts, out_counts, tiles):  # type: ignore[override]
        P, q = axis.size, axis.index
        off = split_offsets(in_counts)
        op = "matmul.tokens.weights"

        def post(s: int):  # the block of A that multiplies peer q+s's tokens, sent to it
            k_to, k_from = (q + s) % P, (q - s) % P
            blk = _cols(a, off, tiles, k_to)
            return _send_recv(axis, s, blk, -s, (out_counts[k_from], in_counts[q]), op=op, tag=_RING)

        col_blocks: list = [None] * P  # A_k[:, cols_q] for every k: 1/P of A
        col_blocks[q] = _cols(a, off, tiles, q)
        incoming = post(1) if P > 1 else None
        y = _first(col_blocks[q], x, None if b is None else b.unsqueeze(-1))
        partials = []
        for s in range(1, P):
            k_from = (q - s) % P
            col_blocks[k_from] = incoming.wait()[0]
            if s < P - 1:
                incoming = post(s + 1)  # in flight while this block is multiplied
            z = col_blocks[k_from] @ x
            partials.append(_send_recv(axis, -s, z, s, (a.shape[0], x.shape[1]), op=op, tag=_ACC))
        for pending in partials:
            y += pending.wait()[0]
        ctx.save_for_backward(x, b, *col_blocks)
        ctx.args = (axis, in_counts, out_counts, a.shape, a.dtype, tiles)
        return y

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x0, b0, *blocks0 = ctx.saved_tensors
        x, b, dy, *col_blocks = _as(x0.dtype, x0, b0, dy, *blocks0)
        axis, in_counts, out_counts, a_shape, a_dtype, tiles = ctx.args
        P, q = axis.size, axis.index
        off = split_offsets(in_counts)
        op = "matmul.tokens.weights.backward"
        need_dx = ctx.needs_input_grad[0]
        need_da = ctx.needs_input_grad[1]  # a frozen weight: no partial products go back
        dy = dy.contiguous()

        def post(s: int):
            return _send_recv(axis, s, dy, -s, (out_counts[(q - s) % P], dy.shape[1]), op=op, tag=_RING)

        incoming = post(1) if P > 1 else None
        dx = _first(col_blocks[q].T, dy) if need_dx else None
        da = dy.new_empty(a_shape) if need_da else None
        if da is not None:
            _set_cols(da, off, tiles, q, dy @ x.T)
        returns = []
        for s in range(1, P):
            k_from = (q - s) % P
            dyk = incoming.wait()[0]
            if s < P - 1:
                incoming = post(s + 1)
            if da is not None:
                shape = (a_shape[0], in_counts[(q + s) % P])
                returns.append(_send_recv(axis, -s, dyk @ x.T, s, shape, op=op, tag=_ACC))
            if dx is not None:
                _addmm_(dx, col_blocks[k_from].T, dyk)
        for s, pending in enumerate(returns, start=1):
            k = (q + s) % P
            _set_cols(da, off, tiles, k, pending.wait()[0])
        db = dy.sum(-1, dtype=_acc_dtype(dy.dtype)) if b is not None and ctx.needs_input_grad[2] else None
        return _like(dx, x0), None if da is None else da.to(a_dtype), _like(db, b0), None, None, None, None


# ------------------------------------------------------------------------------ cost and API
def channel_bytes(
    strategy: str,
    counts: Sequence[int],
    cin: int,
    out_sizes: Sequence[int],
    bias: bool,
    elsize: int = 4,
    input_grad: bool = True,
) -> tuple[int, int]:
    """Bytes sent over all ranks by ``matmul_channels``: (forward, backward).

    ``elsize``: bytes per element of the compute dtype (2 under bf16 autocast); ``input_grad``:
    whether ``x`` needs a gradient (without it the backward moves nothing for ``dX``)."""
    P, N, cout = len(counts), sum(counts), sum(out_sizes)
    if P == 1:
        return 0, 0
    rows = cin + (1 if bias else 0)
    if strategy == "weights":
        return (P - 1) * rows * cout * elsize, (2 if input_grad else 1) * (P - 1) * rows * cout * elsize
    fwd = (P - 1) * N * cin + sum((N - counts[q]) * out_sizes[q] for q in range(P))
    bwd = (P - 1) * N * cin + sum(counts[q] * (cout - out_sizes[q]) for q in range(P))
    if input_grad:
        bwd += (P - 1) * N * cin
    return fwd * elsize, bwd * elsize


def token_bytes(
    strategy: str,
    in_counts: Sequence[int],
    out_counts: Sequence[int],
    channels: int,
    elsize: int = 4,
    input_grad: bool = True,
) -> tuple[int, int]:
    """Bytes sent over all ranks by ``matmul_tokens``: (forward, backward); arguments as for
    ``channel_bytes`` (moving weights, ``dX`` is computed locally: the same bytes either way)."""
    P, N, M = len(in_counts), sum(in_counts), sum(out_counts)
    if P == 1:
        return 0, 0
    if strategy == "activations":
        return (P - 1) * N * channels * elsize, (2 if input_grad else 1) * (P - 1) * N * channels * elsize
    a_moved = sum(out_counts[q] * (N - in_counts[q]) for q in range(P))
    y_moved = (P - 1) * M * channels
    return (a_moved + y_moved) * elsize, (a_moved + y_moved) * elsize


def decide(strategy: str, price: Callable[[str], tuple[int, int]], training: bool) -> str:
    """The one rule for ``"auto"``: the strategy whose ``price`` (forward, backward bytes) is
    fewest, counting the backward only when training; any other strategy is kept as given."""
    if strategy != "auto":
        return strategy
    totals = [sum(price(s)[: 2 if training else 1]) for s in ("weights", "activations")]
    return "weights" if totals[0] <= totals[1] else "activations"  # a tie: weights


def channel_strategy(
    strategy: str,
    counts: Sequence[int],
    cin: int,
    out_sizes: Sequence[int],
    bias: bool,
    training: bool = True,
    input_grad: bool = True,
) -> str:
    """The strategy ``matmul_channels`` runs (``decide`` on ``channel_bytes``)."""
    return decide(
        strategy, lambda s: channel_bytes(s, counts, cin, out_sizes, bias, input_grad=input_grad), training
    )


def token_strategy(
    strategy: str,
    in_counts: Sequence[int],
    out_counts: Sequence[int],
    channels: int,
    training: bool = True,
    input_grad: bool = True,
) -> str:
    """The strategy ``matmul_tokens`` runs (``decide`` on ``token_bytes``)."""
    return decide(
        strategy, lambda s: token_bytes(s, in_counts, out_counts, channels, input_grad=input_grad), training
    )


def _check_strategy(strategy: str) -> None:
    if strategy not in ("auto", "weights", "activations"):
        raise ValueError(f"strategy {strategy!r}: use 'auto', 'weights' or 'activations'")


def _training(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _needs_grad(x: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and x.requires_grad


def matmul_channels(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    axis: Axis,
    out_sizes: Sequence[int],
    counts: Sequence[int],
    strategy: Strategy = "auto",
) -> torch.Tensor:
    """``X·W + b`` for token rows ``x`` (``N_q × Cin``) and the column shard ``w`` (``Cin × Cout_q``).

    ``out_sizes[k]`` is rank ``k``'s number of output columns, ``counts[k]`` its number of rows.
    """
    _check_strategy(strategy)
    if w.shape[1] != out_sizes[axis.index] or x.shape[0] != counts[axis.index]:
        raise ValueError(
            f"matmul_channels: rank {axis.index} holds x {tuple(x.shape)} and w {tuple(w.shape)}, "
            f"but counts={tuple(counts)} and out_sizes={tuple(out_sizes)}"
        )
    x, w, b = autocast_operands(x, w, b)
    if axis.size == 1:
        return torch.addmm(b, x, w) if b is not None else x @ w
    training = _training(x, w, b)
    strategy = channel_strategy(
        strategy, counts, w.shape[0], out_sizes, b is not None, training, _needs_grad(x)
    )  # type: ignore[assignment]
    if strategy == "weights":
        return run_exchange(_ChannelWeights.apply, x, w, b, axis, tuple(out_sizes))
    return run_exchange(_ChannelActivations.apply, x, w, b, axis, tuple(out_sizes), tuple(counts))


def matmul_tokens(
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor | None,
    axis: Axis,
    in_counts: Sequence[int],
    out_counts: Sequence[int],
    strategy: Strategy = "auto",
    tiles: Tiles = None,
) -> torch.Tensor:
    """``A·X + b`` contracting the sharded token dimension; ``a`` is this rank's row block.

    ``x`` is ``N_q × C`` with ``in_counts[q] = N_q``; ``a`` is ``M_q × sum(in_counts)`` with its
    columns in rank order, or, with ``tiles`` (every rank's ``(lat0, lat1, lon0, lon1)`` token
    tile), ``M_q × H × W`` over the token grid; ``b`` is ``M_q``. Returns ``M_q × C``.
    """
    _check_strategy(strategy)
    q = axis.index
    n_cols = sum(in_counts) if tiles is None else (a.shape[1] * a.shape[2] if a.dim() == 3 else -1)
    cols_ok = tiles is None or [(t[1] - t[0]) * (t[3] - t[2]) for t in tiles] == list(in_counts)
    if x.shape[0] != in_counts[q] or a.shape[0] != out_counts[q] or n_cols != sum(in_counts) or not cols_ok:
        raise ValueError(
            f"matmul_tokens: rank {q} holds x {tuple(x.shape)} and a {tuple(a.shape)}, but "
            f"in_counts={tuple(in_counts)}, out_counts={tuple(out_counts)} and tiles={tiles}"
        )
    x, a, b = autocast_operands(x, a, b)
    if axis.size == 1:
        a = a.reshape(a.shape[0], n_cols)  # one tile, the whole grid: a view
        return torch.addmm(b.unsqueeze(-1), a, x) if b is not None else a @ x
    training = _training(x, a, b)
    strategy = token_strategy(strategy, in_counts, out_counts, x.shape[1], training, _needs_grad(x))  # type: ignore[assignment]
    if strategy == "activations":
        return run_exchange(_TokenActivations.apply, x, a, b, axis, tuple(in_counts), tiles)
    return run_exchange(_TokenWeights.apply, x, a, b, axis, tuple(in_counts), tuple(out_counts), tiles)
