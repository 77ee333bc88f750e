"""Mesh-invariant dropout: the mask of an element depends only on where it is, never on the mesh.

The keep/drop decision for an element is ``uniform_at(global index, seed, f"{key}/step{step}") ≥ p``
where the global index is the element's row-major position in ``(batch, lat, lon, channel)`` of the
*global* tensor. The same seed, layer key and step give the same mask on 1 rank and on any mesh,
for token tiles and fields alike (the index is the same for both layouts).

* ``seed`` and ``key`` are set by ``init_model(model, seed)`` (the key is the module path), so a
  model initialised on any mesh drops the same elements.
* ``step`` is set by the trainer before each optimisation step with ``set_dropout_step(model,
  step)``. The mask does **not** advance on its own: a forward pass recomputed under activation
  checkpointing (``torch.utils.checkpoint``) must see the same mask, so it is a pure function of
  the step. A module called twice in one step drops the same elements both times.
* ``batch_offset`` is the global index of this rank's first sample (default 0); a data-parallel
  trainer that wants replicas to draw different masks sets it with ``set_dropout_step(model,
  step, batch_offset=...)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..distributed.tiles import Tile
from .base import Domain, _mix, _srl, _stream, uniform_at

__all__ = ["Dropout", "dropout_mask", "set_dropout_step"]

_LAYOUTS = ("tokens", "field")


def _global_index(
    tile: Tile,
    grid: tuple[int, int],
    shape: Sequence[int],
    layout: str,
    batch_offset: int,
    device,
    channels: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Row-major index in the global ``(batch, lat, lon, channel)`` tensor, shaped like the tile.
    ``channels = (start, total)``: the tile holds channels ``start …`` of ``total`` (tokens only)."""
    n_lat, n_lon = grid
    b, h, w, c = shape if layout == "tokens" else (shape[0], shape[2], shape[3], shape[1])
    c0, n_c = (0, c) if channels is None else channels
    if (h, w) != tile.shape:
        raise ValueError(
            f"Dropout({layout}): input tile is {h}x{w} but this rank's tile of the "
            f"{n_lat}x{n_lon} grid is {tile.shape[0]}x{tile.shape[1]}"
        )

    def ar(start: int, n: int, dim: int) -> torch.Tensor:
        view = [1, 1, 1, 1]
        view[dim] = n
        return torch.arange(start, start + n, device=device, dtype=torch.int64).view(view)

    bi, li, oi, ci = ar(batch_offset, b, 0), ar(tile.lat_start, h, 1), ar(tile.lon_start, w, 2), ar(c0, c, 3)
    index = ((bi * n_lat + li) * n_lon + oi) * n_c + ci  # (b, h, w, c)
    return index if layout == "tokens" else index.permute(0, 3, 1, 2)


def _keep_tokens(
    corner: tuple[int, int, int, int],
    shape: tuple[int, int, int, int],
    sizes: tuple[int, int, int],
    stream: torch.Tensor,
    p: float,
) -> torch.Tensor:
    """Keep-mask ``(b, h, w, c)`` of the block at global ``corner = (batch, lat, lon, channel)`` of
    the global ``(·, n_lat, n_lon, n_c)`` = ``sizes`` token tensor: index, hash and threshold."""
    device = stream.device
    views = ((-1, 1, 1, 1), (1, -1, 1, 1), (1, 1, -1, 1), (1, 1, 1, -1))
    bi, li, oi, ci = (
        torch.arange(start, start + n, device=device, dtype=torch.int64).view(view)
        for start, n, view in zip(corner, shape, views)
    )
    n_lat, n_lon, n_c = sizes
    index = ((bi * n_lat + li) * n_lon + oi) * n_c + ci
    h = _mix(index * 2 + 1 + stream)
    return (_srl(h, 40).to(torch.float32) + 0.5) / float(1 << 24) >= p


_FUSED: list = []


def _fused_keep():
    """``_keep_tokens`` compiled into one kernel (integer hashing is exact, so the mask is the
    eager one bit for bit); eager where compilation is unavailable."""
    if not _FUSED:
        try:
            _FUSED.append(torch.compile(_keep_tokens, dynamic=True, fullgraph=True))
        except Exception:  # pragma: no cover - no compiler for this device
            _FUSED.append(_keep_tokens)
    return _FUSED[0]


def dropout_mask(
    domain: Domain,
    shape: Sequence[int],
    layout: str,
    p: float,
    seed: int,
    key: str,
    batch_offset: int = 0,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Boolean keep-mask of this rank's tile (``(B,h,w,C)`` or ``(B,C,h,w)``): ``uniform_at ≥ p``."""
    grid = (domain.grid.n_lat, domain.grid.n_lon)
    return uniform_at(_global_index(domain.tile, grid, shape, layout, batch_offset, device), seed, key) >= p


class _StreamPart:
    """An attribute of ``Dropout`` that keys its stream (``seed``, ``key``, ``step``): stored in
    ``_NAME`` as ``cast`` makes it; setting it refreshes the stream buffer (outside forward)."""

    def __init__(self, cast: type):
        self.cast = cast

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = f"_{name}"

    def __get__(self, obj, owner=None):
        return self if obj is None else getattr(obj, self.attr)

    def __set__(self, obj, value) -> None:
        setattr(obj, self.attr, self.cast(value))
        obj._refresh()


class Dropout(nn.Module):
    """Dropout on a token tile ``(B, h, w, C)`` (``layout="tokens"``) or a field ``(B, C, h, w)``.

    Kept elements are scaled by ``1 / (1 - p)``; identity in eval mode or with ``p = 0``. The keep
    decision is ``uniform_at(global index, seed, f"{key}/step{step}") ≥ p`` (``dropout_mask``); the
    module evaluates it with the stream of ``(seed, key, step)`` held in a buffer, so changing the
    step neither breaks nor recompiles a ``torch.compile`` graph.
    """

    jigsaw_layer = True

    def __init__(self, domain: Domain, p: float = 0.5, layout: str = "tokens"):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout probability must be in [0, 1], got {p}")
        if layout not in _LAYOUTS:
            raise ValueError(f"Dropout layout {layout!r}: use 'tokens' (B,h,w,C) or 'field' (B,C,h,w)")
        self.domain, self.p, self.layout = domain, p, layout
        # geometry read once here: forward touches no cached_property (torch.compile-friendly)
        self._tile, self._grid = domain.tile, (domain.grid.n_lat, domain.grid.n_lon)
        self.register_buffer("_stream", torch.zeros((), dtype=torch.int64), persistent=False)
        self._seed, self._key, self._step, self.batch_offset = 0, "dropout", 0, 0
        self._refresh()

    # seed, key and step determine the stream; setting any of them refreshes it (outside forward)
    seed = _StreamPart(int)
    key = _StreamPart(str)
    step = _StreamPart(int)

    @property
    def stream_key(self) -> str:
        return f"{self._key}/step{self._step}"

    def _refresh(self) -> None:
        with torch.no_grad():
            self._stream.fill_(_stream(self._seed, self.stream_key))

    def reset_parameters(self, seed: int = 0, key: str = "dropout") -> None:
        """No parameters: records the seed and the module path that key the mask."""
        self._seed, self._key = int(seed), key
        self._refresh()

    def mask(self, x: torch.Tensor) -> torch.Tensor:
        """Boolean keep-mask for ``x`` — equal to ``dropout_mask(..., seed, stream_key, ...)``."""
        if x.dim() != 4:
            raise ValueError(f"Dropout({self.layout}) needs a 4-D tile, got {tuple(x.shape)}")
        b, h, w, c = x.shape if self.layout == "tokens" else (x.shape[0], x.shape[2], x.shape[3], x.shape[1])
        keep = self._block((b, h, w, c), self._tile, (0, c), x.device)
        return keep if self.layout == "tokens" else keep.permute(0, 3, 1, 2)

    def block_mask(
        self, tile: Tile, batch: int, start: int, stop: int, channels: int, device: torch.device
    ) -> torch.Tensor:
        """The keep-mask ``(batch·h·w, stop − start)`` of channels ``[start, stop)`` of ``tile``'s
        token tile ``(batch, h, w, channels)`` (any rank's tile): ``mask``'s decisions on a block,
        for a layer that applies dropout to another rank's tokens or to a channel block."""
        shape = (batch, *tile.shape, stop - start)
        return self._block(shape, tile, (start, channels), device).reshape(-1, stop - start)

    def _block(
        self, shape: Sequence[int], tile: Tile, channels: tuple[int, int], device: torch.device
    ) -> torch.Tensor:
        """``uniform_at(global index, seed, stream_key) ≥ p`` of a ``(b, h, w, c)`` token block, its
        stream precomputed in the buffer; one fused kernel on a GPU (``_keep_tokens``)."""
        b, h, w, c = (int(n) for n in shape)
        if (h, w) != tile.shape:
            raise ValueError(
                f"Dropout({self.layout}): input tile is {h}x{w} but this rank's tile of the "
                f"{self._grid[0]}x{self._grid[1]} grid is {tile.shape[0]}x{tile.shape[1]}"
            )
        corner = (self.batch_offset, tile.lat_start, tile.lon_start, channels[0])
        # a model compiled as a whole fuses the mask itself; on its own a GPU mask is compiled once
        fuse = device.type == "cuda" and not torch.compiler.is_compiling()
        fn = _fused_keep() if fuse else _keep_tokens
        return fn(corner, (b, h, w, c), (*self._grid, channels[1]), self._stream.to(device), self.p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:
            raise ValueError(
                f"Dropout({self.layout}) expects a 4-D tile "
                f"{'(B, h, w, C)' if self.layout == 'tokens' else '(B, C, h, w)'}, got {tuple(x.shape)}"
            )
        if not self.training or self.p == 0.0:
            return x
        if self.p == 1.0:
            return x * 0.0
        return x * self.mask(x).to(x.dtype) * (1.0 / (1.0 - self.p))

    def extra_repr(self) -> str:
        return f"p={self.p}, layout={self.layout}, key={self.key!r}, step={self.step}"


def set_dropout_step(model: nn.Module, step: int, batch_offset: int | None = None) -> None:
    """Set the step (and optionally the global index of the first local sample) of every Dropout."""
    for module in model.modules():
        if isinstance(module, Dropout):
            module.step = step
            if batch_offset is not None:
                module.batch_offset = int(batch_offset)
