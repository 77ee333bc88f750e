"""Channel MLP on token tiles: Linear → activation → (dropout) → Linear, weights column-sharded."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed.matmul import Strategy
from .base import Domain
from .cost import Cost
from .dropout import Dropout
from .linear import Linear

__all__ = ["ACTIVATIONS", "MLP", "get_activation"]


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


class MLP(nn.Module):
    """``fc2(dropout(act(fc1(x))))`` on a token tile ``(B, h, w, in_features)``.

    ``fc1`` and ``fc2`` are jigsaw ``Linear`` layers (canonical weights ``(in, hidden)`` and
    ``(hidden, out)``, each rank holding a column block), so the MLP holds 1/N of the weights per
    rank and each product moves weights or activations, whichever is fewer bytes (``strategy``).
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
        self.fc1 = Linear(domain, in_features, hidden, strategy=strategy)
        self.drop = Dropout(domain, dropout, layout="tokens") if dropout > 0 else None
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
        h = self.act(self.fc1(x))
        if self.drop is not None:
            h = self.drop(h)
        return self.fc2(h)

    def cost(self, batch: int, elsize: int = 4, input_grad: bool = True) -> Cost:
        """The activation's saved input; ``fc1``, ``fc2`` and ``drop`` price themselves."""
        saved = (
            0 if self.activation == "identity" else self.domain.counts(batch)[self.domain.index] * self.hidden
        )
        return Cost(saved=saved * elsize)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.hidden} -> {self.out_features}, {self.activation}"
