"""Multi-head self-attention on token tiles ``(B, h, w, dim)``: global and neighbourhood.

* ``GlobalAttention`` — every token attends to every token of the global grid (all samples
  separately), with an exact distributed softmax: ``ring_attention`` circulates K/V blocks.
* ``LocalAttention`` — neighbourhood attention: each token attends to the ``(2r+1) × (2r+1)``
  cells centred on it. Longitude is periodic. Beyond a pole, ``lat_mode="pole"`` continues
  across the pole (the row ``k`` beyond is the row ``k - 1`` inside, 180° away), and
  ``lat_mode="zeros"`` masks the missing cells out of the softmax (a token near a pole attends
  to fewer neighbours). The neighbourhood is defined on the padded grid of ``pad_reference``:
  when ``2r + 1`` exceeds the number of columns, a cell can appear twice and counts twice.
  K/V reach across tile borders through ``halo_exchange`` (width ``r``).

Q/K/V and output projections are ``Linear`` layers (weights column-sharded); each canonical
weight is ``(dim, dim)`` with output columns ``heads × head_dim`` (head-major). ``qkv_bias``
gives Q and V a bias but not K: a key bias adds ``q·b`` to every score of a query, which the
softmax cancels, so its gradient is identically zero (BEiT and Swin-V2 drop it for the same
reason).
"""

from __future__ import annotations

import torch
from torch import nn

from ..distributed.collectives import all_gather
from ..distributed.comm import comm_site
from ..distributed.halo import Halo, halo_exchange
from ..distributed.matmul import Strategy
from .base import Domain, fill_normal_, sharded_parameter
from .cost import Cost, gather_bytes, window_bytes
from .linear import Linear
from .ring_attention import ring_attention, ring_attention_bytes

__all__ = ["GlobalAttention", "LocalAttention", "merge_heads", "neighbourhood_attention", "split_heads"]


def _check_heads(dim: int, num_heads: int) -> None:
    if num_heads < 1 or dim % num_heads:
        raise ValueError(
            f"dim={dim} must be a positive multiple of num_heads={num_heads}; choose num_heads "
            f"among the divisors of {dim}"
        )


def split_heads(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``(B, h, w, C)`` → ``(B, heads, h·w, C / heads)``: a view, no copy (the fused kernels take
    these strides)."""
    B, h, w, C = t.shape
    return t.reshape(B, h * w, num_heads, C // num_heads).transpose(1, 2)


def merge_heads(o: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``(B, heads, tokens, d)`` → the token tile shape of ``like``, ``(B, h, w, heads·d)``."""
    return o.transpose(1, 2).reshape(like.shape)


def neighbourhood_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    num_heads: int,
    radius: int,
    bias: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each token of ``q (B, h, w, C)`` attends to the ``(2r+1)²`` cells centred on it in ``kv``:
    K and V stacked on channels, ``(B, 2C, h + 2r, w + 2r)``, padded by ``r`` under the sphere's
    rules (a halo exchange on a mesh, ``pad_reference`` on one device). ``bias (heads, (2r+1)²)``
    is added to the scores, ``valid (K, h, 1)`` masks the neighbours beyond a pole. One
    ``(B, heads, h, w)`` score map per neighbour offset (no K-fold copy of the features); the
    softmax and the weighted sum accumulate in fp32. Returns ``(B, h, w, C)``."""
    B, h, w, C = q.shape
    H, d, r = num_heads, C // num_heads, radius
    q = q.permute(0, 3, 1, 2).reshape(B, H, d, h, w)
    kv = kv.reshape(B, 2, H, d, h + 2 * r, w + 2 * r)
    k, v = kv[:, 0], kv[:, 1]
    offsets = [(i, j) for i in range(2 * r + 1) for j in range(2 * r + 1)]
    scores = torch.stack(
        [(q * k[..., i : i + h, j : j + w]).sum(2, dtype=torch.float32) for i, j in offsets], dim=2
    ) * (d**-0.5)
    if bias is not None:
        scores = scores + bias.float()[None, :, :, None, None]
    if valid is not None:
        scores = scores.masked_fill(~valid, float("-inf"))
    p = torch.softmax(scores, dim=2)
    out = sum(p[:, :, n : n + 1] * v[..., i : i + h, j : j + w] for n, (i, j) in enumerate(offsets))
    return out.to(v.dtype).reshape(B, C, h, w).permute(0, 2, 3, 1)  # type: ignore[union-attr]


def _check_tokens(x: torch.Tensor, domain: Domain, dim: int, name: str) -> None:
    tile = domain.tile.shape
    if x.dim() != 4 or tuple(x.shape[1:3]) != tile or x.shape[3] != dim:
        raise ValueError(
            f"{name} expects this rank's token tile (B, {tile[0]}, {tile[1]}, {dim}) "
            f"(channels last), got {tuple(x.shape)}"
        )


class _Projections(nn.Module):
    """The ``q``, ``k``, ``v`` and ``proj`` Linear layers shared by both attention layers."""

    jigsaw_layer = True

    def __init__(self, domain: Domain, dim: int, num_heads: int, qkv_bias: bool, strategy: Strategy):
        super().__init__()
        _check_heads(dim, num_heads)
        self.domain, self.dim, self.num_heads = domain, dim, num_heads
        self.head_dim = dim // num_heads
        self.q = Linear(domain, dim, dim, qkv_bias, strategy)
        self.k = Linear(domain, dim, dim, False, strategy)
        self.v = Linear(domain, dim, dim, qkv_bias, strategy)
        self.proj = Linear(domain, dim, dim, True, strategy)

    def reset_parameters(self, seed: int = 0, key: str = "attention") -> None:
        for name in ("q", "k", "v", "proj"):
            getattr(self, name).reset_parameters(seed, f"{key}.{name}")

    def _tokens(self, batch: int) -> int:
        return self.domain.counts(batch)[self.domain.index]

    def _shared_input(self, batch: int, elsize: int) -> int:
        """``q``, ``k`` and ``v`` each declare the input they save: one tensor, counted thrice."""
        return 2 * self._tokens(batch) * self.dim * elsize


class GlobalAttention(_Projections):
    """Exact multi-head self-attention over all tokens of the global grid (per sample).

    Input and output: this rank's token tile ``(B, h, w, dim)``. Per-rank memory is
    ``O(local tokens)``: fused kernels per circulating block, never a tokens² score matrix.
    ``block`` caps the key tokens per kernel call (see ``ring_attention``); ``None`` uses whole
    blocks, and on one rank exactly ``F.scaled_dot_product_attention``.
    """

    def __init__(
        self,
        domain: Domain,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        strategy: Strategy = "auto",
        block: int | None = None,
    ):
        super().__init__(domain, dim, num_heads, qkv_bias, strategy)
        self.block = block
        self.areas = domain.counts(1)
        self.reset_parameters()

    def reset_parameters(self, seed: int = 0, key: str = "global_attention") -> None:
        super().reset_parameters(seed, key)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_tokens(x, self.domain, self.dim, "GlobalAttention")
        q, k, v = (split_heads(lin(x), self.num_heads) for lin in (self.q, self.k, self.v))
        with comm_site("global_attention"):
            o = ring_attention(q, k, v, self.domain.axis, self.areas, block=self.block)
        return self.proj(merge_heads(o, x))

    def cost(self, batch: int, elsize: int = 4, input_grad: bool = True) -> Cost:
        """Ring attention between the projections (which price themselves): K/V blocks pass
        round the ring while each block is attended; q, k, v, the output and the fp32
        log-sum-exp are saved, and two K/V blocks are in hand at once."""
        n, P, C = self._tokens(batch), self.domain.size, self.dim
        N = batch * self.domain.grid.n_lat * self.domain.grid.n_lon
        flops = 4 * n * N * C
        cost = Cost(
            flops=(flops, 2 * flops + flops // 2),  # backward: dQ, dK, dV and the recomputed scores
            saved=4 * n * C * elsize
            + batch * self.num_heads * (n // batch) * 4
            - self._shared_input(batch, elsize),
            peak=4 * n * C * elsize,
            overlap={"attention.ring"},
        )
        if P > 1:
            cost.bytes["attention.ring"] = ring_attention_bytes(self.areas, batch, C, elsize)
        return cost

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.num_heads}, block={self.block}"


class LocalAttention(_Projections):
    """Neighbourhood attention with radius ``r`` (a ``(2r+1)²`` window centred on each token).

    ``rel_pos_bias`` adds a learned bias per head and neighbour offset: the canonical table is
    ``(num_heads, (2r+1)²)`` (offsets row-major, ``(-r, -r)`` first), sharded over offsets and
    all-gathered at use.
    """

    def __init__(
        self,
        domain: Domain,
        dim: int,
        num_heads: int,
        radius: int,
        lat_mode: str = "pole",
        qkv_bias: bool = True,
        rel_pos_bias: bool = False,
        strategy: Strategy = "auto",
    ):
        super().__init__(domain, dim, num_heads, qkv_bias, strategy)
        if not isinstance(radius, int) or radius < 1:
            raise ValueError(f"radius must be a positive integer (window 2r+1), got {radius!r}")
        if lat_mode not in ("pole", "zeros"):
            raise ValueError(f"lat_mode {lat_mode!r}: use 'pole' (across the pole) or 'zeros' (masked)")
        self.radius, self.lat_mode = radius, lat_mode
        self.halo = Halo.uniform(radius, lat_mode)  # type: ignore[arg-type]
        self.halo.check(domain.grid)
        n_off = (2 * radius + 1) ** 2
        self.bias_sizes = domain.split_sizes(n_off)
        self.rel_bias = (
            sharded_parameter((num_heads, n_off), 1, *domain.split(n_off)) if rel_pos_bias else None
        )
        self.register_buffer("valid", self._valid_rows(), persistent=False)
        self.reset_parameters()

    def _valid_rows(self) -> torch.Tensor | None:
        """``(K, h, 1)``: whether the neighbour at each offset of each local row is on the grid."""
        if self.lat_mode != "zeros":
            return None
        r, tile, n_lat = self.radius, self.domain.tile, self.domain.grid.n_lat
        rows = torch.arange(tile.lat_start, tile.lat_stop)
        di = torch.arange(-r, r + 1).repeat_interleave(2 * r + 1)
        g = rows.unsqueeze(0) + di.unsqueeze(1)
        return ((g >= 0) & (g < n_lat)).unsqueeze(-1)

    def reset_parameters(self, seed: int = 0, key: str = "local_attention") -> None:
        super().reset_parameters(seed, key)
        if self.rel_bias is not None:
            fill_normal_(self.rel_bias, seed, f"{key}.rel_bias", std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_tokens(x, self.domain, self.dim, "LocalAttention")
        return self.proj(self.attend(self.q(x), self.k(x), self.v(x)))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The attention between the projections: token tiles ``(B, h, w, dim)`` in and out."""
        if torch.is_autocast_enabled(q.device.type):  # halo and products in the autocast dtype
            dtype = torch.get_autocast_dtype(q.device.type)
            q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        kv = torch.cat([k, v], dim=-1).permute(0, 3, 1, 2).contiguous()
        with comm_site("local_attention"):
            kv = halo_exchange(kv, self.domain.grid, self.halo, self.domain.axis)
            bias = None
            if self.rel_bias is not None:
                bias = all_gather(self.rel_bias, self.domain.axis, 1, self.bias_sizes)
        return neighbourhood_attention(q, kv, self.num_heads, self.radius, bias, self.valid)

    def cost(self, batch: int, elsize: int = 4, input_grad: bool = True) -> Cost:
        """The K/V halo (width ``r``) and the relative-bias gather; saved: the padded K/V, q and
        the fp32 softmax over the ``(2r+1)²`` neighbours; at the peak the score maps twice."""
        d, r, C = self.domain, self.radius, self.dim
        n, (h, w) = self._tokens(batch), d.tile.shape
        K = (2 * r + 1) ** 2
        probs = batch * self.num_heads * K * h * w * 4
        cost = Cost(
            flops=(4 * n * K * C, 8 * n * K * C),
            saved=batch * 2 * C * (h + 2 * r) * (w + 2 * r) * elsize
            + n * C * elsize
            + probs
            - self._shared_input(batch, elsize),
            peak=2 * probs + 2 * n * C * 4,
        )
        if d.size > 1:
            g, (lat, lon) = d.grid, (self.halo.lat, self.halo.lon)
            wins = [
                (t.lat_start - lat[0], t.lat_stop + lat[1], t.lon_start - lon[0], t.lon_stop + lon[1])
                for t in g.tiles()
            ]
            modes = (self.halo.lat_mode, self.halo.lon_mode)
            cost.bytes["attention.halo"] = window_bytes(g, wins, *modes, batch * 2 * C, elsize)
            if self.rel_bias is not None:
                cost.bytes["attention.rel_bias"] = gather_bytes(self.bias_sizes, self.num_heads, elsize)
        return cost

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.num_heads}, radius={self.radius}, lat_mode={self.lat_mode!r}"
