"""The sharding validator's registry: each distributed op registers a check, and one judge.

A check is ``fn(mesh) -> list[Record]``, run on every rank of a spawned mesh. It compares the
sharded computation with the serial one (outputs, input gradients, weight gradients) and the
measured communication with the expected figure, and returns the same records on every rank.
Modules that register checks are listed in ``CHECK_MODULES``.

**The judge** (one definition, used by every check). Each compared tensor has three versions:
the sharded float32 result ``got``, the serial float32 result ``ref32`` and the serial result
in float64 ``ref64`` (the serial module and its inputs cast to double). ``compare`` records,
as maxima over the whole tensor (all ranks), ``sharded = max|got − ref64|``,
``serial = max|ref32 − ref64|`` and the size of the summed terms ``terms`` (by default
``max|ref64|``; checks that can price the terms, e.g. ``|X|·|W|`` for a matmul, pass them).
A float32 tensor passes when

    sharded ≤ NOISE_FACTOR · serial + FLOOR_ULPS · eps₃₂ · terms

i.e. the sharded result is no further from the exact answer than a small multiple of how far
the serial float32 computation itself is. A sharded sum only changes the order of the same
float32 roundings (blocks of a tile, then across ranks); its error is of the serial one's size
(the worst float32 case of all 130 on 2×3 and on 3×2, models included, reaches 0.26 of what
the judge allows: docs/core.md), so the factor 8 leaves room for the spread of a maximum over
few elements while a wrong term of relative size ~1e-5 or more fails. The floor only matters
when the serial float32 result is exact (copies, exchanges, tiny tensors): 16 ulps of the
terms. A true gradient of ~0 (terms cancelling) is judged by the serial noise, not by dividing
by ~0.

Reduced-precision cases (bf16 autocast) carry a ``tolerance``: each tensor's relative error
``sharded / max|ref64|`` must be at most it (the dtype's resolution times a few).

The figures a record reports (``error_*``, ``max_rel_error``) are relative to the reference's
scale: the largest error of the case's tensors over their largest reference value, never a tensor's
error over its own near-zero reference (a gradient that cancels to ~1e-17 would read as 1e8).
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

__all__ = [
    "BF16_TOLERANCE",
    "CHECK_MODULES",
    "ENSEMBLE_OPS",
    "FLOOR_ULPS",
    "NOISE_FACTOR",
    "Diff",
    "Record",
    "checks",
    "compare",
    "judge",
    "measure",
    "register",
    "run_checks",
]

CHECK_MODULES = [
    "jigsaw_earth.validation.core_checks",
    "jigsaw_earth.validation.layer_checks",
    "jigsaw_earth.validation.checks_attention",
    "jigsaw_earth.validation.checks_conv",
    "jigsaw_earth.validation.checks_dense",
    "jigsaw_earth.validation.checks_models",
    "jigsaw_earth.validation.checks_ensemble",
]
# the checks that run on meshes with an ensemble axis (the others check one lat x lon group)
ENSEMBLE_OPS = ("ensemble",)

EPS32 = torch.finfo(torch.float32).eps
NOISE_FACTOR = 8.0
FLOOR_ULPS = 16.0
BF16_TOLERANCE = 3e-2
Check = Callable[[DomainMesh], Iterator["Record"]]
_CHECKS: dict[str, Check] = {}


@dataclass
class Record:
    """One case of one op on one mesh.

    ``error_*``: the sharded result's error relative to the reference's scale: the largest
    |got − ref64| of any compared tensor over the largest |ref64| of them (forward: outputs and
    initial parameters; backward: input and parameter gradients), so a tensor whose true value is
    ~0 is not divided by ~0; ``serial_error_*``: the same for the serial float32 result;
    ``max_rel_error``: the larger of the two ``error_*``; ``judge_*``: the worst tensor's sharded
    error over what the judge allows (passes at ≤ 1). ``tolerance`` is set for reduced-precision
    cases only.
    """

    op: str
    mesh: str
    shape: str
    passed: bool = False
    max_rel_error: float = 0.0
    error_forward: float = 0.0
    error_backward: float = 0.0
    serial_error_forward: float = 0.0
    serial_error_backward: float = 0.0
    judge_forward: float = 0.0
    judge_backward: float = 0.0
    comm_bytes: int = 0
    expected_bytes: int | None = None
    seconds: float = 0.0
    tolerance: float | None = None
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


@dataclass(frozen=True)
class Diff:
    """One compared tensor on this rank: absolute maxima (see the module doc)."""

    sharded: float  # max |got − ref64|
    serial: float  # max |ref32 − ref64|
    magnitude: float  # max |ref64|
    terms: float  # size of the summed terms, for the floor


def _amax(t: torch.Tensor) -> float:
    return float(t.detach().abs().max()) if t.numel() else 0.0


def compare(
    got: torch.Tensor | None,
    ref64: torch.Tensor | None,
    ref32: torch.Tensor | None,
    terms: torch.Tensor | None = None,
) -> Diff:
    """This rank's figures for one tensor (``None`` everywhere: nothing to compare)."""
    if got is None and ref64 is None:
        return Diff(0.0, 0.0, 0.0, 0.0)
    if got is None or ref64 is None or ref32 is None or got.shape != ref64.shape:
        return Diff(float("inf"), 0.0, 0.0, 0.0)
    want = ref64.detach().double()
    magnitude = _amax(want)
    return Diff(
        _amax(got.detach().double() - want),
        _amax(ref32.detach().double() - want),
        magnitude,
        magnitude if terms is None else _amax(terms),
    )


def judge(d: Diff, tolerance: float | None = None) -> float:
    """The sharded error over what is allowed (≤ 1 passes); ``tolerance``: reduced precision."""
    if tolerance is not None:
        allowed = tolerance * d.magnitude
    else:
        allowed = NOISE_FACTOR * d.serial + FLOOR_ULPS * EPS32 * d.terms
    if allowed > 0:
        return d.sharded / allowed
    return 0.0 if d.sharded == 0 else float("inf")


def _world_max(diffs: list[Diff]) -> list[Diff]:
    """Each tensor's figures as maxima over all ranks (every rank lists the same tensors)."""
    if not dist.is_initialized() or not diffs:
        return diffs
    t = torch.tensor([[d.sharded, d.serial, d.magnitude, d.terms] for d in diffs], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [Diff(*row) for row in t.tolist()]


def _world_sum(value: int) -> int:
    if not dist.is_initialized():
        return value
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t)
    return int(t.item())


def _rel(error: float, magnitude: float) -> float:
    return error / magnitude if magnitude > 0 else (0.0 if error == 0 else float("inf"))


def _scaled(diffs: list[Diff], error: Callable[[Diff], float]) -> float:
    """The largest ``error`` of ``diffs`` over the largest reference magnitude among them."""
    if not diffs:
        return 0.0
    return _rel(max(error(d) for d in diffs), max(d.magnitude for d in diffs))


def measure(
    record: Record,
    forward: list[Diff],
    backward: list[Diff],
    bytes_sent: int,
    labels: list[str] | None = None,
) -> Record:
    """Judge this rank's tensors (reduced over all ranks) and sum the bytes sent by every rank.

    ``labels`` name the ``backward`` tensors: the worst one is reported in ``extra``."""
    for d in (*forward, *backward):
        if not isinstance(d, Diff):
            raise TypeError(f"measure takes Diff values from compare(), got {type(d).__name__}: {d!r}")
    diffs = _world_max([*forward, *backward])
    fwd, bwd = diffs[: len(forward)], diffs[len(forward) :]
    record.error_forward = _scaled(fwd, lambda d: d.sharded)
    record.error_backward = _scaled(bwd, lambda d: d.sharded)
    record.serial_error_forward = _scaled(fwd, lambda d: d.serial)
    record.serial_error_backward = _scaled(bwd, lambda d: d.serial)
    record.judge_forward = max((judge(d, record.tolerance) for d in fwd), default=0.0)
    record.judge_backward = max((judge(d, record.tolerance) for d in bwd), default=0.0)
    record.max_rel_error = max(record.error_forward, record.error_backward)
    if labels and bwd:
        ratios = [judge(d, record.tolerance) for d in bwd]
        record.extra["worst_backward"] = labels[ratios.index(max(ratios))]
    record.comm_bytes = _world_sum(bytes_sent)
    bytes_ok = record.expected_bytes is None or record.comm_bytes == record.expected_bytes
    record.passed = max(record.judge_forward, record.judge_backward) <= 1.0 and bytes_ok
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
