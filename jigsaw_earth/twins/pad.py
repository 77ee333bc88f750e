"""Sphere padding written the way a plain-PyTorch user would: slices, ``torch.cat`` and ``F.pad``.

Same semantics as ``jigsaw_earth.distributed.halo.pad_reference`` (the definition, tested equal):
longitude periodic or zeros; beyond a pole zeros, replicate (edge row repeated) or ``"pole"``
(the row ``k`` beyond a pole is the row ``k - 1`` inside it, 180° of longitude away).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["sphere_pad"]


def _rows(x: torch.Tensor, top: int, bottom: int, lat_mode: str) -> torch.Tensor:
    if top == bottom == 0:
        return x
    if lat_mode == "zeros":
        return F.pad(x, (0, 0, top, bottom))
    n_lat, n_lon = x.shape[-2:]
    if lat_mode == "replicate":
        above = x[..., :1, :].expand(*x.shape[:-2], top, n_lon)
        below = x[..., -1:, :].expand(*x.shape[:-2], bottom, n_lon)
    elif lat_mode == "pole":
        above = x[..., :top, :].flip(-2).roll(n_lon // 2, dims=-1)
        below = x[..., n_lat - bottom :, :].flip(-2).roll(n_lon // 2, dims=-1)
    else:
        raise ValueError(f"lat_mode {lat_mode!r}: use 'zeros', 'replicate' or 'pole'")
    return torch.cat([above, x, below], dim=-2)


def _cols(x: torch.Tensor, left: int, right: int, lon_mode: str) -> torch.Tensor:
    if left == right == 0:
        return x
    if lon_mode == "zeros":
        return F.pad(x, (left, right))
    if lon_mode != "periodic":
        raise ValueError(f"lon_mode {lon_mode!r}: use 'periodic' or 'zeros'")
    n_lon = x.shape[-1]
    if max(left, right) <= n_lon:
        return torch.cat([x[..., n_lon - left :], x, x[..., :right]], dim=-1)
    return x[..., torch.arange(-left, n_lon + right, device=x.device) % n_lon]


def sphere_pad(
    x: torch.Tensor,
    lat: tuple[int, int],
    lon: tuple[int, int],
    lat_mode: str = "zeros",
    lon_mode: str = "periodic",
) -> torch.Tensor:
    """Pad a global field ``(..., n_lat, n_lon)`` by ``lat=(top, bottom)`` rows and ``lon=(left,
    right)`` columns under the sphere's boundary rules (latitude first, then longitude, so
    corners follow both rules as in ``pad_reference``)."""
    if lat_mode == "pole" and max(lat) > 0 and (lon_mode != "periodic" or x.shape[-1] % 2):
        raise ValueError(
            f"lat_mode='pole' needs periodic longitude with an even number of columns "
            f"(got lon_mode={lon_mode!r}, n_lon={x.shape[-1]}); use 'replicate' instead"
        )
    return _cols(_rows(x, *lat, lat_mode), *lon, lon_mode)
