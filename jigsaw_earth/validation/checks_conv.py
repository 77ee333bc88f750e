"""Validator checks for convolution, resampling and patch layers, against plain torch.

Every reference runs torch's own operator (``F.conv2d``, ``F.avg_pool2d``, ``F.max_pool2d``,
``F.conv_transpose2d``, ``F.interpolate``, ``F.grid_sample``, ``F.fold``) on the global field,
padded by the serial ``pad_reference`` where the sphere's boundary rules apply, with the serial
module's full parameters. Expected communication is derived independently of the layers: the
halo/window cells come from padding a field of owner ids with the serial reference, the matmul
bytes from ``channel_bytes``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed.halo import Halo, Window, pad_reference, window_reference
from ..distributed.matmul import channel_bytes
from ..distributed.mesh import DomainMesh
from ..distributed.tiles import TileGrid
from ..layers.base import Domain, local_domain
from ..layers.conv import Conv2d
from ..layers.patch import PatchEmbed, PatchRecovery
from ..layers.resample import Downsample, Upsample
from .layer_harness import check_module
from .registry import Record, register

ELSIZE = 4


def _x(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _fits(mesh: DomainMesh, *grids: tuple[int, int]) -> bool:
    return all(g[0] >= mesh.shape.lat and g[1] >= mesh.shape.lon for g in grids)


def remote_cells(grid: TileGrid, windows: tuple[Window, ...], lat_mode: str, lon_mode: str) -> int:
    """Cells of all windows whose source (by the serial boundary rules) another rank owns."""
    owners = torch.zeros(grid.n_lat, grid.n_lon)
    for k, t in enumerate(grid.tiles()):
        owners[t.slices] = k + 1
    total = 0
    for k, w in enumerate(windows):
        src = window_reference(owners, w, lat_mode, lon_mode)  # type: ignore[arg-type]
        total += int(((src != 0) & (src != k + 1)).sum())
    return total


def tile_windows(grid: TileGrid, rows, cols) -> tuple[Window, ...]:
    """Windows from per-tile row/column functions ``(start, stop) -> (lo, hi)``."""
    return tuple((*rows(t.lat_start, t.lat_stop), *cols(t.lon_start, t.lon_stop)) for t in grid.tiles())


def conv_receptive(n_out: int, k: int, s: int, d: int, p: int):
    return lambda o0, o1: (o0 * s - p, (o1 - 1) * s - p + d * (k - 1) + 1)


def conv_bytes(
    mesh: DomainMesh, grid: tuple[int, int], out: tuple[int, int], batch: int, cin: int, cout: int,
    kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int], pad_before: tuple[int, int],
    modes: tuple[str, str], strategy: str, bias: bool,
) -> int:  # fmt: skip
    """Forward + backward bytes of a convolution: window gather (and its adjoint) plus the
    channel matmul of ``cin*kh*kw`` rows into ``cout`` (the weight ring moves the same
    ``(cin*kh*kw + 1) × cout`` blocks as ``channel_bytes("weights")``; ``"activations"`` moves
    im2col rows)."""
    g = TileGrid(*grid, mesh.shape.lat, mesh.shape.lon)
    o = Domain.create(mesh, *out)
    wins = tile_windows(
        o.grid,
        conv_receptive(out[0], kernel[0], stride[0], dilation[0], pad_before[0]),
        conv_receptive(out[1], kernel[1], stride[1], dilation[1], pad_before[1]),
    )
    halo = 2 * remote_cells(g, wins, *modes) * batch * cin * ELSIZE
    rows = cin * kernel[0] * kernel[1]
    return halo + sum(channel_bytes(strategy, o.counts(batch), rows, o.split_sizes(cout), bias))


# ------------------------------------------------------------------------------------- conv
CONV_CASES = [
    # grid, cin, cout, kernel, stride, dilation, padding, lat_mode, lon_mode, strategy
    ((8, 12), 3, 5, 3, 1, 1, "same", "zeros", "periodic", "weights"),
    ((7, 10), 2, 4, 5, 1, 1, "same", "pole", "periodic", "activations"),
    ((9, 14), 3, 4, 3, 2, 1, "same", "replicate", "periodic", "weights"),
    ((7, 10), 2, 3, 3, 1, 2, "same", "zeros", "zeros", "weights"),
    ((9, 13), 2, 3, 7, 1, 1, "same", "replicate", "periodic", "weights"),
    ((8, 12), 3, 2, 4, 2, 1, 1, "pole", "periodic", "activations"),
    ((7, 10), 4, 6, 1, 1, 1, 0, "zeros", "periodic", "activations"),
]


@register("conv")
def check_conv(mesh: DomainMesh) -> Iterator[Record]:
    for case in CONV_CASES:
        grid, cin, cout, k, s, dil, padding, lat_mode, lon_mode, strategy = case

        def build(d: Domain, case=case) -> Conv2d:
            _, cin, cout, k, s, dil, padding, lat_mode, lon_mode, strategy = case
            return Conv2d(d, cin, cout, k, s, dil, padding, lat_mode, lon_mode, strategy=strategy)

        probe = build(local_domain(*grid))
        out = (probe.out_domain.grid.n_lat, probe.out_domain.grid.n_lon)
        if not _fits(mesh, grid, out):
            continue
        (pt, pb), (pl, pr) = probe.padding
        halo = Halo((pt, pb), (pl, pr), lat_mode, lon_mode)

        def reference(m, x, s=s, dil=dil, halo=halo):
            return F.conv2d(pad_reference(x, halo), m.weight, m.bias, s, dilation=dil)

        expected = conv_bytes(
            mesh, grid, out, 2, cin, cout, (k, k), (s, s), (dil, dil), (pt, pl),
            (lat_mode, lon_mode), strategy, True,
        )  # fmt: skip
        yield check_module(
            mesh,
            f"conv.{strategy}",
            f"{grid[0]}x{grid[1]} {cin}->{cout} k{k} s{s} d{dil} p{padding} {lat_mode}/{lon_mode}",
            build,
            _x((2, cin, *grid), k * 10 + s),
            grid,
            reference=reference,
            expected_bytes=expected,
        )


def _grid_of(mesh: DomainMesh, grid: tuple[int, int]) -> TileGrid:
    return TileGrid(*grid, mesh.shape.lat, mesh.shape.lon)


def _conv1x1_bytes(
    mesh: DomainMesh, grid: tuple[int, int], batch: int, cin: int, cout: int, strategy: str
) -> int:
    d = Domain.create(mesh, *grid)
    return sum(channel_bytes(strategy, d.counts(batch), cin, d.split_sizes(cout), True))


# ------------------------------------------------------------------------------- downsample
DOWN_CASES = [
    # grid, channels, out_channels, mode, factor, lat_mode, strategy
    ((9, 14), 3, 4, "conv", 2, "replicate", "weights"),
    ((7, 10), 2, 3, "conv", 2, "zeros", "activations"),
    ((9, 13), 3, 5, "avgpool", 2, "zeros", "weights"),
    ((8, 12), 3, 3, "maxpool", 2, "zeros", "weights"),
    ((7, 11), 2, 2, "avgpool", 3, "zeros", "weights"),
]


@register("downsample")
def check_downsample(mesh: DomainMesh) -> Iterator[Record]:
    for case in DOWN_CASES:
        grid, ch, out_ch, mode, f, lat_mode, strategy = case
        out = (-(-grid[0] // f), -(-grid[1] // f))
        if not _fits(mesh, grid, out):
            continue

        def build(d: Domain, case=case) -> Downsample:
            _, ch, out_ch, mode, f, lat_mode, strategy = case
            return Downsample(d, ch, out_ch, mode, f, lat_mode=lat_mode, strategy=strategy)

        if mode == "conv":
            k = 2 * (f // 2) + 1
            pad = ((k - 1) // 2, k - 1 - (k - 1) // 2)
            halo = Halo(pad, pad, lat_mode, "periodic")

            def reference(m, x, f=f, halo=halo):
                return F.conv2d(pad_reference(x, halo), m.conv.weight, m.conv.bias, f)

            expected = conv_bytes(
                mesh, grid, out, 2, ch, out_ch, (k, k), (f, f), (1, 1), (pad[0], pad[0]),
                (lat_mode, "periodic"), strategy, True,
            )  # fmt: skip
        else:

            def reference(m, x, f=f, mode=mode):
                pool = F.avg_pool2d if mode == "avgpool" else F.max_pool2d
                y = pool(x, f, f, ceil_mode=True)
                return y if m.proj is None else F.conv2d(y, m.proj.weight, m.proj.bias)

            wins = tile_windows(
                _grid_of(mesh, out),
                lambda a, b, f=f, n=grid[0]: (a * f, min(b * f, n)),
                lambda a, b, f=f, n=grid[1]: (a * f, min(b * f, n)),
            )
            expected = 2 * remote_cells(_grid_of(mesh, grid), wins, "zeros", "zeros") * 2 * ch * ELSIZE
            if out_ch != ch:
                expected += _conv1x1_bytes(mesh, out, 2, ch, out_ch, strategy)
        yield check_module(
            mesh,
            f"downsample.{mode}",
            f"{grid[0]}x{grid[1]} {ch}->{out_ch} f{f} {lat_mode} {strategy}",
            build,
            _x((2, ch, *grid), ch * 7 + f),
            grid,
            reference=reference,
            expected_bytes=expected,
        )


# --------------------------------------------------------------------------------- upsample
UP_CASES = [
    # grid, channels, out_channels, mode, factor, kernel, out_grid, lat_mode, strategy
    ((7, 10), 3, 2, "transposed", 2, None, None, "zeros", "weights"),
    ((9, 14), 2, 3, "transposed", 2, 4, None, "pole", "activations"),
    ((9, 14), 3, 3, "transposed", 2, 3, (17, 27), "replicate", "weights"),
    ((7, 10), 3, 2, "nearest", 2, None, (13, 20), "zeros", "weights"),
    ((9, 14), 2, 2, "bilinear", 2, None, (17, 28), "pole", "weights"),
    ((7, 10), 2, 3, "bilinear", 2, None, None, "zeros", "activations"),
    ((6, 9), 2, 2, "bilinear", 3, None, (17, 26), "replicate", "weights"),
]


def _transposed_reference(m, x):
    """``F.conv_transpose2d`` on the input extended by the boundary rules, cropped to the grid."""
    c = m.conv
    n, g = x.shape[-2:], c.out_domain.grid
    no = (g.n_lat, g.n_lon)
    q = [
        max(-(-(k - 1 - p) // s), (o - 1 + p) // s - nn + 1, 0) + 1
        for k, s, p, o, nn in zip(c.kernel, c.stride, c.padding, no, n)
    ]
    z = F.conv_transpose2d(
        pad_reference(x, Halo((q[0], q[0]), (q[1], q[1]), *c.modes)), c.weight, None, c.stride
    )
    r0, c0 = q[0] * c.stride[0] + c.padding[0], q[1] * c.stride[1] + c.padding[1]
    return z[..., r0 : r0 + no[0], c0 : c0 + no[1]] + c.bias.view(1, -1, 1, 1)


def _interp_reference(m, x):
    """nearest: ``F.interpolate``; bilinear: ``F.grid_sample`` (float64 coordinates) on the field
    padded by one point under the boundary rules, at torch's source positions."""
    if m.proj is not None:
        x = F.conv2d(x, m.proj.weight, m.proj.bias)
    g = m.out_domain.grid
    out = (g.n_lat, g.n_lon)
    if m.mode == "nearest":
        return F.interpolate(x, size=out, mode="nearest")
    xp = pad_reference(x, Halo((1, 1), (1, 1), *m.interp.modes))
    coords = []
    for n_in, n_out in zip(x.shape[-2:], out):
        src = (torch.arange(n_out, dtype=torch.float64) + 0.5) * n_in / n_out - 0.5
        coords.append((2 * (src + 1) + 1) / (n_in + 2) - 1)
    gy, gx = torch.meshgrid(*coords, indexing="ij")
    sample = torch.stack([gx, gy], -1).expand(x.shape[0], *out, 2)
    return F.grid_sample(xp.double(), sample, mode="bilinear", align_corners=False).to(x.dtype)


def _interp_windows(mesh: DomainMesh, n_in: tuple[int, int], out: tuple[int, int], mode: str):
    spans = []
    for a, b in zip(n_in, out):
        if mode == "nearest":
            src = F.interpolate(torch.arange(a, dtype=torch.float32).view(1, 1, -1), size=b).view(-1).long()
            spans.append(lambda o0, o1, src=src: (int(src[o0]), int(src[o1 - 1]) + 1))
        else:
            pos = (torch.arange(b, dtype=torch.float64) + 0.5) * a / b - 0.5
            lo = pos.floor().long()
            spans.append(lambda o0, o1, lo=lo: (int(lo[o0]), int(lo[o1 - 1]) + 2))
    return tile_windows(_grid_of(mesh, out), *spans)


@register("upsample")
def check_upsample(mesh: DomainMesh) -> Iterator[Record]:
    for case in UP_CASES:
        grid, ch, out_ch, mode, f, k, out_grid, lat_mode, strategy = case
        out = out_grid or (grid[0] * f, grid[1] * f)
        if not _fits(mesh, grid, out):
            continue

        def build(d: Domain, case=case) -> Upsample:
            _, ch, out_ch, mode, f, k, out_grid, lat_mode, strategy = case
            return Upsample(d, ch, out_ch, mode, f, out_grid, k, lat_mode, strategy=strategy)

        in_grid = _grid_of(mesh, grid)
        if mode == "transposed":
            k = k or f
            p = (k - f) // 2
            wins = tile_windows(
                _grid_of(mesh, out),
                *[lambda o0, o1, k=k, p=p, f=f: (-(-(o0 + p - k + 1) // f), (o1 - 1 + p) // f + 1)] * 2,
            )
            win_counts = [2 * (w[1] - w[0]) * (w[3] - w[2]) for w in wins]
            sizes = [n * k * k for n in Domain.create(mesh, *grid).split_sizes(out_ch)]
            expected = 2 * remote_cells(in_grid, wins, lat_mode, "periodic") * 2 * ch * ELSIZE
            expected += sum(channel_bytes(strategy, win_counts, ch, sizes, False))
            expected += 2 * (mesh.domain.size - 1) * out_ch * ELSIZE  # bias all_gather + reduce-scatter
            reference = _transposed_reference
        else:
            wins = _interp_windows(mesh, grid, out, mode)
            modes = (lat_mode, "periodic") if mode == "bilinear" else ("zeros", "zeros")
            expected = 2 * remote_cells(in_grid, wins, *modes) * 2 * out_ch * ELSIZE
            if out_ch != ch:
                expected += _conv1x1_bytes(mesh, grid, 2, ch, out_ch, strategy)
            reference = _interp_reference
        yield check_module(
            mesh,
            f"upsample.{mode}",
            f"{grid[0]}x{grid[1]}->{out[0]}x{out[1]} {ch}->{out_ch} f{f} k{k} {lat_mode} {strategy}",
            build,
            _x((2, ch, *grid), ch * 5 + f),
            grid,
            reference=reference,
            expected_bytes=expected,
        )


# ------------------------------------------------------------------------------------ patch
PATCH_CASES = [
    # grid, channels, embed_dim, patch, stride, lat_mode (embed) / overlap (recovery), strategy
    ((33, 64), 2, 8, 4, 4, "zeros", "sum", "weights"),
    ((13, 18), 3, 6, 4, 2, "pole", "mean", "activations"),
    ((9, 14), 2, 5, 3, 2, "replicate", "sum", "weights"),
    ((7, 10), 3, 4, 2, 2, "zeros", "mean", "weights"),
]


def _tokens(grid: tuple[int, int], p: int, s: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Token grid and padding before, from the documented rule, written out independently."""
    n_tok = tuple(1 if n <= p else math.ceil((n - p) / s) + 1 for n in grid)
    before = tuple(((t - 1) * s + p - n) // 2 for t, n in zip(n_tok, grid))
    return n_tok, before  # type: ignore[return-value]


@register("patch_embed")
def check_patch_embed(mesh: DomainMesh) -> Iterator[Record]:
    for grid, ch, dim, p, s, lat_mode, _, strategy in PATCH_CASES:
        tok, before = _tokens(grid, p, s)
        if not _fits(mesh, grid, tok):
            continue
        after = tuple((t - 1) * s + p - n - b for t, n, b in zip(tok, grid, before))
        halo = Halo((before[0], after[0]), (before[1], after[1]), lat_mode, "periodic")

        def reference(m, x, p=p, s=s, halo=halo):
            w = m.weight.T.reshape(m.embed_dim, m.in_ch, p, p)
            return F.conv2d(pad_reference(x, halo), w, m.bias, s).permute(0, 2, 3, 1)

        expected = conv_bytes(
            mesh,
            grid,
            tok,
            2,
            ch,
            dim,
            (p, p),
            (s, s),
            (1, 1),
            before,
            (lat_mode, "periodic"),
            strategy,
            True,
        )
        yield check_module(
            mesh,
            "patch_embed",
            f"{grid[0]}x{grid[1]}->{tok[0]}x{tok[1]} {ch}->{dim} p{p} s{s} {lat_mode} {strategy}",
            lambda d, ch=ch, dim=dim, p=p, s=s, lm=lat_mode, st=strategy: PatchEmbed(
                d, ch, dim, p, s, lm, strategy=st
            ),
            _x((2, ch, *grid), p * 3 + s),
            grid,
            out_layout="tokens",
            reference=reference,
            expected_bytes=expected,
        )
    yield from check_patch_embed_data_input(mesh)


class DataInput(nn.Module):
    """A layer fed a tensor that needs no gradient, as a first layer on data is: the weight
    ring then skips ``dX`` and its transfers, and the window gather has no adjoint."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer, self.out_domain = layer, layer.out_domain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x.detach()) + 0 * x.sum()  # the harness then sees a zero input gradient


def check_patch_embed_data_input(mesh: DomainMesh) -> Iterator[Record]:
    grid, ch, dim, p, s, lat_mode, _, strategy = PATCH_CASES[0]
    tok, before = _tokens(grid, p, s)
    if not _fits(mesh, grid, tok):
        return
    after = tuple((t - 1) * s + p - n - b for t, n, b in zip(tok, grid, before))
    halo = Halo((before[0], after[0]), (before[1], after[1]), lat_mode, "periodic")

    def reference(m, x):
        w = m.layer.weight.T.reshape(dim, ch, p, p)
        y = F.conv2d(pad_reference(x.detach(), halo), w, m.layer.bias, s).permute(0, 2, 3, 1)
        return y + 0 * x.sum()

    wins = tile_windows(_grid_of(mesh, tok), conv_receptive(0, p, s, 1, before[0]),
                        conv_receptive(0, p, s, 1, before[1]))  # fmt: skip
    halo_fwd = remote_cells(_grid_of(mesh, grid), wins, lat_mode, "periodic") * 2 * ch * ELSIZE
    ring = (mesh.domain.size - 1) * (ch * p * p + 1) * dim * ELSIZE  # forward ring, dW reduce-scatter
    yield check_module(
        mesh,
        "patch_embed.data_input",
        f"{grid[0]}x{grid[1]}->{tok[0]}x{tok[1]} {ch}->{dim} p{p} s{s} {lat_mode} {strategy}",
        lambda d: DataInput(PatchEmbed(d, ch, dim, p, s, lat_mode, strategy=strategy)),
        _x((2, ch, *grid), p * 3 + s),
        grid,
        out_layout="tokens",
        reference=reference,
        expected_bytes=halo_fwd + 2 * ring,
    )


@register("patch_recovery")
def check_patch_recovery(mesh: DomainMesh) -> Iterator[Record]:
    for grid, ch, dim, p, s, _, overlap, strategy in PATCH_CASES:
        tok, before = _tokens(grid, p, s)
        if not _fits(mesh, grid, tok):
            continue
        padded = tuple((t - 1) * s + p for t in tok)

        def reference(m, x, p=p, s=s, padded=padded, before=before, grid=grid, tok=tok):
            cols = (x.reshape(x.shape[0], -1, m.embed_dim) @ m.weight + m.bias).transpose(1, 2)
            crop = (..., slice(before[0], before[0] + grid[0]), slice(before[1], before[1] + grid[1]))
            y = F.fold(cols, padded, p, stride=s)[crop]
            if m.overlap == "mean":
                y = y / F.fold(torch.ones(1, p * p, tok[0] * tok[1]), padded, p, stride=s)[crop]
            return y

        foot = lambda b0, s=s, p=p: lambda a, b: (a * s - b0, (b - 1) * s - b0 + p)  # noqa: E731
        wins = tile_windows(_grid_of(mesh, tok), foot(before[0]), foot(before[1]))
        d_tok = Domain.create(mesh, *tok)
        expected = 2 * remote_cells(_grid_of(mesh, grid), wins, "zeros", "zeros") * 2 * ch * ELSIZE
        expected += sum(channel_bytes(strategy, d_tok.counts(2), dim, d_tok.split_sizes(ch * p * p), True))
        yield check_module(
            mesh,
            "patch_recovery",
            f"{tok[0]}x{tok[1]}->{grid[0]}x{grid[1]} {dim}->{ch} p{p} s{s} {overlap} {strategy}",
            lambda d, ch=ch, dim=dim, p=p, s=s, g=grid, ov=overlap, st=strategy: PatchRecovery(
                d, dim, ch, p, s, g, ov, strategy=st
            ),
            _x((2, *tok, dim), p * 5 + s),
            tok,
            layout="tokens",
            out_layout="field",
            reference=reference,
            expected_bytes=expected,
        )
