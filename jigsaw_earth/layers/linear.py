"""Distributed linear layer over token tiles, on Jigsaw's distributed matmul."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..distributed.matmul import Strategy, matmul_channels
from .base import Domain, fill_fan_in_, output_sharded
from .channels import ChannelDim, ChannelDims
from .cost import Cost, channel_matmul

__all__ = ["Linear"]


class Linear(nn.Module):
    """``y = x·W + b`` on a token tile ``(B, h, w, in_features)`` → ``(B, h, w, out_features)``.

    The canonical weight is ``W`` of shape ``(in_features, out_features)`` (note: the transpose
    of ``torch.nn.Linear.weight``); each rank holds the column block ``domain.split(out_features)``
    and the matching bias block, so no rank holds the full matrix.
    """

    jigsaw_layer = True

    def __init__(
        self,
        domain: Domain,
        in_features: int,
        out_features: int,
        bias: bool = True,
        strategy: Strategy = "auto",
    ):
        super().__init__()
        self.domain, self.in_features, self.out_features = domain, in_features, out_features
        self.strategy: Strategy = strategy
        self.out_sizes, self.weight, self.bias = output_sharded(domain, (in_features, out_features), 1, bias)
        self.reset_parameters()

    def reset_parameters(self, seed: int = 0, key: str = "linear") -> None:
        """``torch.nn.Linear``'s default: uniform in ±1/sqrt(in_features)."""
        fill_fan_in_(self.weight, self.bias, seed, key, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"Linear expects {self.in_features} input features, got {x.shape[-1]}")
        counts = self.domain.counts(batch=x.numel() // (x.shape[-1] * _area(self.domain)))
        flat = x.reshape(-1, self.in_features)
        y = matmul_channels(
            flat, self.weight, self.bias, self.domain.axis, self.out_sizes, counts, self.strategy
        )
        return y.reshape(*x.shape[:-1], self.out_features)

    def channel_dims(
        self, inputs: Sequence[str] | None = None, outputs: Sequence[str] | None = None
    ) -> ChannelDims:
        """Rows of ``W`` by input channel, columns and bias by output channel (those named)."""
        weight: list[ChannelDim] = []
        dims: ChannelDims = {}
        if inputs is not None:
            weight.append(ChannelDim(0, tuple(inputs)))
        if outputs is not None:
            weight.append(ChannelDim(1, tuple(outputs)))
            if self.bias is not None:
                dims["bias"] = (ChannelDim(0, tuple(outputs)),)
        if weight:
            dims["weight"] = tuple(weight)
        return dims

    def cost(self, batch: int, elsize: int = 4, input_grad: bool = True) -> Cost:
        """One ``matmul_channels`` over ``batch`` samples of every rank's tile."""
        return channel_matmul(
            self.strategy, self.domain.counts(batch), self.domain.index, self.in_features,
            self.out_sizes, self.bias is not None, elsize, input_grad, "linear",
        )  # fmt: skip

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, shards {self.out_sizes}, {self.strategy}"


def _area(domain: Domain) -> int:
    h, w = domain.tile.shape
    return h * w
