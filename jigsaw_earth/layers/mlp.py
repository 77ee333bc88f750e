"""Channel MLP on token tiles: Linear → activation → (dropout) → Linear.

Without dropout the two products run as one distributed pair (``distributed/pair.py``): ``fc1``
column-sharded, ``fc2`` row-sharded by the same hidden split, one weight ring or one activation
exchange for both. With dropout between them, two column-sharded jigsaw ``Linear`` layers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed.matmul import Strategy
from ..distributed.pair import matmul_pair, pair_bytes, pair_strategy
from .base import Domain, fill_fan_in_, sharded_parameter
from .cost import Cost
from .dropout import Dropout
from .linear import Linear

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


class MLP(nn.Module):
    """``fc2(dropout(act(fc1(x))))`` on a token tile ``(B, h, w, in_features)``.

    Canonical weights ``fc1.weight (in, hidden)`` and ``fc2.weight (hidden, out)``; each rank
    holds 1/N of each. Without dropout they are a pair (``PairBlock``: ``fc1``'s columns and
    ``fc2``'s rows of the rank's hidden block) run by ``matmul_pair``; with dropout, two jigsaw
    ``Linear`` layers (column blocks). Either moves weights or activations, whichever is fewer
    bytes (``strategy``); checkpoints hold the global tensors, so either layout loads either.
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
        self.activation = activation
        self.act = get_activation(activation)
        # Linear.forward reads the tile geometry, whose TileGrid cached_property takes a lock that
        # torch.compile cannot trace (Python 3.11): fill that cache here, outside any compiled region
        domain.counts()
        self.strategy: Strategy = strategy
        self.paired = dropout == 0
        self.fc1: nn.Module
        self.fc2: nn.Module
        if self.paired:
            self.act_grad = activation_grad(activation)
            self.hid_sizes, self.out_sizes = domain.split_sizes(hidden), domain.split_sizes(out_features)
            self.fc1 = PairBlock(domain, in_features, hidden, rows=False)
            self.drop = None
            self.fc2 = PairBlock(domain, hidden, out_features, rows=True)
        else:
            self.fc1 = Linear(domain, in_features, hidden, strategy=strategy)
            self.drop = Dropout(domain, dropout, layout="tokens")
            self.fc2 = Linear(domain, hidden, out_features, strategy=strategy)
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
        if self.paired:
            return self._pair(x)
        h = self.act(self.fc1(x))
        if self.drop is not None:
            h = self.drop(h)
        return self.fc2(h)

    def _pair(self, x: torch.Tensor) -> torch.Tensor:
        domain = self.domain
        counts = domain.counts(batch=x.shape[0])
        y = matmul_pair(
            x.reshape(-1, self.in_features), self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias,
            domain.axis, self.hid_sizes, self.out_sizes, counts, self.act, self.act_grad, self.strategy,
        )  # fmt: skip
        return y.reshape(*x.shape[:-1], self.out_features)

    def cost(self, batch: int, elsize: int = 4, input_grad: bool = True) -> Cost:
        """Paired: the whole MLP (``_pair_cost``). Else the activation's saved input; ``fc1``,
        ``fc2`` and ``drop`` price themselves."""
        if self.paired:
            return self._pair_cost(batch, elsize, input_grad)
        saved = (
            0 if self.activation == "identity" else self.domain.counts(batch)[self.domain.index] * self.hidden
        )
        return Cost(saved=saved * elsize)

    def _pair_cost(self, batch: int, elsize: int, input_grad: bool) -> Cost:
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
        paired = ", paired" if self.paired else ""
        return f"{self.in_features} -> {self.hidden} -> {self.out_features}, {self.activation}{paired}"
