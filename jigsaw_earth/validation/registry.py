"""The sharding validator's registry: each distributed op registers a check.

A check is ``fn(mesh) -> list[Record]``, run on every rank of a spawned mesh. It compares the
sharded computation with the serial one (outputs, input gradients, weight gradients) and the
measured communication with the expected figure, and returns the same records on every rank.
Modules that register checks are listed in ``CHECK_MODULES``.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist

from ..distributed.comm import ledger
from ..distributed.mesh import DomainMesh

__all__ = ["CHECK_MODULES", "Record", "checks", "measure", "register", "rel_error", "run_checks"]

CHECK_MODULES = [
    "jigsaw_earth.validation.core_checks",
    "jigsaw_earth.validation.layer_checks",
    "jigsaw_earth.validation.checks_attention",
    "jigsaw_earth.validation.checks_conv",
    "jigsaw_earth.validation.checks_dense",
    "jigsaw_earth.validation.checks_models",
]

TOLERANCE = 1e-5
Check = Callable[[DomainMesh], Iterator["Record"]]
_CHECKS: dict[str, Check] = {}


@dataclass
class Record:
    """One case of one op on one mesh. Errors are max |sharded − serial| / max |serial|."""

    op: str
    mesh: str
    shape: str
    passed: bool = False
    max_rel_error: float = 0.0
    error_forward: float = 0.0
    error_backward: float = 0.0
    comm_bytes: int = 0
    expected_bytes: int | None = None
    seconds: float = 0.0
    tolerance: float = TOLERANCE
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def register(name: str) -> Callable[[Check], Check]:
    def wrap(fn: Check) -> Check:
        if name in _CHECKS:
            raise ValueError(f"validator op {name!r} registered twice")
        _CHECKS[name] = fn
        return fn

    return wrap


def checks() -> dict[str, Check]:
    for module in CHECK_MODULES:
        importlib.import_module(module)
    return dict(_CHECKS)


def rel_error(got: torch.Tensor | None, want: torch.Tensor | None) -> float:
    """Max absolute difference over max absolute reference value (0 when both are empty)."""
    if got is None or want is None:
        return 0.0 if got is None and want is None else float("inf")
    if got.shape != want.shape:
        return float("inf")
    if want.numel() == 0:
        return 0.0
    scale = want.detach().abs().max().clamp_min(1e-30)
    return float((got.detach().double() - want.detach().double()).abs().max() / scale)


def _world_reduce(values: list[float], op: dist.ReduceOp) -> list[float]:
    if not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=op)
    return t.tolist()


def measure(record: Record, errors_fwd: list[float], errors_bwd: list[float], bytes_sent: int) -> Record:
    """Fill a record from this rank's figures, reduced over all ranks (max errors, summed bytes)."""
    fwd, bwd = _world_reduce([max(errors_fwd, default=0.0), max(errors_bwd, default=0.0)], dist.ReduceOp.MAX)
    (total,) = _world_reduce([float(bytes_sent)], dist.ReduceOp.SUM)
    record.error_forward, record.error_backward = fwd, bwd
    record.max_rel_error = max(fwd, bwd)
    record.comm_bytes = int(total)
    bytes_ok = record.expected_bytes is None or record.comm_bytes == record.expected_bytes
    record.passed = record.max_rel_error <= record.tolerance and bytes_ok
    return record


def run_checks(mesh: DomainMesh, only: list[str] | None = None) -> list[dict]:
    """Run every registered check (or those named in ``only``) on this rank."""
    out = []
    for name, fn in checks().items():
        if only and not any(name.startswith(o) for o in only):
            continue
        start = time.perf_counter()
        for record in fn(mesh):
            record.seconds = round(time.perf_counter() - start, 3)
            out.append(record.as_dict())
            start = time.perf_counter()
    ledger.reset()
    return out
