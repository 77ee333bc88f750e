"""Validator checks for convolution, resampling and patch layers, against plain torch.

Every reference runs torch's own operator (``F.conv2d``, ``F.avg_pool2d``, ``F.max_pool2d``,
``F.conv_transpose2d``, ``F.interpolate``, ``F.grid_sample``, ``F.fold``) on the global field,
padded by the serial ``pad_reference`` where the sphere's boundary rules apply, with the serial
module's full parameters. Expected communication is derived independently of the layers: the
halo/window cells come from padding a field of owner ids with the serial reference, the matmul
bytes from ``channel_bytes``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F

from ..distributed.halo import Halo, Window, pad_reference, window_reference
from ..distributed.matmul import channel_bytes
from ..distributed.mesh import DomainMesh
from ..distributed.tiles import TileGrid
from ..layers.base import Domain, local_domain
from ..layers.conv import Conv2d
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
    """Forward + backward bytes of an im2col convolution: window gather (and its adjoint) plus
    the channel matmul of ``cin*kh*kw`` columns into ``cout``."""
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

        def reference(m, x, s=s, dil=dil, halo=Halo((pt, pb), (pl, pr), lat_mode, lon_mode)):
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
