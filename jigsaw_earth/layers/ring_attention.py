"""Exact softmax attention over tokens sharded across the domain ranks: ring attention.

Rank ``q`` holds the queries, keys and values of its own tokens, ``(B, heads, n_q, d)``. The
key/value blocks travel once around the domain axis (send to the next rank, receive from the
previous), and each rank folds every block into an online softmax (running max ``m``, running
sum ``l``, unnormalised output ``o``), so no rank ever holds more than ``n_q × n_block`` scores
(``block`` caps that further by splitting each arriving block). The transfer of the next block
is posted before the compute on the current one, so they overlap.

Backward (a custom ``autograd.Function``) recomputes the probabilities block by block from the
saved log-sum-exp while the K/V blocks circulate a second time. The gradient of each block's
keys and values is accumulated by every rank it visits: the accumulator follows its block one
hop behind and, after a full circle, arrives back at the block's owner.

Bytes sent over all ranks, ``P`` ranks, ``N`` tokens per sample over all ranks, batch ``B``,
``C = heads × d`` channels, input element size ``e`` (``ring_attention_bytes``):

* forward: ``(P - 1) · B · N · 2C · e`` (each K/V block visits the ``P - 1`` other ranks);
* backward: ``(P - 1) · B · N · 2C · e`` (K/V again) ``+ (P - 1) · B · N · 2C · 4`` (dK/dV
  accumulators, kept in fp32 so that bf16 training sums its partial gradients exactly).

Softmax statistics and accumulators are fp32 whatever the input dtype; autocast is switched off
inside, and the matmuls run in the dtype of ``q, k, v``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch

from ..distributed.comm import Pending, comm_site, exchange
from ..distributed.mesh import Axis

__all__ = ["ring_attention", "ring_attention_bytes"]

_KV, _ACC = 11, 12  # message tags: circulating K/V blocks, travelling dK/dV accumulators


def _pass_on(axis: Axis, t: torch.Tensor, recv_tokens: int, *, op: str, tag: int = _KV) -> Pending:
    """Send ``t`` to the next rank; receive a tensor shaped like ``t`` with ``recv_tokens``
    tokens (dim 2) from the previous rank. Does not wait."""
    shape = (*t.shape[:2], recv_tokens, t.shape[3])
    return exchange(
        axis, [(axis.peer(1), t)], [(axis.peer(-1), shape)], op=op, dtype=t.dtype, device=t.device, tag=tag
    )


def _chunks(kv: torch.Tensor, block: int | None) -> Iterator[tuple[int, torch.Tensor]]:
    n = kv.shape[2]
    step = n if block is None else max(1, block)
    for start in range(0, n, step):
        yield start, kv[:, :, start : start + step]


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.matmul(q, k.transpose(-1, -2)).float() * scale


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, axis, areas, scale, block):  # type: ignore[override]
        P, me, d = axis.size, axis.index, q.shape[-1]
        with torch.autocast(q.device.type, enabled=False):
            o = q.new_zeros(q.shape, dtype=torch.float32)
            m = q.new_full(q.shape[:-1], -math.inf, dtype=torch.float32)
            l = q.new_zeros(q.shape[:-1], dtype=torch.float32)
            cur = torch.cat([k, v.to(k.dtype)], dim=-1)
            for s in range(P):
                nxt = None
                if s < P - 1:
                    nxt = _pass_on(axis, cur, areas[(me - s - 1) % P], op="ring_attention")
                for _, kv in _chunks(cur, block):
                    kc, vc = kv[..., :d], kv[..., d:]
                    sc = _scores(q, kc, scale)
                    m_new = torch.maximum(m, sc.amax(-1))
                    alpha = torch.exp(m - m_new)
                    p = torch.exp(sc - m_new.unsqueeze(-1))
                    l = l * alpha + p.sum(-1)
                    o = o * alpha.unsqueeze(-1) + torch.matmul(p.to(vc.dtype), vc).float()
                    m = m_new
                if nxt is not None:
                    cur = nxt.wait()[0]
            out = (o / l.unsqueeze(-1)).to(q.dtype)
            lse = m + torch.log(l)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (axis, areas, scale, block)
        return out

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        axis, areas, scale, block = ctx.args
        P, me, d = axis.size, axis.index, q.shape[-1]
        with torch.autocast(q.device.type, enabled=False):
            dout = dout.to(q.dtype)
            delta = (dout.float() * out.float()).sum(-1, keepdim=True)
            dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
            cur = torch.cat([k, v.to(k.dtype)], dim=-1)
            own = acc_in = None
            for s in range(P):
                nxt = None
                if s < P - 1:
                    nxt = _pass_on(axis, cur, areas[(me - s - 1) % P], op="ring_attention.backward")
                part = torch.empty(cur.shape, dtype=torch.float32, device=q.device)
                for start, kv in _chunks(cur, block):
                    kc, vc = kv[..., :d], kv[..., d:]
                    p = torch.exp(_scores(q, kc, scale) - lse.unsqueeze(-1))
                    dp = torch.matmul(dout, vc.transpose(-1, -2)).float()
                    ds = (p * (dp - delta)).to(q.dtype)
                    dq += torch.matmul(ds, kc).float() * scale
                    stop = start + kc.shape[2]
                    part[:, :, start:stop, :d] = torch.matmul(ds.transpose(-1, -2), q).float() * scale
                    part[:, :, start:stop, d:] = torch.matmul(
                        p.to(dout.dtype).transpose(-1, -2), dout
                    ).float()
                if s == 0:
                    own = part
                else:
                    if acc_in is not None:
                        part = part + acc_in.wait()[0]
                    # after the last step this receives the finished accumulator of our own block
                    nxt_acc = areas[(me - s - 1) % P]
                    acc_in = _pass_on(axis, part, nxt_acc, op="ring_attention.backward.grad", tag=_ACC)
                if nxt is not None:
                    cur = nxt.wait()[0]
            dkv = own if acc_in is None else own + acc_in.wait()[0]
        return (
            dq.to(q.dtype),
            dkv[..., :d].to(k.dtype),
            dkv[..., d:].to(v.dtype),
            None,
            None,
            None,
            None,
        )


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    axis: Axis,
    areas: Sequence[int],
    scale: float | None = None,
    block: int | None = None,
) -> torch.Tensor:
    """``softmax(q·kᵀ·scale)·v`` over the tokens of all ranks along ``axis``.

    ``q, k, v``: ``(B, heads, n, d)`` with ``n = areas[axis.index]``, this rank's tokens per
    sample; ``areas[k]`` is rank ``k``'s count (uneven allowed). ``scale`` defaults to
    ``d ** -0.5``; ``block`` caps the key tokens per score tile (memory ``n × block``).
    Inputs are cast to the autocast dtype when autocast is on (else to their common dtype);
    returns this rank's output tokens ``(B, heads, n, d)`` in that dtype.
    """
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(
            f"ring_attention expects q, k, v of one shape (B, heads, tokens, head_dim); got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if len(areas) != axis.size or q.shape[2] != areas[axis.index]:
        raise ValueError(
            f"ring_attention: rank {axis.index} of {axis.size} holds {q.shape[2]} tokens, but "
            f"areas={tuple(areas)} (one count per rank along the axis)"
        )
    if block is not None and block < 1:
        raise ValueError(f"block must be a positive number of key tokens or None, got {block}")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    dev = q.device.type
    if torch.is_autocast_enabled(dev):
        dtype = torch.get_autocast_dtype(dev)
    else:
        dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    with comm_site("ring_attention"):
        return _RingAttention.apply(q, k, v, axis, tuple(areas), scale, block)


def ring_attention_bytes(areas: Sequence[int], batch: int, channels: int, elsize: int = 4) -> tuple[int, int]:
    """Bytes sent over all ranks by ``ring_attention``: (forward, backward).

    ``channels = heads × head_dim``; ``elsize`` is the byte size of q/k/v (accumulators of the
    backward are fp32: 4 bytes).
    """
    P, kv = len(areas), batch * sum(areas) * 2 * channels
    return (P - 1) * kv * elsize, (P - 1) * kv * (elsize + 4)
