"""Check the ring attention's CUDA kernels on one GPU against F.scaled_dot_product_attention.

On one rank, ``ring_attention(..., block=B)`` splits the keys into blocks of ``B`` tokens and
merges them through their log-sum-exp exactly as the ring merges the blocks of other ranks, so
this exercises every CUDA kernel (forward, backward with the global output and log-sum-exp,
merging) without a second GPU. Prints one line per case and exits 1 if any case is off.

    python scripts/check_cuda_attention.py
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.layers.attention_kernels import KERNELS
from jigsaw_earth.layers.ring_attention import ring_attention


def _case(kernel: str, dtype: torch.dtype, tokens: int, head_dim: int, block: int) -> float:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(2, 4, tokens, head_dim, device="cuda", generator=gen, dtype=dtype).requires_grad_()
        for _ in range(3)
    )
    axis = DomainMesh(MeshShape()).domain
    dout = torch.randn(q.shape, device="cuda", generator=gen, dtype=dtype)
    out = ring_attention(q, k, v, axis, [tokens], block=block, kernel=kernel)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qd, kd, vd)
    ref_grads = torch.autograd.grad(ref, (qd, kd, vd), dout.double())
    errors = [
        ((got.double() - want).abs().max() / want.abs().max()).item()
        for got, want in zip((out, *grads), (ref, *ref_grads), strict=True)
    ]
    return max(errors)


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; kernels {sorted(KERNELS)}")
    failed = 0
    cases = [
        ("flash_cuda", torch.bfloat16, 2048, 64, 512, 2e-2),
        ("flash_cuda", torch.float16, 1000, 32, 300, 5e-3),
        ("efficient_cuda", torch.float32, 2048, 64, 512, 1e-5),
        ("efficient_cuda", torch.float32, 999, 32, 250, 1e-5),
        ("math", torch.float32, 1024, 40, 256, 1e-5),
        (None, torch.float32, 777, 36, 200, 1e-5),  # default choice for an odd head size
    ]
    for kernel, dtype, tokens, head_dim, block, tol in cases:
        err = _case(kernel, dtype, tokens, head_dim, block)
        ok = err <= tol
        failed += not ok
        print(
            f"{kernel or 'default':<15} {dtype!s:<15} tokens {tokens:>5} head_dim {head_dim:>3} "
            f"block {block:>4}: max rel error vs fp64 SDPA {err:.2e} (tol {tol:.0e}) {'ok' if ok else 'FAIL'}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
