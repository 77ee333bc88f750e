"""Validator checks for the distributed core: halo exchange and the distributed matmul.

Every rank builds the same global tensors from a fixed seed, runs the serial reference on them
and the sharded op on its tile, and compares its slice. Expected communication is derived
independently of the op's implementation (halo: by padding a field of owner ids with the
serial reference; matmul: the closed-form byte counts).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..distributed.collectives import all_gather, all_reduce, reduce_scatter
from ..distributed.comm import ledger
from ..distributed.halo import (
    Halo,
    gather_windows,
    halo_exchange,
    pad_reference,
    scatter_add_windows,
    window_reference,
)
from ..distributed.matmul import channel_bytes, matmul_channels, matmul_tokens, token_bytes
from ..distributed.mesh import DomainMesh
from ..distributed.tiles import TileGrid, split_offsets, split_sizes
from .registry import Record, measure, register, rel_error

GRIDS = [(8, 12), (7, 10), (13, 18)]  # divisible on small meshes, uneven, uneven and odd
HALOS = [
    Halo((1, 1), (1, 1), "zeros"),
    Halo((2, 1), (1, 3), "replicate"),
    Halo((1, 2), (2, 1), "pole"),
    Halo((3, 3), (5, 5), "pole"),  # wider than most tiles: draws on ranks further away
]


def _mesh_name(mesh: DomainMesh) -> str:
    return f"{mesh.shape.lat}x{mesh.shape.lon}"


def _window(padded: torch.Tensor, grid: TileGrid, halo: Halo, k: int) -> torch.Tensor:
    t = grid.tile_of(k)
    return padded[..., t.lat_start : t.lat_stop + sum(halo.lat), t.lon_start : t.lon_stop + sum(halo.lon)]


def _expected_halo_bytes(grid: TileGrid, halo: Halo, lead: int, elsize: int) -> int:
    owners = torch.zeros(grid.n_lat, grid.n_lon)
    for k, t in enumerate(grid.tiles()):
        owners[t.slices] = k + 1
    padded = pad_reference(owners, halo)
    remote = 0
    for k in range(grid.n_tiles):
        w = _window(padded, grid, halo, k)
        remote += int(((w != 0) & (w != k + 1)).sum())
    return remote * lead * elsize


def _expected_window_bytes(grid: TileGrid, windows, mode: str, lead: int, elsize: int) -> int:
    """Window cells owned by another rank (zero padding excluded), found by gathering owner ids
    with the serial ``window_reference`` — independent of the exchange plan."""
    owners = torch.zeros(grid.n_lat, grid.n_lon)
    for k, t in enumerate(grid.tiles()):
        owners[t.slices] = k + 1
    remote = 0
    for k, w in enumerate(windows):
        ids = window_reference(owners, w, mode, "periodic")  # type: ignore[arg-type]
        remote += int(((ids != 0) & (ids != k + 1)).sum())
    return remote * lead * elsize


@register("halo_exchange")
def check_halo(mesh: DomainMesh) -> Iterator[Record]:
    axis = mesh.domain
    for n_lat, n_lon in GRIDS:
        if n_lat < mesh.shape.lat or n_lon < mesh.shape.lon:
            continue
        grid = TileGrid(n_lat, n_lon, mesh.shape.lat, mesh.shape.lon)
        for halo in HALOS:
            gen = torch.Generator().manual_seed(n_lat * 100 + n_lon)
            x = torch.randn(2, 3, n_lat, n_lon, generator=gen, requires_grad=True)
            ref = pad_reference(x, halo)
            cot = [torch.randn(_window(ref, grid, halo, k).shape, generator=gen) for k in range(grid.n_tiles)]
            sum((_window(ref, grid, halo, k) * cot[k]).sum() for k in range(grid.n_tiles)).backward()

            me = axis.index
            local = grid.scatter(x.detach(), me).requires_grad_(True)
            ledger.reset()
            out = halo_exchange(local, grid, halo, axis)
            out.backward(cot[me])
            err_f = rel_error(out, _window(ref, grid, halo, me))
            err_b = rel_error(local.grad, grid.scatter(x.grad, me))
            lead_bytes = 2 * 3
            rec = Record(
                "halo_exchange",
                _mesh_name(mesh),
                f"{n_lat}x{n_lon} lat{halo.lat}/{halo.lat_mode} lon{halo.lon}",
                expected_bytes=2 * _expected_halo_bytes(grid, halo, lead_bytes, 4),
            )
            yield measure(rec, [err_f], [err_b], ledger.bytes_sent)


def _patch_windows(grid: TileGrid, out: TileGrid, patch: int, stride: int, pad: int):
    """Receptive fields of each rank's output tile for a patch/stride layer (as patch embed uses)."""
    wins = []
    for t in out.tiles():
        wins.append(
            (
                t.lat_start * stride - pad,
                (t.lat_stop - 1) * stride - pad + patch,
                t.lon_start * stride - pad,
                (t.lon_stop - 1) * stride - pad + patch,
            )
        )
    return tuple(wins)


@register("gather_windows")
def check_windows(mesh: DomainMesh) -> Iterator[Record]:
    axis, lat, lon = mesh.domain, mesh.shape.lat, mesh.shape.lon
    for (n_lat, n_lon), patch, stride, pad, mode in [
        ((13, 18), 4, 4, 1, "pole"),
        ((21, 16), 3, 2, 1, "replicate"),
        ((9, 12), 5, 3, 2, "zeros"),
    ]:
        grid = TileGrid(n_lat, n_lon, lat, lon)
        n_out = ((n_lat + 2 * pad - patch) // stride + 1, (n_lon + 2 * pad - patch) // stride + 1)
        if n_out[0] < lat or n_out[1] < lon:
            continue
        out = TileGrid(*n_out, lat, lon)
        windows = _patch_windows(grid, out, patch, stride, pad)
        gen = torch.Generator().manual_seed(n_lat + n_lon)
        x = torch.randn(2, n_lat, n_lon, generator=gen, requires_grad=True)
        refs = [window_reference(x, w, mode, "periodic") for w in windows]
        cot = [torch.randn(r.shape, generator=gen) for r in refs]
        sum((r * c).sum() for r, c in zip(refs, cot)).backward()
        me = axis.index
        local = grid.scatter(x.detach(), me).requires_grad_(True)
        ledger.reset()
        got = gather_windows(local, grid, windows, axis, mode, "periodic")
        got.backward(cot[me])
        shape = f"{n_lat}x{n_lon} p{patch} s{stride} pad{pad} {mode}"
        expected = 2 * _expected_window_bytes(grid, windows, mode, 2, 4)  # forward + backward
        rec = Record("gather_windows", _mesh_name(mesh), shape, expected_bytes=expected)
        yield measure(
            rec,
            [rel_error(got, refs[me])],
            [rel_error(local.grad, grid.scatter(x.grad, me))],
            ledger.bytes_sent,
        )
        # the adjoint: scatter-add of per-rank window data, against autograd of the reference
        z = torch.zeros(2, n_lat, n_lon, requires_grad=True)
        sum((window_reference(z, w, mode, "periodic") * c).sum() for w, c in zip(windows, cot)).backward()
        y = cot[me].clone().requires_grad_(True)
        ledger.reset()
        got = scatter_add_windows(y, grid, windows, axis, mode, "periodic")
        cot2 = torch.randn(2, n_lat, n_lon, generator=gen)
        got.backward(grid.scatter(cot2, me))
        rec = Record("scatter_add_windows", _mesh_name(mesh), shape, expected_bytes=expected)
        yield measure(
            rec,
            [rel_error(got, grid.scatter(z.grad, me))],
            [rel_error(y.grad, window_reference(cot2, windows[me], mode, "periodic"))],
            ledger.bytes_sent,
        )


def _channel_case(
    mesh: DomainMesh, grid: TileGrid, batch: int, cin: int, cout: int, strategy: str, bias: bool
) -> Record:
    axis = mesh.domain
    P, q = axis.size, axis.index
    counts = [batch * t.shape[0] * t.shape[1] for t in grid.tiles()]
    out_sizes = split_sizes(cout, P)
    rows, cols = split_offsets(tuple(counts)), split_offsets(out_sizes)
    gen = torch.Generator().manual_seed(cin * 1000 + cout)
    x = torch.randn(sum(counts), cin, generator=gen, requires_grad=True)
    w = (torch.randn(cin, cout, generator=gen) / cin**0.5).requires_grad_(True)
    b = torch.randn(cout, generator=gen).requires_grad_(True) if bias else None
    g = torch.randn(sum(counts), cout, generator=gen)
    y = x @ w + (b if bias else 0)
    (y * g).sum().backward()

    xl = x.detach()[rows[q] : rows[q + 1]].clone().requires_grad_(True)
    wl = w.detach()[:, cols[q] : cols[q + 1]].clone().requires_grad_(True)
    bl = b.detach()[cols[q] : cols[q + 1]].clone().requires_grad_(True) if bias else None
    ledger.reset()
    yl = matmul_channels(xl, wl, bl, axis, out_sizes, counts, strategy)  # type: ignore[arg-type]
    fwd_bytes = ledger.bytes_sent
    yl.backward(g[rows[q] : rows[q + 1]])
    errs_b = [
        rel_error(xl.grad, x.grad[rows[q] : rows[q + 1]]),
        rel_error(wl.grad, w.grad[:, cols[q] : cols[q + 1]]),
    ]
    if bias:
        errs_b.append(rel_error(bl.grad, b.grad[cols[q] : cols[q + 1]]))
    expected = channel_bytes(strategy, counts, cin, out_sizes, bias)
    rec = Record(
        f"matmul_channels.{strategy}",
        _mesh_name(mesh),
        f"grid{grid.n_lat}x{grid.n_lon} b{batch} {cin}->{cout}{' +bias' if bias else ''}",
        expected_bytes=sum(expected),
        extra={"forward_bytes": expected[0], "backward_bytes": expected[1]},
    )
    total = torch.tensor([fwd_bytes], dtype=torch.float64)
    rec = measure(rec, [rel_error(yl, y[rows[q] : rows[q + 1]])], errs_b, ledger.bytes_sent)
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(total)
    rec.extra["measured_forward_bytes"] = int(total.item())
    return rec


def _token_case(
    mesh: DomainMesh, grid: TileGrid, out_grid: TileGrid, channels: int, strategy: str, bias: bool
) -> Record:
    axis = mesh.domain
    q = axis.index
    in_counts = [t.shape[0] * t.shape[1] for t in grid.tiles()]
    out_counts = [t.shape[0] * t.shape[1] for t in out_grid.tiles()]
    rows_in, rows_out = split_offsets(tuple(in_counts)), split_offsets(tuple(out_counts))
    gen = torch.Generator().manual_seed(sum(in_counts) * 7 + channels)
    x = torch.randn(sum(in_counts), channels, generator=gen, requires_grad=True)
    a = (torch.randn(sum(out_counts), sum(in_counts), generator=gen) / 4).requires_grad_(True)
    b = torch.randn(sum(out_counts), generator=gen).requires_grad_(True) if bias else None
    g = torch.randn(sum(out_counts), channels, generator=gen)
    y = a @ x + (b.unsqueeze(-1) if bias else 0)
    (y * g).sum().backward()

    sl_in, sl_out = slice(rows_in[q], rows_in[q + 1]), slice(rows_out[q], rows_out[q + 1])
    xl = x.detach()[sl_in].clone().requires_grad_(True)
    al = a.detach()[sl_out].clone().requires_grad_(True)
    bl = b.detach()[sl_out].clone().requires_grad_(True) if bias else None
    ledger.reset()
    yl = matmul_tokens(xl, al, bl, axis, in_counts, out_counts, strategy)  # type: ignore[arg-type]
    yl.backward(g[sl_out])
    errs_b = [rel_error(xl.grad, x.grad[sl_in]), rel_error(al.grad, a.grad[sl_out])]
    if bias:
        errs_b.append(rel_error(bl.grad, b.grad[sl_out]))
    expected = token_bytes(strategy, in_counts, out_counts, channels)
    rec = Record(
        f"matmul_tokens.{strategy}",
        _mesh_name(mesh),
        f"tokens {grid.n_lat}x{grid.n_lon}->{out_grid.n_lat}x{out_grid.n_lon} c{channels}"
        f"{' +bias' if bias else ''}",
        expected_bytes=sum(expected),
        extra={"forward_bytes": expected[0], "backward_bytes": expected[1]},
    )
    return measure(rec, [rel_error(yl, y[sl_out])], errs_b, ledger.bytes_sent)


@register("matmul")
def check_matmul(mesh: DomainMesh) -> Iterator[Record]:
    lat, lon = mesh.shape.lat, mesh.shape.lon
    for strategy in ("weights", "activations"):
        for (n_lat, n_lon), batch, cin, cout, bias in [
            ((8, 12), 1, 16, 24, True),
            ((7, 10), 2, 12, 7, True),  # uneven tiles and uneven weight shards
            ((5, 9), 1, 9, 3, False),  # fewer output columns than ranks on 1x4
        ]:
            yield _channel_case(mesh, TileGrid(n_lat, n_lon, lat, lon), batch, cin, cout, strategy, bias)
        for (gi, go), channels, bias in [
            (((8, 12), (8, 12)), 6, True),
            (((7, 10), (5, 6)), 5, True),  # fewer output tokens, uneven both sides
            (((6, 9), (9, 13)), 4, False),
        ]:
            yield _token_case(
                mesh, TileGrid(*gi, lat, lon), TileGrid(*go, lat, lon), channels, strategy, bias
            )


@register("collectives")
def check_collectives(mesh: DomainMesh) -> Iterator[Record]:
    """all_gather / reduce_scatter / all_reduce along lat, lon and domain axes, uneven sizes."""
    for name in ("lat", "lon", "domain"):
        axis = mesh.axis(name)
        P, k = axis.size, axis.index
        sizes = tuple(3 + (j % 2) for j in range(P))  # uneven: 3, 4, 3, 4, ...
        offs = split_offsets(sizes)
        gen = torch.Generator().manual_seed(P)
        parts = [torch.randn(2, sizes[j], 5, generator=gen) for j in range(P)]
        cot = torch.randn(2, sum(sizes), 5, generator=gen)
        shape = f"axis={name} sizes={sizes}"
        # all_gather: every rank returns the concat; grads of all ranks' cotangents sum at the owner
        x = parts[k].clone().requires_grad_(True)
        ledger.reset()
        y = all_gather(x, axis, 1, sizes)
        y.backward(cot)
        want_grad = cot[:, offs[k] : offs[k + 1]] * P
        # every rank sends its piece to P-1 peers; backward returns P-1 slices to their owners
        groups = mesh.shape.world_size // P  # independent groups along this axis, all measured
        moved = groups * 2 * (P - 1) * 2 * sum(sizes) * 5 * 4
        rec = Record("all_gather", _mesh_name(mesh), shape, expected_bytes=moved)
        yield measure(
            rec, [rel_error(y, torch.cat(parts, 1))], [rel_error(x.grad, want_grad)], ledger.bytes_sent
        )
        # reduce_scatter of per-rank full tensors (rank j contributes full_j = parts-based tensor)
        fulls = [torch.randn(2, sum(sizes), 5, generator=gen) for _ in range(P)]
        g = torch.randn(2, sizes[k], 5, generator=gen)
        x = fulls[k].clone().requires_grad_(True)
        ledger.reset()
        y = reduce_scatter(x, axis, 1, sizes)
        y.backward(g)
        total = sum(fulls)[:, offs[k] : offs[k + 1]]
        # d/dx_k of sum_j <g_j, slice_j(sum fulls)> = concat of all ranks' g_j: check own slice
        rec = Record("reduce_scatter", _mesh_name(mesh), shape, expected_bytes=moved)
        yield measure(
            rec, [rel_error(y, total)], [rel_error(x.grad[:, offs[k] : offs[k + 1]], g)], ledger.bytes_sent
        )
        x = fulls[k].clone().requires_grad_(True)
        ledger.reset()
        y = all_reduce(x, axis)
        y.backward(cot)
        rec = Record("all_reduce", _mesh_name(mesh), shape)
        yield measure(rec, [rel_error(y, sum(fulls))], [rel_error(x.grad, cot * P)], ledger.bytes_sent)


@register("matmul_bf16")
def check_matmul_bf16(mesh: DomainMesh) -> Iterator[Record]:
    """Both forms and strategies under bf16 autocast, against the fp32 serial result.

    Gradients must come back in each input's dtype (fp32 weights), and within bf16 accuracy.
    """
    axis, q = mesh.domain, mesh.domain.index
    grid = TileGrid(7, 10, mesh.shape.lat, mesh.shape.lon)
    counts = [t.shape[0] * t.shape[1] for t in grid.tiles()]
    rows = split_offsets(tuple(counts))
    gen = torch.Generator().manual_seed(5)
    for strategy in ("weights", "activations"):
        for bias in (False, True):
            cin, cout = 16, 12
            outs = split_sizes(cout, axis.size)
            cols = split_offsets(outs)
            x = torch.randn(sum(counts), cin, generator=gen, requires_grad=True)
            w = torch.randn(cin, cout, generator=gen, requires_grad=True)
            b = torch.randn(cout, generator=gen, requires_grad=True) if bias else None
            g = torch.randn(sum(counts), cout, generator=gen)
            ((x @ w + (b if bias else 0)) * g).sum().backward()
            xl = x.detach()[rows[q] : rows[q + 1]].clone().requires_grad_(True)
            wl = w.detach()[:, cols[q] : cols[q + 1]].clone().requires_grad_(True)
            bl = b.detach()[cols[q] : cols[q + 1]].clone().requires_grad_(True) if bias else None
            ledger.reset()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                yl = matmul_channels(xl, wl, bl, axis, outs, counts, strategy)  # type: ignore[arg-type]
            yl.float().backward(g[rows[q] : rows[q + 1]])
            ok_dtype = wl.grad.dtype == torch.float32 and xl.grad.dtype == torch.float32
            ref = (x @ w + (b if bias else 0)).detach()[rows[q] : rows[q + 1]]
            rec = Record(
                f"matmul_channels_bf16.{strategy}",
                _mesh_name(mesh),
                f"grid7x10 {cin}->{cout}{' +bias' if bias else ''}",
                tolerance=3e-2,
            )
            errs_b = [
                rel_error(xl.grad, x.grad[rows[q] : rows[q + 1]]),
                rel_error(wl.grad, w.grad[:, cols[q] : cols[q + 1]]),
            ]
            rec = measure(
                rec, [rel_error(yl.float(), ref)], errs_b if ok_dtype else [float("inf")], ledger.bytes_sent
            )
            yield rec
        n = sum(counts)
        x = torch.randn(n, 6, generator=gen, requires_grad=True)
        a = torch.randn(n, n, generator=gen).div(4).requires_grad_(True)
        g = torch.randn(n, 6, generator=gen)
        ((a @ x) * g).sum().backward()
        xl = x.detach()[rows[q] : rows[q + 1]].clone().requires_grad_(True)
        al = a.detach()[rows[q] : rows[q + 1]].clone().requires_grad_(True)
        ledger.reset()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            yl = matmul_tokens(xl, al, None, axis, counts, counts, strategy)  # type: ignore[arg-type]
        yl.float().backward(g[rows[q] : rows[q + 1]])
        ok_dtype = al.grad.dtype == torch.float32 and xl.grad.dtype == torch.float32
        rec = Record(f"matmul_tokens_bf16.{strategy}", _mesh_name(mesh), "tokens 7x10 c6", tolerance=3e-2)
        errs_b = [
            rel_error(xl.grad, x.grad[rows[q] : rows[q + 1]]),
            rel_error(al.grad, a.grad[rows[q] : rows[q + 1]]),
        ]
        yield measure(
            rec,
            [rel_error(yl.float(), (a @ x).detach()[rows[q] : rows[q + 1]])],
            errs_b if ok_dtype else [float("inf")],
            ledger.bytes_sent,
        )
