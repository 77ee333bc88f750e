"""Analytical communication of each jigsaw layer for one training step (forward, backward).

Each entry is the exact byte formula of the code path the layer takes (the numbers the comm
ledger measures), summed over all ranks of the domain group. ``layer_bytes`` prices one module
(not its children); walking ``named_modules`` and summing prices a whole model.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from ..distributed.halo import Halo, Window
from ..distributed.halo import _receive_plan as receive_plan  # the plan the exchange itself uses
from ..distributed.matmul import channel_bytes, choose, token_bytes
from ..distributed.tiles import TileGrid
from ..layers.attention import GlobalAttention, LocalAttention
from ..layers.base import Domain
from ..layers.conv import Conv2d
from ..layers.conv_transpose import ConvTranspose2d
from ..layers.linear import Linear
from ..layers.norm import GroupNorm, LayerNorm
from ..layers.patch import PatchEmbed, PatchRecovery
from ..layers.resample import Downsample, Upsample
from ..layers.ring_attention import ring_attention_bytes
from ..layers.token_mixing import TokenMixing

__all__ = ["layer_bytes", "matmul_bytes", "window_bytes"]

Bytes = tuple[int, int]


def matmul_bytes(
    strategy: str, counts: Sequence[int], cin: int, out_sizes: Sequence[int], bias: bool, elsize: int
) -> Bytes:
    """``channel_bytes`` of the strategy ``matmul_channels`` picks when training."""
    if strategy == "auto":
        costs = {
            s: channel_bytes(s, counts, cin, out_sizes, bias, elsize) for s in ("weights", "activations")
        }
        strategy = choose(costs, training=True)
    return channel_bytes(strategy, counts, cin, out_sizes, bias, elsize)


def _tokens(
    strategy: str, in_counts: Sequence[int], out_counts: Sequence[int], channels: int, elsize: int
) -> Bytes:
    if strategy == "auto":
        costs = {
            s: token_bytes(s, in_counts, out_counts, channels, elsize) for s in ("weights", "activations")
        }
        strategy = choose(costs, training=True)
    return token_bytes(strategy, in_counts, out_counts, channels, elsize)


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


def _halo_windows(grid: TileGrid, halo: Halo) -> list[Window]:
    return [
        (
            t.lat_start - halo.lat[0],
            t.lat_stop + halo.lat[1],
            t.lon_start - halo.lon[0],
            t.lon_stop + halo.lon[1],
        )
        for t in grid.tiles()
    ]


def _gather_affine(domain: Domain, channels: int, n: int, elsize: int) -> Bytes:
    """All-gather of ``n`` stacked ``(C,)`` shards; backward reduce-scatters the same volume."""
    if domain.size == 1:
        return 0, 0
    sizes = domain.split_sizes(channels)
    moved = sum(n * (channels - s) for s in sizes) * elsize
    return moved, moved


def _all_reduce(ranks: int, nbytes: int) -> int:
    """A ring all-reduce of ``nbytes`` per rank: ``2(P-1)/P`` of it sent by each rank."""
    return ranks * (2 * (ranks - 1) * nbytes // ranks)


def layer_bytes(module: nn.Module, parent: nn.Module | None, batch: int, elsize: int = 4) -> dict[str, Bytes]:
    """``{op: (forward, backward)}`` bytes of ``module`` itself (children are priced separately)."""
    custom = getattr(module, "comm_bytes", None)
    if callable(custom):
        return custom(batch, elsize)
    domain: Domain | None = getattr(module, "domain", None)
    if domain is None or domain.size == 1:
        return {}
    if isinstance(module, Linear):
        b = matmul_bytes(
            module.strategy,
            domain.counts(batch),
            module.in_features,
            module.out_sizes,
            module.bias is not None,
            elsize,
        )
        return {"linear": b}
    if isinstance(module, (Conv2d, PatchEmbed)):
        # receptive-field gather, then the conv weight ring (messages of (in_ch·kh·kw + 1)·out_q values,
        # what channel_bytes prices for 'weights') or im2col rows of in_ch·kh·kw ('activations')
        name, (kh, kw) = (
            ("conv", module.kernel) if isinstance(module, Conv2d) else ("patch_embed", module.patch)
        )
        mm = matmul_bytes(
            module.strategy,
            module.out_domain.counts(batch),
            module.in_ch * kh * kw,
            module.out_sizes,
            module.bias is not None,
            elsize,
        )
        win = window_bytes(domain.grid, module.windows, *module.modes, batch * module.in_ch, elsize)
        return {f"{name}.matmul": mm, f"{name}.windows": win}
    if isinstance(module, PatchRecovery):
        mm = matmul_bytes(
            module.strategy,
            domain.counts(batch),
            module.embed_dim,
            module.out_sizes,
            module.bias is not None,
            elsize,
        )
        win = window_bytes(
            module.out_domain.grid, module.windows, "zeros", "zeros", batch * module.out_ch, elsize
        )
        return {"patch_recovery.matmul": mm, "patch_recovery.windows": win}
    if (
        isinstance(parent, Downsample | Upsample)
        and hasattr(module, "windows")
        and not hasattr(module, "weight")
    ):
        # pooling / interpolation inside a resampler: a window gather of the channels it carries
        channels = parent.channels if isinstance(parent, Downsample) else parent.out_channels
        modes = ("zeros", "zeros") if getattr(module, "mode", "") != "bilinear" else module.modes
        return {
            "resample.windows": window_bytes(domain.grid, module.windows, *modes, batch * channels, elsize)
        }
    if isinstance(module, ConvTranspose2d):
        kh, kw = module.kernel
        counts = [batch * (w[1] - w[0]) * (w[3] - w[2]) for w in module.windows]
        out_sizes = [n * kh * kw for n in module.out_sizes]
        mm = matmul_bytes(module.strategy, counts, module.in_ch, out_sizes, False, elsize)
        win = window_bytes(domain.grid, module.windows, *module.modes, batch * module.in_ch, elsize)
        out = {"conv_transpose.matmul": mm, "conv_transpose.windows": win}
        if module.bias is not None:
            out["conv_transpose.bias"] = _gather_affine(domain, module.out_ch, 1, elsize)
        return out
    if isinstance(module, TokenMixing):
        channels = batch * int(getattr(parent, "dim"))  # noqa: B009 — the block's token channels
        a = _tokens(module.strategy, module.token_counts, module.hidden_sizes, channels, elsize)
        b = _tokens(module.strategy, module.hidden_sizes, module.token_counts, channels, elsize)
        return {"token_mixing": (a[0] + b[0], a[1] + b[1])}
    if isinstance(module, GlobalAttention):
        return {"attention.ring": ring_attention_bytes(module.areas, batch, module.dim, elsize)}
    if isinstance(module, LocalAttention):
        wins = _halo_windows(domain.grid, module.halo)
        halo = window_bytes(
            domain.grid, wins, module.halo.lat_mode, module.halo.lon_mode, batch * 2 * module.dim, elsize
        )
        out = {"attention.halo": halo}
        if module.rel_bias is not None:
            out["attention.rel_bias"] = _gather_affine(
                domain, module.rel_bias.shape[1], module.num_heads, elsize
            )
        return out
    if isinstance(module, LayerNorm | GroupNorm):
        n = 2 if module.weight is not None else 0
        out = {"norm.affine": _gather_affine(domain, module.channels, n, elsize)}
        if isinstance(module, GroupNorm):  # all-reduce of (P, B, G, 2) fp32; back: of (B, G, 2)
            stats = batch * module.num_groups * 2 * 4
            out["norm.stats"] = (
                _all_reduce(domain.size, domain.size * stats),
                _all_reduce(domain.size, stats),
            )
        return out
    return {}
