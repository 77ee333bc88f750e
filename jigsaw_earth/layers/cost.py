"""What one training step of a layer costs, as each layer declares it beside its forward.

Every jigsaw layer has ``cost(batch, elsize=4, input_grad=True) -> Cost``: the bytes its code
path sends (summed over all ranks of the domain group, forward and backward: the figures the
comm ledger measures), the FLOPs and activation bytes of *this* rank, and whether its messages
overlap its compute. A layer prices only itself, never its jigsaw children; ``model_cost`` walks
a model and sums. ``model summary``, ``plan`` and the validator's byte check all read these
declarations, so a layer's cost is written once.

``input_grad``: whether the layer's input needs a gradient (the model's first layer does not
in training: its backward sends nothing for ``dX``). ``elsize``: bytes per element of the
compute dtype (4 fp32, 2 under bf16 autocast).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from torch import nn

from ..distributed.comm import ring_bytes
from ..distributed.halo import Window
from ..distributed.halo import _receive_plan as receive_plan  # the plan the exchange itself uses
from ..distributed.matmul import channel_bytes, channel_strategy
from ..distributed.tiles import TileGrid

__all__ = [
    "Bytes",
    "Cost",
    "all_reduce_bytes",
    "channel_matmul",
    "gather_bytes",
    "model_cost",
    "priced_layers",
    "step_bytes",
    "unpriced_layers",
    "window_bytes",
]

Bytes = tuple[int, int]  # (forward, backward)


@dataclass
class Cost:
    """One layer's training step. ``bytes``: ``{op: (forward, backward)}`` over all ranks;
    ``flops``: this rank's (forward, backward); ``saved``: activation bytes this rank keeps for
    the backward; ``peak``: transient bytes above them at the layer's highest point (forward or
    backward); ``overlap``: the ops whose messages travel while the layer computes (the weight
    ring, the token-form matmul, ring attention); the others (halos, gathers) come first."""

    bytes: dict[str, Bytes] = field(default_factory=dict)
    flops: Bytes = (0, 0)
    saved: int = 0
    peak: int = 0
    overlap: set[str] = field(default_factory=set)

    @property
    def sent(self) -> int:
        return sum(f + b for f, b in self.bytes.values())

    def __add__(self, other: Cost) -> Cost:
        ops = dict(self.bytes)
        for op, (f, b) in other.bytes.items():
            f0, b0 = ops.get(op, (0, 0))
            ops[op] = (f0 + f, b0 + b)
        return Cost(
            ops,
            (self.flops[0] + other.flops[0], self.flops[1] + other.flops[1]),
            self.saved + other.saved,
            max(self.peak, other.peak),
            self.overlap | other.overlap,
        )


def window_bytes(
    grid: TileGrid, windows: Sequence[Window], lat_mode: str, lon_mode: str, elements: int, elsize: int
) -> Bytes:
    """Cells each rank receives from other ranks for its window, × ``elements`` per cell; the
    backward sends the same cells' gradients back."""
    cells = 0
    for k, window in enumerate(windows):
        cells += sum(b.numel for b in receive_plan(grid, tuple(window), lat_mode, lon_mode) if b.src != k)
    n = cells * elements * elsize
    return n, n


def gather_bytes(sizes: Sequence[int], n: int, elsize: int) -> Bytes:
    """All-gather of ``n`` stacked vectors split in ``sizes``; backward reduce-scatters as much."""
    if len(sizes) == 1:
        return 0, 0
    total = sum(sizes)
    moved = sum(n * (total - s) for s in sizes) * elsize
    return moved, moved


def all_reduce_bytes(ranks: int, nbytes: int) -> int:
    """A ring all-reduce of ``nbytes`` per rank: all ``ranks`` together (``comm.ring_bytes`` each)."""
    return ranks * ring_bytes("all_reduce", nbytes, ranks)


def priced_layers(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``(path, module)`` of every module that declares a ``cost``, in registration order."""
    for path, module in model.named_modules():
        if callable(getattr(module, "cost", None)):
            yield path, module


def unpriced_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Modules holding parameters that neither declare a ``cost`` nor sit inside a module that does.

    Their FLOPs, activations and traffic would be missing from a plan; ``plan`` refuses them by
    name. (A parameter-free torch op — a ``torch.mean`` in ``forward`` — is invisible here: it is
    priced at zero, and ``validate --model`` is what finds a wrong one.)
    """
    priced = [path for path, _ in priced_layers(model)]
    found = []
    for path, module in model.named_modules():
        if not any(True for _ in module.parameters(recurse=False)) or callable(getattr(module, "cost", None)):
            continue
        if not any(path.startswith(f"{p}.") or p == "" for p in priced):
            found.append((path, module))
    return found


def model_cost(model: nn.Module, batch: int, elsize: int = 4, input_grad: bool = True) -> dict[str, Cost]:
    """``{path: Cost}`` of every priced module of ``model``. ``input_grad=False``: the model's
    input needs no gradient (training), so the layer that reads it (the model's ``input_layer``
    path) computes and sends nothing for its ``dX``."""
    first = None if input_grad else getattr(model, "input_layer", None)
    return {path: m.cost(batch, elsize, path != first) for path, m in priced_layers(model)}


def channel_matmul(
    strategy: str,
    counts: Sequence[int],
    index: int,
    cin: int,
    out_sizes: Sequence[int],
    bias: bool,
    elsize: int,
    input_grad: bool,
    op: str,
) -> Cost:
    """``matmul_channels`` of this rank's ``counts[index]`` rows: the bytes of the strategy it
    runs, its FLOPs (``dW`` always, ``dX`` when the input needs it), the input rows it saves,
    and its peak: the output built from ``P`` pieces (twice the output), and in the backward
    ``dY`` with ``dX``; moving weights adds two weight blocks in flight, moving activations
    the peers' rows and ``dX`` partial sums in flight (sent and received)."""
    P, n, cout = len(counts), counts[index], sum(out_sizes)
    chosen = channel_strategy(strategy, counts, cin, out_sizes, bias, True, input_grad)
    fwd = 2 * n * cin * cout if chosen == "weights" or P == 1 else 2 * sum(counts) * cin * out_sizes[index]
    dx = n * cin if input_grad else 0
    block = max(out_sizes)
    if P == 1:
        peak = max(n * cout, n * cout + dx)
    elif chosen == "weights":
        peak = max(2 * n * cout, n * cout + dx) + 2 * (cin + 1) * block
    else:
        forward = n * cin + 2 * n * cout + (P - 1) * n * block
        peak = max(forward, n * cout + (2 * P - 1) * dx + 2 * n * (cin + block))
    return Cost(
        bytes={op: channel_bytes(chosen, counts, cin, out_sizes, bias, elsize, input_grad)} if P > 1 else {},
        flops=(fwd, fwd * (2 if input_grad else 1)),
        saved=n * cin * elsize,
        peak=peak * elsize,
        overlap={op},
    )


def step_bytes(module: nn.Module, batch: int, elsize: int = 4, input_grad: bool = True) -> Bytes:
    """(forward, backward) bytes over all ranks of ``module`` and its children, as declared."""
    costs = model_cost(module, batch, elsize, input_grad).values()
    pairs = [fb for c in costs for fb in c.bytes.values()]
    return sum(f for f, _ in pairs), sum(b for _, b in pairs)
