"""What a PyTorch user writes for the convolution-like bench cases, to time the twins against.

Written from each case's hyper-parameters, outside the twins: ``F.pad`` (latitude rows: zeros,
replicate, or the rows across the pole; then circular in longitude) and ``F.conv2d`` /
``F.conv_transpose2d`` on the twin's own weights. ``bench layers`` reports twin ÷ plain form for
these cases (the twins run the same aten ops: ``tests/test_twins.py``), beside the noise floor.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["PLAIN_FORMS", "user_pad"]

Forward = Callable[[torch.Tensor], torch.Tensor]


def user_pad(
    x: torch.Tensor, top: int, bottom: int, left: int, right: int, lat_mode: str, lon_mode: str
) -> torch.Tensor:
    """``x`` ``(B, C, H, W)`` padded on the sphere: latitude rows first, then ``F.pad`` circular."""
    if top or bottom:
        if lat_mode == "pole":  # the rows inside the pole, flipped and turned half a circle
            half = x.shape[-1] // 2
            above = x[..., :top, :].flip(-2).roll(half, -1)
            below = x[..., x.shape[-2] - bottom :, :].flip(-2).roll(half, -1)
            x = torch.cat([above, x, below], -2)
        else:
            x = F.pad(x, (0, 0, top, bottom), mode="replicate" if lat_mode == "replicate" else "constant")
    if left or right:
        x = F.pad(x, (left, right, 0, 0), mode="circular" if lon_mode == "periodic" else "constant")
    return x


def _conv(conv: nn.Conv2d, top: int, bottom: int, left: int, right: int, lat_mode: str) -> Forward:
    def forward(x: torch.Tensor) -> torch.Tensor:
        y = user_pad(x, top, bottom, left, right, lat_mode, "periodic")
        return F.conv2d(y, conv.weight, conv.bias, conv.stride, 0, conv.dilation)

    return forward


def _patch_embed(twin: nn.Module) -> Forward:
    # the bench grid is a whole number of patches: no padding
    return lambda x: F.conv2d(x, twin.weight, twin.bias, twin.stride).permute(0, 2, 3, 1)


def _upsample(twin: nn.Module) -> Forward:
    conv = twin.conv  # kernel 2, stride 2: torch's size is the output grid
    return lambda x: F.conv_transpose2d(x, conv.weight, conv.bias, conv.stride)


PLAIN_FORMS: dict[str, Callable[[nn.Module], Forward]] = {
    "conv2d_zeros": lambda t: _conv(t, 1, 1, 1, 1, "zeros"),
    "conv2d_pole": lambda t: _conv(t, 1, 1, 1, 1, "pole"),
    "patch_embed": _patch_embed,
    "downsample": lambda t: _conv(t.conv, 1, 1, 1, 1, "pole"),
    "upsample": _upsample,
}
"""``{bench case: the user's forward, given the case's twin (its weights)}``."""
