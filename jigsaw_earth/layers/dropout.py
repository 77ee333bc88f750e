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

import torch
from torch import nn

from .base import Domain, uniform_at

__all__ = ["Dropout", "dropout_mask", "set_dropout_step"]

_LAYOUTS = ("tokens", "field")


def dropout_mask(
    domain: Domain,
    shape: torch.Size | tuple[int, ...],
    layout: str,
    p: float,
    seed: int,
    key: str,
    batch_offset: int = 0,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Boolean keep-mask of this rank's tile of shape ``shape`` (``(B,h,w,C)`` or ``(B,C,h,w)``)."""
    tile, grid = domain.tile, domain.grid
    if layout == "tokens":
        b, h, w, c = shape
    else:
        b, c, h, w = shape
    if (h, w) != tile.shape:
        raise ValueError(
            f"Dropout({layout}): input tile is {h}x{w} but this rank's tile of the "
            f"{grid.n_lat}x{grid.n_lon} grid is {tile.shape[0]}x{tile.shape[1]}"
        )
    ar = lambda start, n: torch.arange(start, start + n, device=device, dtype=torch.int64)  # noqa: E731
    bi = ar(batch_offset, b).view(b, 1, 1, 1)
    li = ar(tile.lat_start, h).view(1, h, 1, 1)
    oi = ar(tile.lon_start, w).view(1, 1, w, 1)
    ci = ar(0, c).view(1, 1, 1, c)
    index = ((bi * grid.n_lat + li) * grid.n_lon + oi) * c + ci  # (b, h, w, c), global row-major
    keep = uniform_at(index, seed, key) >= p
    return keep if layout == "tokens" else keep.permute(0, 3, 1, 2)


class Dropout(nn.Module):
    """Dropout on a token tile ``(B, h, w, C)`` (``layout="tokens"``) or a field ``(B, C, h, w)``.

    Kept elements are scaled by ``1 / (1 - p)``; identity in eval mode or with ``p = 0``.
    """

    jigsaw_layer = True

    def __init__(self, domain: Domain, p: float = 0.5, layout: str = "tokens"):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout probability must be in [0, 1], got {p}")
        if layout not in _LAYOUTS:
            raise ValueError(f"Dropout layout {layout!r}: use 'tokens' (B,h,w,C) or 'field' (B,C,h,w)")
        self.domain, self.p, self.layout = domain, p, layout
        self.seed, self.key, self.step, self.batch_offset = 0, "dropout", 0, 0

    def reset_parameters(self, seed: int = 0, key: str = "dropout") -> None:
        """No parameters: records the seed and the module path that key the mask."""
        self.seed, self.key = seed, key

    def mask(self, x: torch.Tensor) -> torch.Tensor:
        return dropout_mask(
            self.domain,
            x.shape,
            self.layout,
            self.p,
            self.seed,
            f"{self.key}/step{self.step}",
            self.batch_offset,
            x.device,
        )

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
            module.step = int(step)
            if batch_offset is not None:
                module.batch_offset = int(batch_offset)
