"""Fused attention kernels for one (query block, key block) pair that also return the log-sum-exp.

Ring attention merges the partial results of key blocks exactly through each block's
log-sum-exp, and its backward hands every block the *global* output and log-sum-exp. The
kernels below are the aten ops behind ``F.scaled_dot_product_attention`` (those PyTorch's own
context-parallel ring attention calls), chosen by device, dtype and head size:

========================  ======================================================  ============
kernel                    aten op (+ ``_backward``)                                when
========================  ======================================================  ============
``flash_cpu``             ``_scaled_dot_product_flash_attention_for_cpu``          CPU, float
``flash_cuda``            ``_scaled_dot_product_flash_attention``                  CUDA fp16/bf16
``efficient_cuda``        ``_scaled_dot_product_efficient_attention``              CUDA otherwise
``math``                  explicit matmuls, fp32 scores of one block               anything else
========================  ======================================================  ============

The CUDA kernels are used when ``torch.backends.cuda.can_use_*_attention`` accepts the block and
the head size is a multiple of 8 (the ops themselves do not pad it, ``F.scaled_dot_product_attention``
does). ``math`` is the fallback (other devices, CUDA head sizes it cannot take): it holds one
``n_q × n_k`` fp32 score tile, which ``ring_attention(block=...)`` bounds.

Every kernel: ``forward(q, k, v, scale) → (out, lse, aux)`` with ``out`` in ``q``'s dtype and
``lse`` fp32 ``(B, heads, n_q)``; ``backward(dout, q, k, v, out, lse, aux, scale) → (dq, dk, dv)``
where ``out``/``lse`` may be the global (merged) ones: the gradient of this block's share.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["KERNELS", "AttentionKernel", "select_kernel"]

log = logging.getLogger(__name__)
aten = torch.ops.aten


class AttentionKernel:
    """The explicit-matmul kernel (``math``); the fused kernels override both methods."""

    name = "math"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
        s = torch.matmul(q, k.transpose(-1, -2)).float().mul_(scale)
        lse = torch.logsumexp(s, dim=-1)
        p = s.sub_(lse.unsqueeze(-1)).exp_()
        return torch.matmul(p.to(v.dtype), v).to(q.dtype), lse, None

    def backward(self, dout, q, k, v, out, lse, aux: Any, scale: float):
        delta = (dout.float() * out.float()).sum(-1, keepdim=True)
        p = torch.matmul(q, k.transpose(-1, -2)).float().mul_(scale).sub_(lse.unsqueeze(-1)).exp_()
        dv = torch.matmul(p.to(dout.dtype).transpose(-1, -2), dout)
        ds = torch.matmul(dout, v.transpose(-1, -2)).float().sub_(delta).mul_(p).mul_(scale).to(q.dtype)
        return torch.matmul(ds, k), torch.matmul(ds.transpose(-1, -2), q), dv


class _FlashCPU(AttentionKernel):
    name = "flash_cpu"

    def forward(self, q, k, v, scale):
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, scale=scale)
        return out, lse, None

    def backward(self, dout, q, k, v, out, lse, aux, scale):
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, k, v, out, lse, 0.0, False, scale=scale
        )


class _FlashCUDA(AttentionKernel):
    name = "flash_cuda"

    def forward(self, q, k, v, scale):
        out, lse, cum_q, cum_k, _, _, seed, offset, _ = aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, False, False, scale=scale
        )
        return out, lse, (cum_q, cum_k, seed, offset)

    def backward(self, dout, q, k, v, out, lse, aux, scale):
        cum_q, cum_k, seed, offset = aux
        return aten._scaled_dot_product_flash_attention_backward(
            dout, q, k, v, out, lse.contiguous(), cum_q, cum_k, q.shape[2], k.shape[2], 0.0, False,
            seed, offset, scale=scale,
        )  # fmt: skip


class _EfficientCUDA(AttentionKernel):
    """Memory-efficient attention; its log-sum-exp is padded to a multiple of 32 queries."""

    name = "efficient_cuda"

    def forward(self, q, k, v, scale):
        out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(
            q, k, v, None, True, 0.0, False, scale=scale
        )
        return out, lse.narrow(-1, 0, q.shape[2]), (seed, offset, lse.shape[-1])

    def backward(self, dout, q, k, v, out, lse, aux, scale):
        seed, offset, padded = aux
        lse = F.pad(lse, (0, padded - lse.shape[-1])).contiguous()
        dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
            dout, q, k, v, None, out, lse, seed, offset, 0.0, [True, True, True, False], False, scale=scale
        )
        return dq, dk, dv


KERNELS: dict[str, AttentionKernel] = {
    k.name: k for k in (_FlashCPU(), _FlashCUDA(), _EfficientCUDA(), AttentionKernel())
}
_CPU_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _cuda_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    if q.shape[-1] % 8:
        return "math"
    from torch.backends.cuda import SDPAParams, can_use_efficient_attention, can_use_flash_attention

    params = SDPAParams(q, k, v, None, 0.0, False, False)
    if q.dtype in (torch.float16, torch.bfloat16) and can_use_flash_attention(params):
        return "flash_cuda"
    if can_use_efficient_attention(params):
        return "efficient_cuda"
    return "math"


def select_kernel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, name: str | None = None
) -> AttentionKernel:
    """The kernel for blocks like ``q, k, v``: ``name`` (a key of ``KERNELS``) or chosen by device,
    dtype and head size (see the module docstring)."""
    if name is None:
        if q.device.type == "cpu":
            name = "flash_cpu" if q.dtype in _CPU_DTYPES else "math"
        elif q.device.type == "cuda":
            name = _cuda_kernel(q, k, v)
        else:
            name = "math"
    if name not in KERNELS:
        raise ValueError(f"attention kernel {name!r} is unknown; choose one of {sorted(KERNELS)}")
    if name == "math":
        log.debug("attention: explicit-matmul kernel for %s %s head_dim %d", q.device, q.dtype, q.shape[-1])
    return KERNELS[name]
