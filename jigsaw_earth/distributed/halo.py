"""Halo exchange for 2-D tiles on the sphere, with its exact adjoint.

Every cell of a rank's padded tile is mapped to the global cell it copies (or to nothing, for
zero padding). Longitude is periodic; beyond a pole the choices are ``"zeros"``, ``"replicate"``
(the edge row repeated) or ``"pole"`` (across the pole: the row ``k`` steps beyond a pole is the
row ``k - 1`` steps inside it at the longitude 180° away). The mapped cells are grouped into
rectangular blocks per owning rank, so each neighbour pair exchanges one message, corners
included, and a halo wider than a neighbour's tile simply draws on further ranks. Backward
sends halo gradients back to their owners, where they are added, so repeated sources
(replicate, narrow grids) get every contribution.

Blocks are contiguous runs of source rows and columns, so every copy is a slice (rows across a
pole are a flipped slice) and nothing is indexed. A rank that exchanges nothing gets its window
in plain torch (autograd gives the adjoint; ``torch.compile`` traces it): a view of the tile when
the window lies inside it (no copy), else one buffer with the covered cells copied once and only
the zero-padding cells filled. Where messages move, the gather and its adjoint are autograd
functions run through ``comm.run_exchange`` (under ``torch.compile``, one graph break each).

The same machinery gathers any per-rank window of the global grid (``gather_windows``): patch
embedding, strided convolution and resampling use it to fetch exactly their receptive field.

``pad_reference`` is the serial definition in plain torch, written independently of the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import torch
import torch.nn.functional as F

from ..sphere import col_sources, row_sources
from .comm import constant_when_compiled, exchange, run_exchange
from .mesh import Axis
from .tiles import TileGrid

__all__ = [
    "Halo",
    "LatMode",
    "LonMode",
    "Window",
    "gather_windows",
    "halo_exchange",
    "pad_reference",
    "scatter_add_windows",
    "window_reference",
]

LatMode = Literal["zeros", "replicate", "pole"]
LonMode = Literal["periodic", "zeros"]
Window = tuple[int, int, int, int]  # global rows [lat_lo, lat_hi) and columns [lon_lo, lon_hi)


@dataclass(frozen=True)
class Halo:
    """Halo widths ``lat=(before, after)`` rows and ``lon=(before, after)`` columns, and modes."""

    lat: tuple[int, int] = (0, 0)
    lon: tuple[int, int] = (0, 0)
    lat_mode: LatMode = "zeros"
    lon_mode: LonMode = "periodic"

    @classmethod
    def uniform(cls, width: int, lat_mode: LatMode = "zeros", lon_mode: LonMode = "periodic") -> Halo:
        return cls((width, width), (width, width), lat_mode, lon_mode)

    def check(self, grid: TileGrid) -> None:
        if min(*self.lat, *self.lon) < 0:
            raise ValueError(f"halo widths must be >= 0, got lat={self.lat} lon={self.lon}")
        _check_modes(grid, self.lat_mode, self.lon_mode, max(self.lat))

    def windows(self, grid: TileGrid) -> tuple[Window, ...]:
        """Each rank's padded tile as a global window, in domain-axis order."""
        (top, bottom), (left, right) = self.lat, self.lon
        return tuple(
            (t.lat_start - top, t.lat_stop + bottom, t.lon_start - left, t.lon_stop + right)
            for t in grid.tiles()
        )


def _check_modes(grid: TileGrid, lat_mode: str, lon_mode: str, overhang: int) -> None:
    """``overhang``: the most rows any window reaches beyond a pole."""
    if lat_mode not in ("zeros", "replicate", "pole"):
        raise ValueError(f"lat_mode {lat_mode!r}: use 'zeros', 'replicate' or 'pole'")
    if lon_mode not in ("periodic", "zeros"):
        raise ValueError(f"lon_mode {lon_mode!r}: use 'periodic' or 'zeros'")
    if lat_mode == "pole":
        if lon_mode != "periodic" or grid.n_lon % 2:
            raise ValueError(
                f"lat_mode='pole' needs periodic longitude with an even number of columns "
                f"(got lon_mode={lon_mode!r}, n_lon={grid.n_lon}); use 'replicate' instead"
            )
        if overhang > grid.n_lat:
            raise ValueError(
                f"a window reaching {overhang} rows beyond a pole is wider than the grid's "
                f"{grid.n_lat} rows; use 'replicate' or 'zeros' beyond the poles"
            )


@dataclass(frozen=True)
class _Block:
    """A rectangle of window cells copied from one rank's tile: contiguous source rows and
    columns, the rows taken in reverse order across a pole (``flip``)."""

    src: int  # domain index of the rank owning the source cells
    dst_rows: slice
    dst_cols: slice
    src_rows: slice  # rows local to the source tile, ascending
    src_cols: slice
    flip: bool = False

    @property
    def shape(self) -> tuple[int, int]:
        return self.src_rows.stop - self.src_rows.start, self.src_cols.stop - self.src_cols.start

    @property
    def numel(self) -> int:
        h, w = self.shape
        return h * w


def _runs(keys: list, values: list[int]) -> list[tuple[int, int]]:
    """Maximal runs ``[start, stop)`` of equal consecutive keys whose values step by +1."""
    runs, start = [], 0
    for k in range(1, len(keys) + 1):
        if k == len(keys) or keys[k] != keys[start] or values[k] != values[k - 1] + 1:
            runs.append((start, k))
            start = k
    return runs


@lru_cache(maxsize=512)
def _window_plan(
    grid: TileGrid, window: Window, lat_mode: str, lon_mode: str
) -> tuple[tuple[_Block, ...], tuple[tuple[slice, slice], ...]]:
    """(blocks that make up one window, in a fixed order; rectangles of zero padding)."""
    lat_lo, lat_hi, lon_lo, lon_hi = window
    rows = row_sources(grid.n_lat, lat_lo, lat_hi, lat_mode)  # the pole rule: jigsaw_earth.sphere
    row_keys = [(grid.lat_owner(g) if g >= 0 else -1, flip) for g, flip in rows]
    row_vals = [-g if flip else g for g, flip in rows]  # rows across a pole run backwards
    cols_by_flip = {
        flip: col_sources(grid.n_lon, lon_lo, lon_hi, lon_mode, across_pole=flip)
        for flip in {f for _, f in rows}
    }
    blocks, zeros = [], []
    for r0, r1 in _runs(row_keys, row_vals):
        owner_i, flip = row_keys[r0]
        if owner_i < 0:
            zeros.append((slice(r0, r1), slice(0, lon_hi - lon_lo)))
            continue
        cols = cols_by_flip[flip]
        col_keys = [grid.lon_owner(c) if c >= 0 else -1 for c in cols]
        lat_off = grid.lat_offsets[owner_i]
        src_rows = sorted((rows[r0][0] - lat_off, rows[r1 - 1][0] - lat_off))
        for c0, c1 in _runs(col_keys, cols):
            owner_j = col_keys[c0]
            if owner_j < 0:
                zeros.append((slice(r0, r1), slice(c0, c1)))
                continue
            lon_off = grid.lon_offsets[owner_j]
            blocks.append(
                _Block(
                    src=owner_i * grid.mesh_lon + owner_j,
                    dst_rows=slice(r0, r1),
                    dst_cols=slice(c0, c1),
                    src_rows=slice(src_rows[0], src_rows[1] + 1),
                    src_cols=slice(cols[c0] - lon_off, cols[c1 - 1] - lon_off + 1),
                    flip=flip and r1 - r0 > 1,
                )
            )
    return tuple(blocks), tuple(zeros)


def _receive_plan(grid: TileGrid, window: Window, lat_mode: str, lon_mode: str) -> tuple[_Block, ...]:
    """Blocks that make up one window, in a fixed order."""
    return _window_plan(grid, window, lat_mode, lon_mode)[0]


@lru_cache(maxsize=512)
def _plan(
    grid: TileGrid, windows: tuple[Window, ...], lat_mode: str, lon_mode: str, me: int
) -> tuple[dict[int, list[_Block]], dict[int, list[_Block]]]:
    """(blocks this rank receives, by source; blocks this rank sends, by destination)."""
    recv: dict[int, list[_Block]] = {}
    for b in _receive_plan(grid, windows[me], lat_mode, lon_mode):
        recv.setdefault(b.src, []).append(b)
    send: dict[int, list[_Block]] = {}
    for k in range(grid.n_tiles):
        if k != me:
            blocks = [b for b in _receive_plan(grid, windows[k], lat_mode, lon_mode) if b.src == me]
            if blocks:
                send[k] = blocks
    return recv, send


@lru_cache(maxsize=512)
def _view_of_tile(
    grid: TileGrid, windows: tuple[Window, ...], lat_mode: str, lon_mode: str, me: int
) -> tuple[slice, slice] | None:
    """The slice of this rank's tile that is its whole window, when no rank exchanges anything
    with it (one rank, or a window inside the tile); else None."""
    recv, send = _plan(grid, windows, lat_mode, lon_mode, me)
    blocks = recv.get(me, [])
    if send or len(recv) != 1 or len(blocks) != 1 or blocks[0].flip:
        return None
    lat_lo, lat_hi, lon_lo, lon_hi = windows[me]
    if blocks[0].shape != (lat_hi - lat_lo, lon_hi - lon_lo):
        return None
    return blocks[0].src_rows, blocks[0].src_cols


def _source(x: torch.Tensor, b: _Block) -> torch.Tensor:
    """The block's cells of the tile ``x`` in window order (a view unless flipped)."""
    piece = x[..., b.src_rows, b.src_cols]
    return piece.flip(-2) if b.flip else piece


def _pack(x: torch.Tensor, blocks: list[_Block]) -> torch.Tensor:
    flat = x.new_empty(*_lead(x), sum(b.numel for b in blocks))
    start = 0
    for b in blocks:
        flat[..., start : start + b.numel].unflatten(-1, b.shape).copy_(_source(x, b))
        start += b.numel
    return flat


def _unpack(out: torch.Tensor, flat: torch.Tensor, blocks: list[_Block]) -> None:
    start = 0
    for b in blocks:
        out[..., b.dst_rows, b.dst_cols] = flat[..., start : start + b.numel].unflatten(-1, b.shape)
        start += b.numel


def _add_back(grad_x: torch.Tensor, pieces: list[torch.Tensor], blocks: list[_Block]) -> None:
    """Adjoint of ``_source``: add each block's window-ordered cells into its source cells."""
    for b, piece in zip(blocks, pieces):
        grad_x[..., b.src_rows, b.src_cols] += piece.flip(-2) if b.flip else piece


def _split(flat: torch.Tensor, blocks: list[_Block]) -> list[torch.Tensor]:
    out, start = [], 0
    for b in blocks:
        out.append(flat[..., start : start + b.numel].unflatten(-1, b.shape))
        start += b.numel
    return out


def _lead(x: torch.Tensor) -> tuple[int, ...]:
    return tuple(x.shape[:-2])


def _window_of_tile(x: torch.Tensor, shape: tuple[int, int], zeros, blocks) -> torch.Tensor:
    """The window ``shape`` with the cells this rank's tile ``x`` supplies (``blocks``) and its
    zero padding filled; the cells other ranks supply are left for them."""
    out = x.new_empty(*_lead(x), *shape)
    for rows, cols in zeros:
        out[..., rows, cols] = 0
    for b in blocks:
        out[..., b.dst_rows, b.dst_cols] = _source(x, b)
    return out


def _tile_of_window(y: torch.Tensor, shape: tuple[int, int], blocks) -> torch.Tensor:
    """The tile ``shape`` holding the sum of the window ``y``'s cells that map into it (``blocks``,
    this rank's own); other ranks' cells are added by the caller."""
    # start from a copy of the block that covers the whole tile, if one does (the interior)
    whole = next((b for b in blocks if b.shape == shape and not b.flip), None)
    if whole is not None:
        out = y[..., whole.dst_rows, whole.dst_cols].clone(memory_format=torch.contiguous_format)
        blocks = [b for b in blocks if b is not whole]
    else:
        out = y.new_zeros(*_lead(y), *shape)
    _add_back(out, [y[..., b.dst_rows, b.dst_cols] for b in blocks], blocks)
    return out


def _gather(x, grid, windows, lat_mode, lon_mode, axis, op):
    """Each rank's window of the global field whose tiles are ``x``."""
    me = axis.index
    recv, send = _plan(grid, windows, lat_mode, lon_mode, me)
    lat_lo, lat_hi, lon_lo, lon_hi = windows[me]
    lead = _lead(x)
    peers = [k for k in recv if k != me]
    pending = None
    if send or peers:
        pending = exchange(
            axis,
            [(axis.ranks[k], _pack(x, blocks)) for k, blocks in send.items()],
            [(axis.ranks[k], (*lead, sum(b.numel for b in recv[k]))) for k in peers],
            op=op,
            dtype=x.dtype,
            device=x.device,
        )
    zeros = _window_plan(grid, windows[me], lat_mode, lon_mode)[1]
    out = _window_of_tile(x, (lat_hi - lat_lo, lon_hi - lon_lo), zeros, recv.get(me, []))
    if pending is not None:
        for k, flat in zip(peers, pending.wait()):
            _unpack(out, flat, recv[k])
    return out


def _scatter_add(y, grid, windows, lat_mode, lon_mode, axis, op):
    """Adjoint of ``_gather``: every window cell is added into the tile cell it came from."""
    me = axis.index
    recv, send = _plan(grid, windows, lat_mode, lon_mode, me)
    lead = _lead(y)

    def gather_dst(blocks: list[_Block]) -> torch.Tensor:
        flat = y.new_empty(*lead, sum(b.numel for b in blocks))
        for b, piece in zip(blocks, _split(flat, blocks)):
            piece.copy_(y[..., b.dst_rows, b.dst_cols])
        return flat

    peers = [k for k in recv if k != me]
    pending = None
    if send or peers:
        pending = exchange(
            axis,
            [(axis.ranks[k], gather_dst(recv[k])) for k in peers],
            [(axis.ranks[k], (*lead, sum(b.numel for b in bl))) for k, bl in send.items()],
            op=op,
            dtype=y.dtype,
            device=y.device,
        )
    out = _tile_of_window(y, grid.tile_of(me).shape, recv.get(me, []))
    if pending is not None:
        for (_, blocks), flat in zip(send.items(), pending.wait()):
            _add_back(out, _split(flat, blocks), blocks)
    return out


class _WindowGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, grid, windows, lat_mode, lon_mode, axis, op):  # type: ignore[override]
        ctx.args = (grid, windows, lat_mode, lon_mode, axis, op + ".backward")
        return _gather(x, grid, windows, lat_mode, lon_mode, axis, op)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _scatter_add(grad, *ctx.args), None, None, None, None, None, None


class _WindowScatterAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, grid, windows, lat_mode, lon_mode, axis, op):  # type: ignore[override]
        ctx.args = (grid, windows, lat_mode, lon_mode, axis, op + ".backward")
        return _scatter_add(y, grid, windows, lat_mode, lon_mode, axis, op)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _gather(grad.contiguous(), *ctx.args), None, None, None, None, None, None


def _check_tile(x: torch.Tensor, grid: TileGrid, axis: Axis) -> None:
    if axis.size != grid.n_tiles:
        raise ValueError(f"grid has {grid.n_tiles} tiles but the axis has {axis.size} ranks")
    expected = grid.tile_of(axis.index).shape
    if tuple(x.shape[-2:]) != expected:
        raise ValueError(f"tile has shape {tuple(x.shape[-2:])}, the grid expects {expected}")


@lru_cache(maxsize=512)
def _check_windows(grid: TileGrid, windows: tuple[Window, ...], lat_mode: str, lon_mode: str) -> None:
    if len(windows) != grid.n_tiles:
        raise ValueError(f"{len(windows)} windows given for {grid.n_tiles} tiles")
    overhang = max(max(-w[0], w[1] - grid.n_lat, 0) for w in windows)
    _check_modes(grid, lat_mode, lon_mode, overhang)


@constant_when_compiled
def _route(
    grid: TileGrid, windows: tuple[Window, ...], lat_mode: str, lon_mode: str, me: int
) -> tuple | None:
    """How this rank gets its window, after checking the windows: ``None`` when messages move
    (the exchange), else ``(view, blocks, zeros)``: the slices of the tile that are the whole
    window (a view, no copy) or None, and the blocks of its own tile and the zero padding that
    make it. A pure function of its arguments (``constant_when_compiled``): ``torch.compile``
    calls it once while tracing and keeps the answer (the plan's caches are never traced), so a
    window without messages (one rank, or a halo along an axis the mesh does not split) stays
    inside the compiled graph."""
    _check_windows(grid, windows, lat_mode, lon_mode)
    recv, send = _plan(grid, windows, lat_mode, lon_mode, me)
    if send or any(k != me for k in recv):
        return None
    view = _view_of_tile(grid, windows, lat_mode, lon_mode, me)
    return view, tuple(recv.get(me, [])), _window_plan(grid, windows[me], lat_mode, lon_mode)[1]


def gather_windows(
    x: torch.Tensor,
    grid: TileGrid,
    windows: tuple[Window, ...],
    axis: Axis,
    lat_mode: LatMode = "zeros",
    lon_mode: LonMode = "periodic",
    op: str = "gather_windows",
) -> torch.Tensor:
    """Rank ``k`` receives the global window ``windows[k]`` of the field whose tiles are ``x``.

    Windows may reach beyond the grid; cells there follow the boundary modes as in
    ``pad_reference``. Every rank passes the same ``windows`` (one per domain rank).
    """
    _check_tile(x, grid, axis)
    windows = tuple(windows)
    route = _route(grid, windows, lat_mode, lon_mode, axis.index)
    if route is None:
        return run_exchange(_WindowGather.apply, x, grid, windows, lat_mode, lon_mode, axis, op)
    view, blocks, zeros = route
    if view is not None:
        return x[..., view[0], view[1]]
    lat_lo, lat_hi, lon_lo, lon_hi = windows[axis.index]
    return _window_of_tile(x, (lat_hi - lat_lo, lon_hi - lon_lo), zeros, blocks)  # autograd: the adjoint


def scatter_add_windows(
    y: torch.Tensor,
    grid: TileGrid,
    windows: tuple[Window, ...],
    axis: Axis,
    lat_mode: LatMode = "zeros",
    lon_mode: LonMode = "periodic",
    op: str = "scatter_add_windows",
) -> torch.Tensor:
    """Adjoint of ``gather_windows``: rank ``k`` holds ``y`` shaped like ``windows[k]``; every
    cell is added into the tile cell it maps to (cells beyond a 'zeros' border are dropped).

    Overlapping patch recovery and transposed convolution sum their contributions with this.
    """
    windows = tuple(windows)
    route = _route(grid, windows, lat_mode, lon_mode, axis.index)
    lat_lo, lat_hi, lon_lo, lon_hi = windows[axis.index]
    if tuple(y.shape[-2:]) != (lat_hi - lat_lo, lon_hi - lon_lo):
        raise ValueError(f"window data has shape {tuple(y.shape[-2:])}, its window is {windows[axis.index]}")
    if route is None:
        return run_exchange(_WindowScatterAdd.apply, y, grid, windows, lat_mode, lon_mode, axis, op)
    view, blocks, _ = route
    tile = tuple(grid.tile_of(axis.index).shape)
    if view is not None and (view[0].stop - view[0].start, view[1].stop - view[1].start) == tile:
        return y
    return _tile_of_window(y, tile, list(blocks))


def halo_exchange(x: torch.Tensor, grid: TileGrid, halo: Halo, axis: Axis) -> torch.Tensor:
    """Pad this rank's tile ``x`` (``(..., h, w)``) with its halo from the neighbouring tiles.

    ``axis`` is the mesh's domain axis (lat-major, matching ``grid``). The result has shape
    ``(..., h + sum(halo.lat), w + sum(halo.lon))`` and equals the same window of
    ``pad_reference`` applied to the global field.
    """
    halo.check(grid)
    return gather_windows(x, grid, halo.windows(grid), axis, halo.lat_mode, halo.lon_mode, "halo_exchange")


def pad_reference(x: torch.Tensor, halo: Halo) -> torch.Tensor:
    """Serial padding of a global field ``(..., n_lat, n_lon)``, the definition of the halo."""
    n_lat, n_lon = x.shape[-2:]
    halo.check(TileGrid(n_lat, n_lon))
    top, bottom = halo.lat
    if halo.lat_mode == "zeros":
        x = F.pad(x, (0, 0, top, bottom))
    elif halo.lat_mode == "replicate":
        x = torch.cat(
            [
                x[..., :1, :].expand(*x.shape[:-2], top, n_lon),
                x,
                x[..., -1:, :].expand(*x.shape[:-2], bottom, n_lon),
            ],
            dim=-2,
        )
    else:
        above = x[..., :top, :].flip(-2).roll(n_lon // 2, dims=-1)
        below = x[..., n_lat - bottom :, :].flip(-2).roll(n_lon // 2, dims=-1)
        x = torch.cat([above, x, below], dim=-2)
    left, right = halo.lon
    if halo.lon_mode == "zeros":
        return F.pad(x, (left, right))
    return x[..., torch.arange(-left, n_lon + right) % n_lon]


def window_reference(x: torch.Tensor, window: Window, lat_mode: LatMode, lon_mode: LonMode) -> torch.Tensor:
    """Serial counterpart of ``gather_windows`` for one window of a global field."""
    n_lat, n_lon = x.shape[-2:]
    lat_lo, lat_hi, lon_lo, lon_hi = window
    top, bottom = max(0, -lat_lo), max(0, lat_hi - n_lat)
    left, right = max(0, -lon_lo), max(0, lon_hi - n_lon)
    padded = pad_reference(x, Halo((top, bottom), (left, right), lat_mode, lon_mode))
    return padded[..., lat_lo + top : lat_hi + top, lon_lo + left : lon_hi + left]
