"""Bytes sent by torch's own collectives, counted where they are called, as per-rank ring volumes.

The ring formulas (bytes one rank sends, ``P`` ranks in the group, ``n`` bytes):

* all-reduce of an ``n``-byte tensor: ``2 (P − 1) / P · n``;
* all-gather into an ``n``-byte output, reduce-scatter of an ``n``-byte input: ``(P − 1) / P · n``.

Three places see the collectives of the strategies compared in ``bench strategies``:

* ``ddp_counting_hook``: a DDP communication hook that counts each gradient bucket, then calls
  torch's default ``allreduce_hook``;
* ``CountFunctional``: a dispatch mode that sees the functional collectives (``_c10d_functional``)
  that DTensor (tensor parallelism) issues, forward and backward;
* ``count_c10d``: wraps ``torch.distributed``'s all-gather / reduce-scatter / all-reduce
  functions (what FSDP2 and jigsaw's data-parallel gradient sum call) for the duration of a block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.utils._python_dispatch import TorchDispatchMode

from ..distributed.comm import ring_bytes

__all__ = ["CommCount", "CountFunctional", "count_c10d", "ddp_counting_hook", "ring_bytes"]


@dataclass
class CommCount:
    """Per-rank bytes sent (ring volumes) and calls, by collective kind."""

    bytes_sent: int = 0
    calls: int = 0

    def add(self, kind: str, nbytes: int, ranks: int) -> None:
        self.bytes_sent += ring_bytes(kind, nbytes, ranks)
        self.calls += 1

    def reset(self) -> None:
        self.bytes_sent = self.calls = 0


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def ddp_counting_hook(count, bucket):  # no annotations: DDP checks them, and these would be strings
    """DDP comm hook: count the bucket's all-reduce (a ``dist.GradBucket``), then run torch's
    default all-reduce."""
    count.add("all_reduce", _nbytes(bucket.buffer()), dist.get_world_size())
    return allreduce_hook(None, bucket)


_FUNCTIONAL = {
    "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
}


class CountFunctional(TorchDispatchMode):
    """Counts ``torch.ops._c10d_functional`` collectives run inside the mode (DTensor's)."""

    def __init__(self, count: CommCount):
        super().__init__()
        self.count = count

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kind = (
            _FUNCTIONAL.get(func._schema.name.split("::")[-1])
            if func.namespace == "_c10d_functional"
            else None
        )
        if kind is not None:
            group = dist.distributed_c10d._resolve_process_group(args[-1])
            ranks = dist.get_world_size(group)
            gathered = ranks if kind == "all_gather" else 1  # all-gather: the output is P inputs
            self.count.add(kind, _nbytes(args[0]) * gathered, ranks)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def count_c10d(count: CommCount) -> Iterator[None]:
    """Count ``dist.all_gather_single / reduce_scatter_single / all_reduce`` (and the ``_tensor``
    variants) called inside the block; each still runs unchanged."""
    names = {  # function: (kind, position and keyword of the tensor whose size counts)
        "all_gather_single": ("all_gather", 0, "output_tensor"),
        "all_gather_into_tensor": ("all_gather", 0, "output_tensor"),
        "reduce_scatter_single": ("reduce_scatter", 1, "input"),
        "reduce_scatter_tensor": ("reduce_scatter", 1, "input"),
        "all_reduce": ("all_reduce", 0, "tensor"),
    }
    saved = {n: getattr(dist, n) for n in names if hasattr(dist, n)}

    def wrap(name: str, fn):
        kind, pos, key = names[name]

        def counted(*args, **kwargs):
            t = args[pos] if len(args) > pos else kwargs[key]
            count.add(kind, _nbytes(t), dist.get_world_size(kwargs.get("group")))
            return fn(*args, **kwargs)

        return counted

    try:
        for n, fn in saved.items():
            setattr(dist, n, wrap(n, fn))
        yield
    finally:
        for n, fn in saved.items():
            setattr(dist, n, fn)
