"""Channel MLP on token tiles: linear → activation → (dropout) → linear, as one distributed
pair (``distributed/pair.py``): ``fc1`` column-sharded and ``fc2`` row-sharded by the same hidden
split, one weight ring or one activation exchange for both products."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed.collectives import all_gather
from ..distributed.comm import comm_site
from ..distributed.matmul import Strategy
from ..distributed.pair import Drop, matmul_pair, pair_bytes, pair_strategy, pair_whole
from .base import Domain, fill_fan_in_, sharded_parameter
from .cost import Cost
from .dropout import Dropout
from .replicas import Replicating

__all__ = ["ACTIVATIONS", "MLP", "activation_grad", "get_activation"]


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_tanh": _gelu_tanh,
    "relu": F.relu,
    "silu": F.silu,
    "tanh": torch.tanh,
    "identity": _identity,
}


def get_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The elementwise activation called ``name`` (elementwise, so it needs no sharding rule)."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"activation {name!r}: use one of {sorted(ACTIVATIONS)}") from None


_GRADS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "gelu": lambda dh, z: torch.ops.aten.gelu_backward(dh, z),
    "gelu_tanh": lambda dh, z: torch.ops.aten.gelu_backward(dh, z, approximate="tanh"),
    "relu": lambda dh, z: dh * (z > 0),
    "identity": lambda dh, z: dh,
}


def activation_grad(name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``(dh, z) -> dz``: the backward of activation ``name`` at its input ``z`` (torch's own
    kernels where they exist, else autograd through the activation)."""
    if name in _GRADS:
        return _GRADS[name]
    act = get_activation(name)

    def by_autograd(dh: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            leaf = z.detach().requires_grad_()
            return torch.autograd.grad(act(leaf), leaf, dh)[0]

    return by_autograd


class PairBlock(nn.Module):
    """The weight ``(in, out)`` and bias of one product of an MLP pair, sharded by the pair's
    hidden split: ``fc1`` by columns, ``fc2`` by rows (its bias by its output columns). Only
    parameters: the ``MLP`` applies and prices them."""

    jigsaw_layer = True

    def __init__(self, domain: Domain, in_features: int, out_features: int, rows: bool):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        start, stop = domain.split(in_features if rows else out_features)
        self.weight = sharded_parameter((in_features, out_features), 0 if rows else 1, start, stop)
        self.bias = sharded_parameter((out_features,), 0, *domain.split(out_features))
        self.reset_parameters()

    def reset_parameters(self, seed: int = 0, key: str = "linear") -> None:
        """``torch.nn.Linear``'s default, as ``Linear``: the same values in either layout."""
        fill_fan_in_(self.weight, self.bias, seed, key, self.in_features)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, shard {tuple(self.weight.shape)}"


class MLP(Replicating, nn.Module):
    """``fc2(dropout(act(fc1(x))))`` on a token tile ``(B, h, w, in_features)``.

    Canonical weights ``fc1.weight (in, hidden)`` and ``fc2.weight (hidden, out)`` (the transpose
    of ``torch.nn.Linear.weight``); each rank holds ``fc1``'s columns and ``fc2``'s rows of its
    hidden block (``PairBlock``), so no rank holds a full matrix, and ``matmul_pair`` moves the
    weights or the activations, whichever is fewer bytes (``strategy``). Dropout is applied
    inside the pair with ``Dropout``'s mesh-invariant mask.
    """

    jigsaw_layer = True

    def __init__(
        self,
        domain: Domain,
        in_features: int,
        hidden: int,
        out_features: int | None = None,
        activation: str = "gelu",
        dropout: float = 0.0,
        strategy: Strategy = "auto",
    ):
        super().__init__()
        out_features = in_features if out_features is None else out_features
        self.domain, self.in_features, self.hidden, self.out_features = (
            domain,
            in_features,
            hidden,
            out_features,
        )
        self.activation, self.strategy = activation, strategy
        self.act, self.act_grad = get_activation(activation), activation_grad(activation)
        # geometry read once here: forward touches no cached_property (torch.compile-friendly)
        self.hid_sizes, self.out_sizes = domain.split_sizes(hidden), domain.split_sizes(out_features)
        self._tiles = domain.grid.tiles()
        self.fc1 = PairBlock(domain, in_features, hidden, rows=False)
        self.drop = Dropout(domain, dropout, layout="tokens") if dropout > 0 else None
        self.fc2 = PairBlock(domain, hidden, out_features, rows=True)
        self.reset_parameters()

    def reset_parameters(self, seed: int = 0, key: str = "mlp") -> None:
        """Distinct keys per sub-layer (``init_model`` re-keys them by module path, same result)."""
        self.fc1.reset_parameters(seed, f"{key}.fc1")
        self.fc2.reset_parameters(seed, f"{key}.fc2")
        if self.drop is not None:
            self.drop.reset_parameters(seed, f"{key}.drop")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[-1] != self.in_features:
            raise ValueError(f"MLP expects a token tile (B, h, w, {self.in_features}), got {tuple(x.shape)}")
        batch = x.shape[0]
        replica = self.replica()
        if replica is not None and self._dropout(batch, x.device) is None:  # a forecast: no message
            return pair_whole(x.reshape(-1, self.in_features), *replica, self.act).reshape(
                *x.shape[:-1], self.out_features
            )
        counts = tuple(batch * t.shape[0] * t.shape[1] for t in self._tiles)
        y = matmul_pair(
            x.reshape(-1, self.in_features), self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias,
            self.domain.axis, self.hid_sizes, self.out_sizes, counts, self.act, self.act_grad, self.strategy,
            self._dropout(batch, x.device),
        )  # fmt: skip
        return y.reshape(*x.shape[:-1], self.out_features)

    def gather_replica(self) -> tuple[torch.Tensor, ...]:
        """The whole ``W1``, ``b1``, ``W2``, ``b2`` (``replicas.py``; collective)."""
        axis, hid = self.domain.axis, self.hid_sizes
        with comm_site("MLP.replica"):
            return (
                all_gather(self.fc1.weight, axis, 1, hid),
                all_gather(self.fc1.bias, axis, 0, hid),
                all_gather(self.fc2.weight, axis, 0, hid),
                all_gather(self.fc2.bias, axis, 0, self.out_sizes),
            )

    def replica_numel(self) -> int:
        return (self.in_features + 1 + self.out_features) * self.hidden + self.out_features

    def _dropout(self, batch: int, device: torch.device) -> Drop:
        """The factor ``keep / (1 - p)`` of any rank's tokens and hidden block, or None."""
        drop = self.drop
        if drop is None or not self.training:
            return None
        scale = 0.0 if drop.p == 1.0 else 1.0 / (1.0 - drop.p)

        def factor(rank: int, start: int, stop: int) -> torch.Tensor:
            keep = drop.block_mask(self._tiles[rank], batch, start, stop, self.hidden, device)
            return keep.to(torch.float32) * scale

        return factor

    def cost(self, batch: int, elsize: int = 4, input_grad: bool = True) -> Cost:
        """``matmul_pair``: its bytes, FLOPs (``dX`` when the input needs it), the rows and the
        hidden pre- and post-activation blocks it saves, and its peak (the output and, moving
        weights, two messages in flight; moving activations, the peers' rows and partial sums)."""
        counts, q = self.domain.counts(batch), self.domain.index
        P, n, N = len(counts), counts[q], sum(counts)
        cin, cout, hid, hid_q = self.in_features, self.out_features, self.hidden, self.hid_sizes[q]
        chosen = pair_strategy(self.strategy, counts, cin, self.hid_sizes, self.out_sizes, True, input_grad)
        weights = chosen == "weights" or P == 1
        rows, block = (n, hid) if weights else (N, hid_q)
        fwd = 2 * rows * block * (cin + cout)
        bwd = 2 * fwd if input_grad else 2 * fwd - 2 * rows * block * cin
        message = max(cin * h + h + h * cout + o for h, o in zip(self.hid_sizes, self.out_sizes, strict=True))
        if weights:
            peak = n * cout + n * cin + (2 * message if P > 1 else 0)
        else:
            peak = 2 * n * cout + (P - 1) * n * cout + max(counts) * (cin + cout) * 2
        return Cost(
            bytes={"mlp": pair_bytes(chosen, counts, cin, self.hid_sizes, self.out_sizes, elsize, input_grad)}
            if P > 1
            else {},
            flops=(fwd, bwd),
            saved=(n * cin + 2 * rows * block) * elsize,
            peak=peak * elsize,
            overlap={"mlp"},
        )

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.hidden} -> {self.out_features}, {self.activation}"
