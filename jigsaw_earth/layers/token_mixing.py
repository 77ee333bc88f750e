"""WeatherMixer's token mixing: an MLP along the (sharded) token dimension of a token tile.

For a global token tensor ``x`` of shape ``(B, H, W, C)`` (``N = H·W`` tokens) it computes::

    h[b, d, c]    = act( Σ_ij W1[d, i, j] · x[b, i, j, c] + b1[d] )      d < hidden_tokens
    y[b, i, j, c] = Σ_d  W2[i, j, d] · h[b, d, c] + b2[i, j]

Sharding (every rank holds 1/N of each weight, no rank holds a full sample):

* ``W1 (hidden, H, W)`` and ``b1 (hidden,)``: rank ``q`` holds the rows ``domain.split(hidden)``;
  the hidden dim has no spatial meaning, so it is split evenly. The hidden activations ``h`` are
  sharded the same way: rank ``q`` holds ``h[:, rows_q, :]``.
* ``W2 (H, W, hidden)`` and ``b2 (H, W)``: rank ``q`` holds its own tile block ``[lat_q, lon_q]``.

Both products are Jigsaw's transposed matmul ``matmul_tokens`` (``A·X`` contracting the sharded
token dim) with the batch folded into the columns (``X`` is ``tokens × (B·C)``). The first
``A`` is ``W1``'s local row block ``(D_q, H, W)`` itself: ``matmul_tokens`` reads the columns
of rank k's tokens from rank k's tile (no rank-ordered copy of ``W1``); the second ``A`` is
``W2``'s local block reshaped to ``(h·w, hidden)``, whose columns are the hidden split, already in rank order.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..distributed.collectives import all_gather
from ..distributed.comm import comm_site, exchange, run_exchange
from ..distributed.matmul import Strategy, autocast_operands, matmul_tokens, token_bytes, token_strategy
from ..distributed.mesh import Axis
from ..distributed.tiles import Tile
from .base import Domain, ShardSpec, fill_uniform_, sharded_parameter
from .cost import Cost
from .mlp import get_activation
from .replicas import Replicating

__all__ = ["TokenMixing"]


class TokenMixing(Replicating, nn.Module):
    """Token-mixing MLP on a token tile ``(B, h, w, C)`` → ``(B, h, w, C)`` of the same grid."""

    jigsaw_layer = True

    def __init__(
        self,
        domain: Domain,
        hidden_tokens: int,
        activation: str = "gelu",
        strategy: Strategy = "auto",
        channels: int | None = None,
    ):
        super().__init__()
        if hidden_tokens < 1:
            raise ValueError(f"TokenMixing needs hidden_tokens ≥ 1, got {hidden_tokens}")
        grid, tile = domain.grid, domain.tile
        self.domain, self.hidden_tokens, self.activation = domain, hidden_tokens, activation
        self.channels = channels  # C of the tiles it mixes: only its cost needs it
        self.strategy: Strategy = strategy
        self.act = get_activation(activation)
        self.n_tokens = grid.n_lat * grid.n_lon
        self.hidden_sizes = domain.split_sizes(hidden_tokens)
        self.token_counts = domain.counts()
        self._tile = tile  # forward touches no cached_property
        self._tiles = tuple((t.lat_start, t.lat_stop, t.lon_start, t.lon_stop) for t in grid.tiles())
        start, stop = domain.split(hidden_tokens)
        self.w1 = sharded_parameter((hidden_tokens, grid.n_lat, grid.n_lon), 0, start, stop)
        self.b1 = sharded_parameter((hidden_tokens,), 0, start, stop)
        self.w2 = _tile_parameter((grid.n_lat, grid.n_lon, hidden_tokens), tile)
        self.b2 = _tile_parameter((grid.n_lat, grid.n_lon), tile)
        self.reset_parameters()

    def reset_parameters(self, seed: int = 0, key: str = "token_mixing") -> None:
        """``torch.nn.Linear``'s default for both products: uniform in ±1/sqrt(fan_in)."""
        b1 = 1.0 / math.sqrt(self.n_tokens)
        b2 = 1.0 / math.sqrt(self.hidden_tokens)
        fill_uniform_(self.w1, seed, f"{key}.w1", -b1, b1)
        fill_uniform_(self.b1, seed, f"{key}.b1", -b1, b1)
        fill_uniform_(self.w2, seed, f"{key}.w2", -b2, b2)
        fill_uniform_(self.b2, seed, f"{key}.b2", -b2, b2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tile = self._tile
        if x.dim() != 4 or tuple(x.shape[1:3]) != tile.shape:
            raise ValueError(
                f"TokenMixing expects this rank's token tile (B, {tile.shape[0]}, {tile.shape[1]}, C) "
                f"of the {self.domain.grid.n_lat}x{self.domain.grid.n_lon} grid, got {tuple(x.shape)}"
            )
        B, h, w, C = x.shape
        a2, b2 = self.w2.reshape(h * w, self.hidden_tokens), self.b2.reshape(h * w)
        xt = x.permute(1, 2, 0, 3).reshape(h * w, B * C)
        axis, replica = self.domain.axis, self.replica()
        with comm_site("TokenMixing"):  # under autocast, matmul_tokens moves autocast's dtype
            if replica is not None:  # a forecast: one exchange of partial sums (replicas.py)
                hid = self.act(_summed(axis, replica[0], xt) + replica[1].unsqueeze(-1))
                xt, a2, b2 = autocast_operands(hid, a2, b2)
                y = torch.addmm(b2.unsqueeze(-1), a2, xt)
            else:
                hid = matmul_tokens(
                    xt,
                    self.w1,
                    self.b1,
                    axis,
                    self.token_counts,
                    self.hidden_sizes,
                    self.strategy,
                    self._tiles,
                )
                hid = self.act(hid)
                y = matmul_tokens(hid, a2, b2, axis, self.hidden_sizes, self.token_counts, self.strategy)
        return y.reshape(h, w, B, C).permute(2, 0, 1, 3)

    def gather_replica(self) -> tuple[torch.Tensor, ...]:
        """The columns of ``W1`` that multiply this rank's tokens, every hidden row ``(hidden, h·w)``,
        and the whole ``b1`` (``replicas.py``; collective)."""
        axis, sizes, me = self.domain.axis, self.hidden_sizes, self.domain.index
        peers = [k for k in range(axis.size) if k != me]

        def columns(k: int) -> torch.Tensor:  # this rank's hidden rows of W1 for rank k's tokens
            i0, i1, j0, j1 = self._tiles[k]
            return self.w1[:, i0:i1, j0:j1].reshape(self.w1.shape[0], (i1 - i0) * (j1 - j0)).contiguous()

        n = self.token_counts[me]
        with comm_site("TokenMixing.replica"):
            got = exchange(axis, [(axis.ranks[k], columns(k)) for k in peers],
                           [(axis.ranks[k], (sizes[k], n)) for k in peers], op="token_mixing.replica",
                           dtype=self.w1.dtype, device=self.w1.device).wait()  # fmt: skip
            blocks = dict(zip(peers, got))
            blocks[me] = columns(me)
            return torch.cat([blocks[k] for k in range(axis.size)]), all_gather(self.b1, axis, 0, sizes)

    def replica_numel(self) -> int:
        h, w = self._tile.shape
        return self.hidden_tokens * (h * w + 1)

    def cost(self, batch: int, elsize: int = 4, input_grad: bool = True) -> Cost:
        """Two ``matmul_tokens`` with the batch folded into ``batch × channels`` columns."""
        if self.channels is None:
            raise ValueError("TokenMixing.cost needs the channels it mixes: pass channels= to TokenMixing")
        P, q, cols = self.domain.size, self.domain.index, batch * self.channels
        tokens, hidden = self.token_counts, self.hidden_sizes
        n, N, d, D = tokens[q], self.n_tokens, hidden[q], self.hidden_tokens
        cost = Cost(overlap={"token_mixing"})
        # W1 itself is saved (its rank blocks are read from the tiles); autocast saves its cast
        cost.saved = (d * N if elsize != 4 else 0) + n * cols + 2 * d * cols
        cost.saved += n * D if elsize != 4 else 0  # W2's block, cast by autocast
        if P > 1:
            first = token_strategy(self.strategy, tokens, hidden, cols, True, input_grad)
            second = token_strategy(self.strategy, hidden, tokens, cols, True, True)
            f1 = token_bytes(first, tokens, hidden, cols, elsize, input_grad)
            f2 = token_bytes(second, hidden, tokens, cols, elsize, True)
            cost.bytes["token_mixing"] = (f1[0] + f2[0], f1[1] + f2[1])
            cost.saved += D * n if first == "weights" else 0  # our tokens' A blocks: own copied + received
            cost.saved += (N - n) * d if second == "weights" else 0
        flops = 2 * D * n * cols + 2 * d * N * cols if P > 1 else 4 * D * N * cols
        cost.flops = (flops, 2 * flops)  # dA and dX of each product
        cost.saved *= elsize
        cost.peak = 2 * n * cols * elsize
        return cost

    def extra_repr(self) -> str:
        g = self.domain.grid
        return f"{g.n_lat}x{g.n_lon} tokens -> {self.hidden_tokens}, {self.activation}, {self.strategy}"


def _summed(axis: Axis, w1_own: torch.Tensor, xt: torch.Tensor) -> torch.Tensor:
    """``W1 · X`` over every rank's tokens: this rank's partial sum ``w1_own · xt`` and every peer's,
    added in rank order (the same bits on every rank), in the accumulation dtype (fp32 under autocast)."""
    w1_own, xt = autocast_operands(w1_own, xt)
    part = w1_own @ xt
    parts = run_exchange(_partials, axis, part)  # eagerly under torch.compile (one graph break)
    total = parts[0].float()
    for k in range(1, axis.size):
        total = total + parts[k].float()
    return total


def _partials(axis: Axis, part: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's partial sum, in rank order (this rank's own is ``part``)."""
    me, peers = axis.index, [k for k in range(axis.size) if k != axis.index]
    got = exchange(axis, [(axis.ranks[k], part) for k in peers], [(axis.ranks[k], part.shape) for k in peers],
                   op="token_mixing.replica", dtype=part.dtype, device=part.device).wait()  # fmt: skip
    parts = dict(zip(peers, got))
    parts[me] = part
    return [parts[k] for k in range(axis.size)]


def _tile_parameter(global_shape: tuple[int, ...], tile: Tile) -> nn.Parameter:
    """The block ``[lat_start:lat_stop, lon_start:lon_stop, ...]`` of an ``(n_lat, n_lon, ...)`` tensor."""
    p = nn.Parameter(torch.empty(*tile.shape, *global_shape[2:]))
    offsets = (tile.lat_start, tile.lon_start) + (0,) * (len(global_shape) - 2)
    p._jigsaw_spec = ShardSpec(tuple(global_shape), offsets)  # type: ignore[attr-defined]
    return p
