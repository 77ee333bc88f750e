"""Plain-PyTorch twins of the jigsaw token layers: ``nn.Linear``, ``nn.LayerNorm``,
``nn.GroupNorm`` and a token-mixing MLP (``F.linear`` along the token dimension).

Jigsaw stores linear weights as ``(in, out)`` (the transpose of ``nn.Linear.weight``); the twins
keep torch's layouts and ``canonical_to_twin`` converts when ``load_jigsaw`` copies them.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from ..layers.mlp import get_activation

__all__ = ["MLP", "GroupNorm", "InstanceNorm", "LayerNorm", "Linear", "TokenMixing"]


class Linear(nn.Linear):
    """``nn.Linear`` on token tensors ``(..., in_features)``."""

    def canonical_to_twin(self, name: str, t: torch.Tensor) -> torch.Tensor:
        return t.t() if name == "weight" else t


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` over channels (last dim, or dim 1 with ``channels_first``)."""

    def __init__(
        self, channels: int, eps: float = 1e-5, elementwise_affine: bool = True, channels_first: bool = False
    ):
        super().__init__(channels, eps, elementwise_affine)
        self.channels_first = channels_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.channels_first:
            return super().forward(x)
        return super().forward(x.movedim(1, -1)).movedim(-1, 1)


GroupNorm = nn.GroupNorm


class InstanceNorm(nn.GroupNorm):
    """Instance norm as one group per channel (``F.instance_norm`` without running statistics)."""

    def __init__(self, channels: int, eps: float = 1e-5, affine: bool = False):
        super().__init__(channels, channels, eps, affine)


class MLP(nn.Module):
    """``fc2(dropout(act(fc1(x))))`` with ``nn.Linear`` layers."""

    def __init__(
        self,
        in_features: int,
        hidden: int,
        out_features: int | None = None,
        activation: str = "gelu",
        dropout: float = 0.0,
    ):
        super().__init__()
        self.act = get_activation(activation)
        self.fc1 = Linear(in_features, hidden)
        self.drop = nn.Dropout(dropout) if dropout > 0 else None
        self.fc2 = Linear(hidden, out_features or in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc1(x))
        if self.drop is not None:
            h = self.drop(h)
        return self.fc2(h)


class TokenMixing(nn.Module):
    """MLP-Mixer token mixing on ``(B, H, W, C)``: ``nn.Linear`` layers along the ``H·W`` tokens.

    ``fc1`` is ``nn.Linear(H·W, hidden)``, ``fc2`` is ``nn.Linear(hidden, H·W)``: jigsaw's ``w1
    (hidden, H, W)``, ``b1``, ``w2 (H, W, hidden)`` and ``b2 (H, W)`` flattened."""

    canonical_names: ClassVar[dict[str, str]] = {
        "fc1.weight": "w1",
        "fc1.bias": "b1",
        "fc2.weight": "w2",
        "fc2.bias": "b2",
    }

    def __init__(self, grid: tuple[int, int], hidden_tokens: int, activation: str = "gelu"):
        super().__init__()
        n = grid[0] * grid[1]
        self.act = get_activation(activation)
        self.fc1 = nn.Linear(n, hidden_tokens)
        self.fc2 = nn.Linear(hidden_tokens, n)

    def canonical_to_twin(self, name: str, t: torch.Tensor) -> torch.Tensor:
        twin = {v: k for k, v in self.canonical_names.items()}[name]
        return t.reshape(self.get_parameter(twin).shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        xt = x.reshape(B, H * W, C).transpose(1, 2)  # (B, C, tokens)
        y = self.fc2(self.act(self.fc1(xt)))
        return y.transpose(1, 2).reshape(B, H, W, C)
