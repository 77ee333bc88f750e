"""Validator checks for the distributed core: halo exchange and the distributed matmul.

Every rank builds the same global tensors from a fixed seed, runs the serial reference on them
in float32 and in float64 (``serial_pair``) and the sharded op on its tile, and the registry's
judge compares its slice with both. The matmul cases price the summed terms (``|X|·|W|``) for
the judge's floor. Expected communication is derived
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
from ..distributed.pair import matmul_pair, pair_bytes
from ..distributed.tiles import TileGrid, split_offsets, split_sizes
from ..layers.mlp import activation_grad
from .registry import BF16_TOLERANCE, Diff, Record, compare, measure, register

GRIDS = [(8, 12), (7, 10), (13, 18)]  # divisible on small meshes, uneven, uneven and odd
HALOS = [
    Halo((1, 1), (1, 1), "zeros"),
    Halo((2, 1), (1, 3), "replicate"),
    Halo((1, 2), (2, 1), "pole"),
    Halo((3, 3), (5, 5), "pole"),  # wider than most tiles: draws on ranks further away
]


def _mesh_name(mesh: DomainMesh) -> str:
    return f"{mesh.shape.lat}x{mesh.shape.lon}"


def serial_pair(fn, inputs: list, cotangents: list) -> tuple[list, list, list, list]:
    """``fn(*inputs)`` (a list of outputs) in float32 and float64, with the gradients of
    ``Σ <output, cotangent>`` w.r.t. the inputs: ``(outs32, grads32, outs64, grads64)``."""
    runs = []
    for dt in (torch.float32, torch.float64):
        xs = [None if t is None else t.detach().to(dt).requires_grad_(True) for t in inputs]
        outs = fn(*xs)
        sum((o * c.to(dt)).sum() for o, c in zip(outs, cotangents)).backward()
        runs.append(([o.detach() for o in outs], [None if t is None else t.grad for t in xs]))
    (o32, g32), (o64, g64) = runs
    return o32, g32, o64, g64


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
            x = torch.randn(2, 3, n_lat, n_lon, generator=gen)
            ref = pad_reference(x, halo)
            cot = [torch.randn(_window(ref, grid, halo, k).shape, generator=gen) for k in range(grid.n_tiles)]

            def windows(t, grid=grid, halo=halo):
                padded = pad_reference(t, halo)
                return [_window(padded, grid, halo, k) for k in range(grid.n_tiles)]

            o32, (g32,), o64, (g64,) = serial_pair(windows, [x], cot)
            me = axis.index
            local = grid.scatter(x, me).requires_grad_(True)
            ledger.reset()
            out = halo_exchange(local, grid, halo, axis)
            out.backward(cot[me])
            err_f = compare(out, o64[me], o32[me])
            err_b = compare(local.grad, grid.scatter(g64, me), grid.scatter(g32, me))
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
        x = torch.randn(2, n_lat, n_lon, generator=gen)
        cot = [torch.randn(window_reference(x, w, mode, "periodic").shape, generator=gen) for w in windows]

        def gather(t, windows=windows, mode=mode):
            return [window_reference(t, w, mode, "periodic") for w in windows]

        o32, (g32,), o64, (g64,) = serial_pair(gather, [x], cot)
        me = axis.index
        local = grid.scatter(x, me).requires_grad_(True)
        ledger.reset()
        got = gather_windows(local, grid, windows, axis, mode, "periodic")
        got.backward(cot[me])
        shape = f"{n_lat}x{n_lon} p{patch} s{stride} pad{pad} {mode}"
        expected = 2 * _expected_window_bytes(grid, windows, mode, 2, 4)  # forward + backward
        rec = Record("gather_windows", _mesh_name(mesh), shape, expected_bytes=expected)
        yield measure(
            rec,
            [compare(got, o64[me], o32[me])],
            [compare(local.grad, grid.scatter(g64, me), grid.scatter(g32, me))],
            ledger.bytes_sent,
        )
        # the adjoint: scatter-add of per-rank window data, against autograd of the reference
        cot2 = torch.randn(2, n_lat, n_lon, generator=gen)
        z = torch.zeros(2, n_lat, n_lon)
        _, (s32,), _, (s64,) = serial_pair(gather, [z], cot)
        y = cot[me].clone().requires_grad_(True)
        ledger.reset()
        got = scatter_add_windows(y, grid, windows, axis, mode, "periodic")
        got.backward(grid.scatter(cot2, me))
        back32 = window_reference(cot2, windows[me], mode, "periodic")
        back64 = window_reference(cot2.double(), windows[me], mode, "periodic")
        rec = Record("scatter_add_windows", _mesh_name(mesh), shape, expected_bytes=expected)
        yield measure(
            rec,
            [compare(got, grid.scatter(s64, me), grid.scatter(s32, me))],
            [compare(y.grad, back64, back32)],
            ledger.bytes_sent,
        )


def _affine_ref(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> list[torch.Tensor]:
    return [x @ w + b if b is not None else x @ w]


def _token_ref(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor | None) -> list[torch.Tensor]:
    return [a @ x + b.unsqueeze(-1) if b is not None else a @ x]


def _matmul_record(op: str, mesh: DomainMesh, shape: str, expected: tuple[int, int]) -> Record:
    """A record expecting ``expected`` (forward, backward) bytes, each also kept in ``extra``."""
    extra = {"forward_bytes": expected[0], "backward_bytes": expected[1]}
    return Record(op, _mesh_name(mesh), shape, expected_bytes=sum(expected), extra=extra)


def _matmul_errors(
    y: torch.Tensor, local: list, serial: tuple, terms: list[torch.Tensor], cuts: list
) -> tuple[list[Diff], list[Diff]]:
    """Forward and backward errors of a matmul case: the output ``y`` and the gradients of the
    local ``(x, weight, bias)`` (skipped where there is none: no dX, no bias) against the serial
    ``(y32, g32, y64, g64)`` and ``terms`` ``(y, dx, dw, db)``, cut to this rank by ``cuts``
    ``(y, x, weight, bias)``."""
    (y32,), g32, (y64,), g64 = serial
    fwd = [compare(y, y64[cuts[0]], y32[cuts[0]], terms[0][cuts[0]])]
    bwd = [
        compare(t.grad, g64[i][cut], g32[i][cut], terms[i + 1][cut])
        for i, (t, cut) in enumerate(zip(local, cuts[1:]))
        if t is not None and t.requires_grad
    ]
    return fwd, bwd


def _channel_case(
    mesh: DomainMesh,
    grid: TileGrid,
    batch: int,
    cin: int,
    cout: int,
    strategy: str,
    bias: bool,
    input_grad: bool = True,
) -> Record:
    axis = mesh.domain
    P, q = axis.size, axis.index
    counts = [batch * t.shape[0] * t.shape[1] for t in grid.tiles()]
    out_sizes = split_sizes(cout, P)
    rows, cols = split_offsets(tuple(counts)), split_offsets(out_sizes)
    gen = torch.Generator().manual_seed(cin * 1000 + cout)
    x = torch.randn(sum(counts), cin, generator=gen)
    w = torch.randn(cin, cout, generator=gen) / cin**0.5
    b = torch.randn(cout, generator=gen) if bias else None
    g = torch.randn(sum(counts), cout, generator=gen)
    serial = serial_pair(_affine_ref, [x, w, b], [g])
    ax, aw, ag = x.double().abs(), w.double().abs(), g.double().abs()
    terms = [ax @ aw, ag @ aw.T, ax.T @ ag, ag.sum(0)]  # y, dx, dw, db

    r, c = slice(rows[q], rows[q + 1]), slice(cols[q], cols[q + 1])
    xl = x[r].clone().requires_grad_(input_grad)
    wl = w[:, c].clone().requires_grad_(True)
    bl = b[c].clone().requires_grad_(True) if bias else None
    ledger.reset()
    yl = matmul_channels(xl, wl, bl, axis, out_sizes, counts, strategy)  # type: ignore[arg-type]
    fwd_bytes = ledger.bytes_sent
    yl.backward(g[r])
    errs = _matmul_errors(yl, [xl, wl, bl], serial, terms, [r, r, (slice(None), c), c])
    expected = channel_bytes(strategy, counts, cin, out_sizes, bias, input_grad=input_grad)
    rec = _matmul_record(
        f"matmul_channels.{strategy}",
        mesh,
        f"grid{grid.n_lat}x{grid.n_lon} b{batch} {cin}->{cout}{' +bias' if bias else ''}"
        f"{'' if input_grad else ' no dX'}",
        expected,
    )
    total = torch.tensor([fwd_bytes], dtype=torch.float64)
    rec = measure(rec, *errs, ledger.bytes_sent)
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(total)
    rec.extra["measured_forward_bytes"] = int(total.item())
    return rec


def _token_case(
    mesh: DomainMesh,
    grid: TileGrid,
    out_grid: TileGrid,
    channels: int,
    strategy: str,
    bias: bool,
    input_grad: bool = True,
) -> Record:
    axis = mesh.domain
    q = axis.index
    in_counts = [t.shape[0] * t.shape[1] for t in grid.tiles()]
    out_counts = [t.shape[0] * t.shape[1] for t in out_grid.tiles()]
    rows_in, rows_out = split_offsets(tuple(in_counts)), split_offsets(tuple(out_counts))
    gen = torch.Generator().manual_seed(sum(in_counts) * 7 + channels)
    x = torch.randn(sum(in_counts), channels, generator=gen)
    a = torch.randn(sum(out_counts), sum(in_counts), generator=gen) / 4
    b = torch.randn(sum(out_counts), generator=gen) if bias else None
    g = torch.randn(sum(out_counts), channels, generator=gen)
    serial = serial_pair(_token_ref, [x, a, b], [g])
    ax, aa, ag = x.double().abs(), a.double().abs(), g.double().abs()
    terms = [aa @ ax, aa.T @ ag, ag @ ax.T, ag.sum(-1)]  # y, dx, da, db

    sl_in, sl_out = slice(rows_in[q], rows_in[q + 1]), slice(rows_out[q], rows_out[q + 1])
    xl = x[sl_in].clone().requires_grad_(input_grad)
    al = a[sl_out].clone().requires_grad_(True)
    bl = b[sl_out].clone().requires_grad_(True) if bias else None
    ledger.reset()
    yl = matmul_tokens(xl, al, bl, axis, in_counts, out_counts, strategy)  # type: ignore[arg-type]
    yl.backward(g[sl_out])
    errs = _matmul_errors(yl, [xl, al, bl], serial, terms, [sl_out, sl_in, sl_out, sl_out])
    expected = token_bytes(strategy, in_counts, out_counts, channels, input_grad=input_grad)
    rec = _matmul_record(
        f"matmul_tokens.{strategy}",
        mesh,
        f"tokens {grid.n_lat}x{grid.n_lon}->{out_grid.n_lat}x{out_grid.n_lon} c{channels}"
        f"{' +bias' if bias else ''}{'' if input_grad else ' no dX'}",
        expected,
    )
    return measure(rec, *errs, ledger.bytes_sent)


@register("matmul")
def check_matmul(mesh: DomainMesh) -> Iterator[Record]:
    lat, lon = mesh.shape.lat, mesh.shape.lon
    for strategy in ("weights", "activations"):
        for (n_lat, n_lon), batch, cin, cout, bias, dx in [
            ((8, 12), 1, 16, 24, True, True),
            ((7, 10), 2, 12, 7, True, True),  # uneven tiles and uneven weight shards
            ((5, 9), 1, 9, 3, False, True),  # fewer output columns than ranks on 1x4
            ((7, 10), 1, 12, 7, True, False),  # input needs no gradient: no dX, nor its bytes
        ]:
            grid = TileGrid(n_lat, n_lon, lat, lon)
            yield _channel_case(mesh, grid, batch, cin, cout, strategy, bias, dx)
        for (gi, go), channels, bias, dx in [
            (((8, 12), (8, 12)), 6, True, True),
            (((7, 10), (5, 6)), 5, True, True),  # fewer output tokens, uneven both sides
            (((6, 9), (9, 13)), 4, False, True),
            (((7, 10), (5, 6)), 5, True, False),  # no dX
        ]:
            yield _token_case(
                mesh, TileGrid(*gi, lat, lon), TileGrid(*go, lat, lon), channels, strategy, bias, dx
            )


@register("collectives")
def check_collectives(mesh: DomainMesh) -> Iterator[Record]:
    """all_gather / reduce_scatter / all_reduce along lat, lon and domain axes, uneven sizes."""
    for name in ("lat", "lon", "domain"):
        axis = mesh.axis(name)
        P, k = axis.size, axis.index
        sizes = tuple(3 + (j % 2) for j in range(P))  # uneven: 3, 4, 3, 4, ...
        offs = split_offsets(sizes)
        mine = slice(offs[k], offs[k + 1])
        gen = torch.Generator().manual_seed(P)
        parts = [torch.randn(2, sizes[j], 5, generator=gen) for j in range(P)]
        cot = torch.randn(2, sum(sizes), 5, generator=gen)
        shape = f"axis={name} sizes={sizes}"
        # all_gather: every rank returns the concat; grads of all ranks' cotangents sum at the owner
        x = parts[k].clone().requires_grad_(True)
        ledger.reset()
        y = all_gather(x, axis, 1, sizes)
        y.backward(cot)
        whole = torch.cat(parts, 1)
        # every rank sends its piece to P-1 peers; backward returns P-1 slices to their owners
        groups = mesh.shape.world_size // P  # independent groups along this axis, all measured
        moved = groups * 2 * (P - 1) * 2 * sum(sizes) * 5 * 4
        rec = Record("all_gather", _mesh_name(mesh), shape, expected_bytes=moved)
        grad_b = [compare(x.grad, cot.double()[:, mine] * P, (cot * P)[:, mine])]
        yield measure(rec, [compare(y, whole.double(), whole)], grad_b, ledger.bytes_sent)
        # reduce_scatter of per-rank full tensors (rank j contributes full_j = parts-based tensor)
        fulls = [torch.randn(2, sum(sizes), 5, generator=gen) for _ in range(P)]
        g = torch.randn(2, sizes[k], 5, generator=gen)
        x = fulls[k].clone().requires_grad_(True)
        ledger.reset()
        y = reduce_scatter(x, axis, 1, sizes)
        y.backward(g)
        total32, total64 = sum(fulls), sum(f.double() for f in fulls)
        # d/dx_k of sum_j <g_j, slice_j(sum fulls)> = concat of all ranks' g_j: check own slice
        rec = Record("reduce_scatter", _mesh_name(mesh), shape, expected_bytes=moved)
        yield measure(
            rec,
            [compare(y, total64[:, mine], total32[:, mine])],
            [compare(x.grad[:, mine], g.double(), g)],
            ledger.bytes_sent,
        )
        x = fulls[k].clone().requires_grad_(True)
        ledger.reset()
        y = all_reduce(x, axis)
        y.backward(cot)
        rec = Record("all_reduce", _mesh_name(mesh), shape)
        yield measure(
            rec,
            [compare(y, total64, total32)],
            [compare(x.grad, cot.double() * P, cot * P)],
            ledger.bytes_sent,
        )


def _measure_bf16(
    op: str,
    mesh: DomainMesh,
    shape: str,
    expected: tuple[int, ...],
    y: torch.Tensor,
    local: list,
    serial,
    cuts,
) -> Record:
    """Judge a bf16 case within ``BF16_TOLERANCE``: the output ``y`` and the gradients of ``local``
    (which must come back in float32) against the serial ``(y32, g32, y64, g64)``, cut to this
    rank by ``cuts`` ``(y, *local)``."""
    (y32,), g32, (y64,), g64 = serial
    rec = Record(op, _mesh_name(mesh), shape, tolerance=BF16_TOLERANCE, expected_bytes=sum(expected))
    errs_b = [compare(t.grad, g64[i][cut], g32[i][cut]) for i, (t, cut) in enumerate(zip(local, cuts[1:]))]
    if any(t.grad.dtype != torch.float32 for t in local):
        errs_b = [compare(None, g64[0], None)]
    return measure(rec, [compare(y.float(), y64[cuts[0]], y32[cuts[0]])], errs_b, ledger.bytes_sent)


@register("matmul_bf16")
def check_matmul_bf16(mesh: DomainMesh) -> Iterator[Record]:
    """Both forms and strategies under bf16 autocast, against the serial result (float64 and
    float32), within ``BF16_TOLERANCE``; every message must travel in bf16.

    Gradients must come back in each input's dtype (fp32 weights).
    """
    axis, q = mesh.domain, mesh.domain.index
    grid = TileGrid(7, 10, mesh.shape.lat, mesh.shape.lon)
    counts = [t.shape[0] * t.shape[1] for t in grid.tiles()]
    rows = split_offsets(tuple(counts))
    r = slice(rows[q], rows[q + 1])
    gen = torch.Generator().manual_seed(5)
    for strategy in ("weights", "activations"):
        for bias in (False, True):
            cin, cout = 16, 12
            outs = split_sizes(cout, axis.size)
            cols = split_offsets(outs)
            c = slice(cols[q], cols[q + 1])
            x = torch.randn(sum(counts), cin, generator=gen)
            w = torch.randn(cin, cout, generator=gen)
            b = torch.randn(cout, generator=gen) if bias else None
            g = torch.randn(sum(counts), cout, generator=gen)
            serial = serial_pair(_affine_ref, [x, w, b], [g])
            xl = x[r].clone().requires_grad_(True)
            wl = w[:, c].clone().requires_grad_(True)
            bl = b[c].clone().requires_grad_(True) if bias else None
            ledger.reset()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                yl = matmul_channels(xl, wl, bl, axis, outs, counts, strategy)  # type: ignore[arg-type]
            yl.float().backward(g[r])
            yield _measure_bf16(
                f"matmul_channels_bf16.{strategy}",
                mesh,
                f"grid7x10 {cin}->{cout}{' +bias' if bias else ''}",
                channel_bytes(strategy, counts, cin, outs, bias, elsize=2),
                yl,
                [xl, wl],  # the bias gradient is not judged here
                serial,
                [r, r, (slice(None), c)],
            )
        n = sum(counts)
        x = torch.randn(n, 6, generator=gen)
        a = torch.randn(n, n, generator=gen).div(4)
        g = torch.randn(n, 6, generator=gen)
        serial = serial_pair(lambda x, a: [a @ x], [x, a], [g])
        xl = x[r].clone().requires_grad_(True)
        al = a[r].clone().requires_grad_(True)
        ledger.reset()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            yl = matmul_tokens(xl, al, None, axis, counts, counts, strategy)  # type: ignore[arg-type]
        yl.float().backward(g[r])
        expected = token_bytes(strategy, counts, counts, 6, elsize=2)
        yield _measure_bf16(
            f"matmul_tokens_bf16.{strategy}",
            mesh,
            "tokens 7x10 c6",
            expected,
            yl,
            [xl, al],
            serial,
            [r, r, r],
        )


@register("matmul_pair_bf16")
def check_matmul_pair_bf16(mesh: DomainMesh) -> Iterator[Record]:
    """The MLP pair under bf16 autocast, both strategies, against the serial result (float64 and
    float32), within ``BF16_TOLERANCE``; every message in bf16, gradients in fp32."""
    axis, q = mesh.domain, mesh.domain.index
    grid = TileGrid(7, 10, mesh.shape.lat, mesh.shape.lon)
    counts = [t.shape[0] * t.shape[1] for t in grid.tiles()]
    rows = split_offsets(tuple(counts))
    r = slice(rows[q], rows[q + 1])
    cin, hid, cout = 12, 20, 10
    hids, outs = split_sizes(hid, axis.size), split_sizes(cout, axis.size)
    h = slice(*split_offsets(hids)[q : q + 2])
    o = slice(*split_offsets(outs)[q : q + 2])
    gen = torch.Generator().manual_seed(6)
    act = torch.nn.functional.gelu

    def ref(x, w1, b1, w2, b2):
        return [act(x @ w1 + b1) @ w2 + b2]

    for strategy in ("weights", "activations"):
        full = [torch.randn(sum(counts), cin, generator=gen), torch.randn(cin, hid, generator=gen) / 3]
        full += [torch.randn(hid, generator=gen), torch.randn(hid, cout, generator=gen) / 4]
        full += [torch.randn(cout, generator=gen)]
        g = torch.randn(sum(counts), cout, generator=gen)
        serial = serial_pair(ref, full, [g])
        mine = (r, (slice(None), h), h, h, o)
        local = [t[i].clone().requires_grad_(True) for t, i in zip(full, mine, strict=True)]
        ledger.reset()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            yl = matmul_pair(*local, axis, hids, outs, counts, act, activation_grad("gelu"), strategy)
        yl.float().backward(g[r])
        expected = pair_bytes(strategy, counts, cin, hids, outs, elsize=2)
        shape = f"grid7x10 {cin}->{hid}->{cout} gelu"
        yield _measure_bf16(
            f"matmul_pair_bf16.{strategy}", mesh, shape, expected, yl, local, serial, [r, *mine]
        )
