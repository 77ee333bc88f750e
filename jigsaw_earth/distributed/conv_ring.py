"""Convolution (or transposed convolution) of a rank's input window with a ring of weight blocks.

Rank ``q`` holds the output-channel block ``q`` of the weight (and bias); every rank needs all
output channels of its own window. The blocks circulate in a ring, as in the channel form of
the distributed matmul (``matmul._ChannelWeights``, whose transport helpers this reuses): each
rank posts the transfer of the block in hand to its left neighbour, convolves its window with
that block (``F.conv2d`` / ``F.conv_transpose2d``, the native kernel), then waits for the next.
Backward circulates the blocks again for ``dX`` (``aten.convolution_backward``, input part) and
accumulates each block's ``dW`` (and ``db``) in a ring reduce-scatter that ends on the block's
owner; when the input needs no gradient, ``dX`` and its weight transfers are skipped.

A message is one block flattened, bias appended: ``out_k·(in·kh·kw + 1)`` values — exactly the
``(in·kh·kw + 1) × out_k`` column block that ``channel_bytes("weights", ...)`` prices. On one
rank this is a single ``F.conv2d`` / ``F.conv_transpose2d`` with plain autograd.

A **patch convolution** (stride = kernel tiling the window exactly: ``PatchEmbed``) on the CPU is
computed as GEMMs on the window's patch rows ``(b, i, j) × (c, u, v)`` instead, forward and
backward, on one rank too: oneDNN's convolution measured 2–7× slower than the GEMM there for the
weight gradient (the fewer output channels, the slower: 99 ms against 13 ms per block of
WeatherMixer ``small``'s embedding at 64 × 128 on 1×2). The output is then channels-last memory
seen as ``(B, out, h, w)``, as ``PatchEmbed`` returns it anyway. On a GPU the native convolution
is the faster (``device.patch_conv_as_gemm``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..device import patch_conv_as_gemm
from .comm import run_exchange
from .matmul import _RING, _as, _like, _send_recv, ring_backward
from .mesh import Axis

__all__ = ["ConvSpec", "conv_ring", "conv_whole"]

ConvSpec = tuple[tuple[int, int], tuple[int, int], bool]  # stride, dilation, transposed


def _conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, spec: ConvSpec) -> torch.Tensor:
    stride, dilation, transposed = spec
    if w.numel() == 0:  # a rank with no output channels (more ranks than channels)
        return x.new_empty(x.shape[0], 0, *_out_size(x, w, spec))
    if transposed:
        return F.conv_transpose2d(x, w, b, stride, dilation=dilation)
    return F.conv2d(x, w, b, stride, dilation=dilation)


def _out_size(x: torch.Tensor, w: torch.Tensor, spec: ConvSpec) -> tuple[int, int]:
    stride, dilation, transposed = spec
    sizes = []
    for n, k, s, d in zip(x.shape[-2:], w.shape[-2:], stride, dilation):
        sizes.append((n - 1) * s + d * (k - 1) + 1 if transposed else (n - d * (k - 1) - 1) // s + 1)
    return sizes[0], sizes[1]


def _block_shape(w: torch.Tensor, n: int, transposed: bool) -> tuple[int, ...]:
    """Shape of an output-channel block of ``n`` channels, given this rank's block ``w``."""
    return (w.shape[0], n, *w.shape[2:]) if transposed else (n, *w.shape[1:])


def _message(w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    flat = w.reshape(-1)
    return flat if b is None else torch.cat([flat, b.reshape(-1)])


def _unmessage(msg: torch.Tensor, shape: tuple[int, ...], bias: bool):
    """(weight block of ``shape``, bias block or None) as views of a message."""
    numel = math.prod(shape)
    return msg[:numel].view(shape), (msg[numel:] if bias else None)


def _msg_numel(w: torch.Tensor, n: int, bias: bool, transposed: bool) -> int:
    return math.prod(_block_shape(w, n, transposed)) + (n if bias else 0)


def _grad_input(dy, x, w, spec: ConvSpec) -> torch.Tensor:
    stride, dilation, transposed = spec
    return torch.ops.aten.convolution_backward(
        dy, x, w, None, stride, [0, 0], dilation, transposed, [0, 0], 1, (True, False, False)
    )[0]


def _is_patch(x: torch.Tensor, w: torch.Tensor, spec: ConvSpec) -> bool:
    """A non-overlapping patch convolution tiling ``x`` exactly (PatchEmbed): stride = kernel, on a
    device where its GEMM form is the faster (``device.patch_conv_as_gemm``)."""
    stride, dilation, transposed = spec
    kh, kw = w.shape[-2:]
    exact = x.shape[-2] % kh == 0 and x.shape[-1] % kw == 0
    patch = not transposed and tuple(stride) == (kh, kw) and tuple(dilation) == (1, 1) and exact
    return patch and patch_conv_as_gemm(x.device)


def _add_patch_grad(acc: torch.Tensor | None, dy: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``acc += dY·W`` for a patch convolution, rows ``(b, i, j)``, columns ``(c, u, v)``: one GEMM
    accumulating in place, where ``convolution_backward`` would need a temporary 3× ``dX``."""
    rows, cols = dy.permute(0, 2, 3, 1).reshape(-1, dy.shape[1]), w.reshape(w.shape[0], -1)
    return rows @ cols if acc is None else acc.addmm_(rows, cols)


def _patch_grad_field(acc: torch.Tensor, shape: tuple[int, ...], kernel: tuple[int, ...]) -> torch.Tensor:
    """The ``(B, C, H, W)`` field (of ``shape``) of ``_add_patch_grad``'s rows."""
    (b, c, h, w), (kh, kw) = shape, kernel
    return acc.view(b, h // kh, w // kw, c, kh, kw).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def _patch_rows(x: torch.Tensor, kernel: tuple[int, ...]) -> torch.Tensor:
    """``x`` ``(B, C, H, W)`` as the rows ``(b, i, j)`` × columns ``(c, u, v)`` of its patches
    (the inverse of ``_patch_grad_field``; one copy)."""
    (b, c, h, w), (kh, kw) = x.shape, kernel
    rows = b * (h // kh) * (w // kw)
    return x.view(b, c, h // kh, kh, w // kw, kw).permute(0, 2, 4, 1, 3, 5).reshape(rows, c * kh * kw)


def _patch_conv(rows: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """A patch convolution's ``(rows, out)`` output as one GEMM on the patch ``rows``."""
    wt = w.reshape(w.shape[0], math.prod(w.shape[1:])).t()
    return rows @ wt if b is None else torch.addmm(b, rows, wt)


def _patch_grad_weight(dy: torch.Tensor, rows: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The weight gradient ``dYᵀ·X`` of a patch convolution as one GEMM on the patch ``rows``:
    oneDNN's ``convolution_backward`` measured 2–7× slower for it (the fewer the output channels,
    the slower)."""
    return (dy.permute(1, 0, 2, 3).reshape(dy.shape[1], rows.shape[0]) @ rows).view(shape)


def _grad_weight(dy, x, shape: tuple[int, ...], spec: ConvSpec) -> torch.Tensor:
    stride, dilation, transposed = spec
    dummy = dy.new_empty(1).expand(shape)  # only the weight's shape is read
    return torch.ops.aten.convolution_backward(
        dy, x, dummy, None, stride, [0, 0], dilation, transposed, [0, 0], 1, (False, True, False)
    )[1]


class _ConvWeights(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, axis, out_sizes, spec):  # type: ignore[override]
        P, q = axis.size, axis.index
        bias, transposed = b is not None, spec[2]
        rows = _patch_rows(x, tuple(w.shape[-2:])) if _is_patch(x, w, spec) else None
        # a patch convolution's backward needs only its patch rows (as many bytes as x): kept, not redone
        ctx.save_for_backward(x if rows is None else rows, w, b)
        ctx.args = (axis, out_sizes, spec, tuple(x.shape))
        cur = _message(w, b)
        outs: list = [None] * P
        for s in range(P):
            k = (q + s) % P
            nxt = None
            if s < P - 1:
                n = _msg_numel(w, out_sizes[(k + 1) % P], bias, transposed)
                nxt = _send_recv(axis, -1, cur, 1, (n,), op="conv.weights", tag=_RING)
            wk, bk = _unmessage(cur, _block_shape(w, out_sizes[k], transposed), bias)
            outs[k] = _conv(x, wk, bk, spec) if rows is None else _patch_conv(rows, wk, bk)
            if nxt is not None:
                cur = nxt.wait()[0]
        if rows is None:
            return torch.cat(outs, dim=1)
        b_, _, h, w_ = x.shape
        kh, kw = w.shape[-2:]  # channels-last (B, h', w', O) as (B, O, h', w'): a view, as PatchEmbed wants
        return torch.cat(outs, dim=1).view(b_, h // kh, w_ // kw, sum(out_sizes)).permute(0, 3, 1, 2)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x0, w0, b0 = ctx.saved_tensors  # x0: the patch rows of a patch convolution
        x, w, b = _as(dy.dtype, x0, w0, b0)
        axis, out_sizes, spec, x_shape = ctx.args
        bias, transposed = b is not None, spec[2]
        need_dx = ctx.needs_input_grad[0]
        need_wb = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]  # a frozen weight: no dW ring
        dys = [d.contiguous() for d in dy.split(list(out_sizes), dim=1)]
        patch = x.dim() == 2  # the saved patch rows

        def add_dx(dx: torch.Tensor | None, k: int, msg: torch.Tensor) -> torch.Tensor | None:
            wk, _ = _unmessage(msg, _block_shape(w, out_sizes[k], transposed), bias)
            if not wk.numel():
                return dx
            if patch:
                return _add_patch_grad(dx, dys[k], wk)
            part = _grad_input(dys[k], x, wk, spec)
            return part if dx is None else dx.add_(part)

        def grad_part(k: int) -> torch.Tensor:
            shape = _block_shape(w, out_sizes[k], transposed)
            if not math.prod(shape):
                dw = dy.new_empty(shape)
            elif patch:
                dw = _patch_grad_weight(dys[k], x, shape)
            else:
                dw = _grad_weight(dys[k], x, shape, spec)
            return _message(dw, dys[k].sum((0, 2, 3)) if bias else None)

        dx, grad = ring_backward(
            axis,
            _message(w, b),
            lambda k: (_msg_numel(w, out_sizes[k], bias, transposed),),
            add_dx if need_dx else None,
            grad_part if need_wb else None,
            torch.add,
            "conv.weights.backward",
        )
        gw, gb = _unmessage(grad, tuple(w.shape), bias)
        gw, gb = (gw if ctx.needs_input_grad[1] else None), (gb if ctx.needs_input_grad[2] else None)
        if patch and dx is not None:
            dx = _patch_grad_field(dx, x_shape, tuple(w.shape[-2:]))
        if need_dx and dx is None:
            dx = x.new_zeros(x_shape)
        return _like(dx, x0), _like(gw, w0), _like(gb, b0), None, None, None


def conv_ring(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    axis: Axis,
    out_sizes: Sequence[int],
    stride: tuple[int, int],
    dilation: tuple[int, int] = (1, 1),
    transposed: bool = False,
) -> torch.Tensor:
    """Unpadded convolution of the window ``x`` with all output channels of a weight sharded
    over ``axis``: ``w`` is this rank's block (``(out_q, in, kh, kw)``, or ``(in, out_q, kh, kw)``
    when ``transposed``), ``out_sizes[k]`` rank ``k``'s number of output channels."""
    if w.shape[1 if transposed else 0] != out_sizes[axis.index]:
        raise ValueError(
            f"conv_ring: rank {axis.index} holds a weight block {tuple(w.shape)}, but out_sizes="
            f"{tuple(out_sizes)}"
        )
    spec: ConvSpec = (tuple(stride), tuple(dilation), transposed)  # type: ignore[assignment]
    if axis.size == 1:
        return conv_whole(x, w, b, stride, dilation, transposed)
    return run_exchange(_ConvWeights.apply, x, w, b, axis, tuple(out_sizes), spec)


def conv_whole(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, stride: tuple[int, int],
               dilation: tuple[int, int] = (1, 1), transposed: bool = False) -> torch.Tensor:  # fmt: skip
    """The unpadded convolution of the window ``x`` with a whole weight, no message: one rank's
    ``conv_ring``, and a forecast's on weights gathered once (``layers/replicas.py``)."""
    spec: ConvSpec = (tuple(stride), tuple(dilation), transposed)  # type: ignore[assignment]
    if _is_patch(x, w, spec):  # the GEMMs of the ring, differentiated by autograd
        kh, kw = w.shape[-2:]
        y = _patch_conv(_patch_rows(x, (kh, kw)), w, b)
        return y.view(x.shape[0], x.shape[2] // kh, x.shape[3] // kw, w.shape[0]).permute(0, 3, 1, 2)
    return _conv(x, w, b, spec)
