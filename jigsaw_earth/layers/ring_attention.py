"""Exact softmax attention over tokens sharded across the domain ranks: ring attention.

Rank ``q`` holds the queries, keys and values of its own tokens, ``(B, heads, n_q, d)``. The
key/value blocks travel once around the domain axis (send to the next rank, receive from the
previous; one message ``stack([k, v])``). Each block goes through one fused attention kernel
(``attention_kernels``: the flash kernel on CPU, flash or memory-efficient on CUDA) that returns
the block's output ``o_b`` and log-sum-exp ``lse_b``; blocks merge exactly, ``lse = log Σ_b
exp(lse_b)`` (float64, ``B·heads·n_q`` values) and ``o = Σ_b exp(lse_b − lse)·o_b`` (fp32), so no
rank holds a score matrix (``block`` splits an arriving block into several kernel calls). The
transfer of the next block is posted before the compute on the current one, so they overlap.
On one rank (``block`` and ``kernel`` unset) it is exactly ``F.scaled_dot_product_attention``.

Backward (a custom ``autograd.Function``) saves ``q, k, v``, the output and the log-sum-exp
(nothing of size tokens²). While the K/V blocks circulate a second time, each block goes through
the fused backward kernel with the *global* output and log-sum-exp, which gives exactly this
block's share of dQ, dK and dV. The dK/dV accumulator (fp32) of each block follows its block one
hop behind and, after a full circle, arrives back at the block's owner.

Bytes sent over all ranks, ``P`` ranks, ``N`` tokens per sample over all ranks, batch ``B``,
``C = heads × d`` channels, input element size ``e`` (``ring_attention_bytes``):

* forward: ``(P - 1) · B · N · 2C · e`` (each K/V block visits the ``P - 1`` other ranks);
* backward: ``(P - 1) · B · N · 2C · e`` (K/V again) ``+ (P - 1) · B · N · 2C · 4`` (dK/dV
  accumulators, kept in fp32 so that bf16 training sums its partial gradients exactly).

Merging and accumulators are fp32 (the log-sum-exp float64) whatever the input dtype; autocast is
switched off inside, and the kernels run in the dtype of ``q, k, v`` (bf16 under bf16 autocast,
so K/V messages are bf16 too).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F

from ..distributed.comm import Pending, comm_site, exchange, run_exchange
from ..distributed.mesh import Axis
from .attention_kernels import select_kernel

__all__ = ["ring_attention", "ring_attention_bytes"]

_KV, _ACC = 11, 12  # message tags: circulating K/V blocks, travelling dK/dV accumulators


def _pass_on(axis: Axis, t: torch.Tensor, recv_tokens: int, *, op: str, tag: int = _KV) -> Pending:
    """Send ``t`` (``[k, v]`` stacked, tokens in dim -2) to the next rank; receive one shaped like it
    with ``recv_tokens`` tokens from the previous rank. Does not wait."""
    shape = (*t.shape[:-2], recv_tokens, t.shape[-1])
    return exchange(
        axis, [(axis.peer(1), t)], [(axis.peer(-1), shape)], op=op, dtype=t.dtype, device=t.device, tag=tag
    )


def _chunks(kv: torch.Tensor, block: int | None) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """``(start, k, v)`` of each run of at most ``block`` key tokens of a stacked ``[k, v]`` block."""
    n = kv.shape[-2]
    step = n if block is None else max(1, block)
    for start in range(0, n, step):
        chunk = kv.narrow(-2, start, min(step, n - start))
        yield start, *chunk.unbind(0)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, axis, areas, scale, block, kernel):  # type: ignore[override]
        P, me = axis.size, axis.index
        kern = select_kernel(q, k, v, kernel)
        with torch.autocast(q.device.type, enabled=False):
            o = lse = aux = None
            cur = torch.stack([k, v.to(k.dtype)])
            for s in range(P):
                nxt = None
                if s < P - 1:
                    nxt = _pass_on(axis, cur, areas[(me - s - 1) % P], op="ring_attention")
                for _, kc, vc in _chunks(cur, block):
                    out_b, lse_b, aux = kern.forward(q, kc, vc, scale)
                    lse_b = lse_b.double()
                    if o is None:
                        o, lse = out_b.float(), lse_b
                    else:  # exact merge: o = Σ_b exp(lse_b − lse)·o_b, lse = log Σ_b exp(lse_b)
                        new = torch.logaddexp(lse, lse_b)
                        o.mul_(torch.exp(lse - new).float().unsqueeze(-1))
                        o.addcmul_(out_b, torch.exp(lse_b - new).float().unsqueeze(-1))
                        lse = new
                if nxt is not None:
                    cur = nxt.wait()[0]
            out, lse = o.to(q.dtype), lse.float()  # type: ignore[union-attr]
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (axis, areas, scale, block, kern, aux)
        return out

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        axis, areas, scale, block, kern, aux = ctx.args
        P, me = axis.size, axis.index
        with torch.autocast(q.device.type, enabled=False):
            dout = dout.to(q.dtype)
            if dout.stride(-1) != 1:
                dout = dout.contiguous()
            dq = None
            cur = torch.stack([k, v.to(k.dtype)])
            own = acc_in = None
            for s in range(P):
                nxt = None
                if s < P - 1:
                    nxt = _pass_on(axis, cur, areas[(me - s - 1) % P], op="ring_attention.backward")
                part = torch.empty(cur.shape, dtype=torch.float32, device=q.device)
                for start, kc, vc in _chunks(cur, block):
                    # the global out and lse make this block's share of the gradient exact
                    dq_b, dk_b, dv_b = kern.backward(dout, q, kc, vc, out, lse, aux, scale)
                    dq = dq_b.float() if dq is None else dq.add_(dq_b)
                    stop = start + kc.shape[2]
                    part[0, :, :, start:stop] = dk_b
                    part[1, :, :, start:stop] = dv_b
                if s == 0:
                    own = part
                else:
                    if acc_in is not None:
                        part += acc_in.wait()[0]
                    # after the last step this receives the finished accumulator of our own block
                    nxt_acc = areas[(me - s - 1) % P]
                    acc_in = _pass_on(axis, part, nxt_acc, op="ring_attention.backward.grad", tag=_ACC)
                if nxt is not None:
                    cur = nxt.wait()[0]
            dkv = own if acc_in is None else own.add_(acc_in.wait()[0])  # type: ignore[union-attr]
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None, None  # type: ignore


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    axis: Axis,
    areas: Sequence[int],
    scale: float | None = None,
    block: int | None = None,
    *,
    kernel: str | None = None,
) -> torch.Tensor:
    """``softmax(q·kᵀ·scale)·v`` over the tokens of all ranks along ``axis``.

    ``q, k, v``: ``(B, heads, n, d)`` with ``n = areas[axis.index]``, this rank's tokens per
    sample; ``areas[k]`` is rank ``k``'s count (uneven allowed). ``scale`` defaults to
    ``d ** -0.5``; ``block`` caps the key tokens per kernel call (the ``math`` kernel's score tile
    is ``n × block``). ``kernel`` forces a block kernel of ``attention_kernels.KERNELS`` (default:
    chosen by device, dtype and head size). Inputs are cast to the autocast dtype when autocast is
    on (else to their common dtype); returns this rank's output tokens ``(B, heads, n, d)`` in
    that dtype. On one rank with ``block`` and ``kernel`` unset this is exactly
    ``F.scaled_dot_product_attention``.
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
    if axis.size == 1 and block is None and kernel is None:
        return F.scaled_dot_product_attention(q, k, v, scale=scale)
    args = (q, k, v, axis, tuple(areas), scale, block, kernel)
    with comm_site("ring_attention"):
        if axis.size == 1:  # blocked, or a chosen kernel, on one rank: nothing moves
            return _RingAttention.apply(*args)
        return run_exchange(_RingAttention.apply, *args)


def ring_attention_bytes(areas: Sequence[int], batch: int, channels: int, elsize: int = 4) -> tuple[int, int]:
    """Bytes sent over all ranks by ``ring_attention``: (forward, backward).

    ``channels = heads × head_dim``; ``elsize`` is the byte size of q/k/v (accumulators of the
    backward are fp32: 4 bytes).
    """
    P, kv = len(areas), batch * sum(areas) * 2 * channels
    return (P - 1) * kv * elsize, (P - 1) * kv * (elsize + 4)
