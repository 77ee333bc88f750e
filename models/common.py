"""What every forecaster shares: input assembly, position encodings computed from global
coordinates (so they are the same on every mesh), and the ``Forecaster`` base class.

All tensors are this rank's tile. Fields are ``(B, C, h, w)``, token tiles ``(B, h, w, C)``.
Grids are equiangular: row ``i`` of ``n_lat`` rows lies at ``90 − 180·i/(n_lat − 1)`` degrees
(both poles included, as in ERA5's 721 rows) and column ``j`` of ``n_lon`` at ``360·j/n_lon``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from jigsaw_earth import sphere
from jigsaw_earth.distributed.comm import arm_for_compile
from jigsaw_earth.layers.base import Domain
from jigsaw_earth.layers.channels import ChannelDims, ModelChannels, prefixed
from jigsaw_earth.layers.norm import prefetch_affine, release_affine
from jigsaw_earth.layers.patch import PatchEmbed, PatchRecovery
from jigsaw_earth.sphere import N_COORD_CHANNELS

__all__ = [
    "COORD_CHANNEL_NAMES",
    "N_COORD_CHANNELS",
    "Forecaster",
    "assemble_inputs",
    "check_position_encoding",
    "coordinate_channels",
    "field_coordinates",
    "position_encoding",
]

#: names of the coordinate channels a forecaster appends to its inputs (``coordinate_channels``)
COORD_CHANNEL_NAMES = (
    "coord:sin_latitude",
    "coord:cos_latitude",
    "coord:sin_longitude",
    "coord:cos_longitude",
)


def field_coordinates(domain: Domain, centred: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Latitude and longitude in radians (float64) of this rank's rows ``(h,)`` and columns ``(w,)``.

    ``centred=False``: grid points with both poles on the grid (fields). ``centred=True``: cell
    centres of ``n_lat × n_lon`` equal cells (token grids, where each token covers a patch).
    The grid's definition: ``jigsaw_earth.sphere``.
    """
    grid, tile = domain.grid, domain.tile
    rows, cols = np.arange(tile.lat_start, tile.lat_stop), np.arange(tile.lon_start, tile.lon_stop)
    lat = sphere.row_latitudes(grid.n_lat, rows, centred)
    lon = sphere.column_longitudes(grid.n_lon, cols, centred)
    return torch.from_numpy(lat), torch.from_numpy(lon)


def coordinate_channels(domain: Domain, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``(4, h, w)``: sin/cos of latitude and longitude of this rank's grid points."""
    return sphere.coordinate_channels(*field_coordinates(domain)).to(dtype=dtype, device=device)


def check_position_encoding(kind: str, dim: int) -> None:
    """Raise unless ``kind`` is a known encoding that fits ``dim`` channels."""
    if kind not in ("sincos", "spherical", "none"):
        raise ValueError(f"position encoding {kind!r}: use 'sincos', 'spherical' or 'none'")
    if kind != "none" and dim % 4:
        raise ValueError(f"position encoding {kind!r} needs an embed_dim divisible by 4, got {dim}")


def position_encoding(
    domain: Domain, dim: int, kind: str, dtype: torch.dtype, device: torch.device
) -> torch.Tensor | None:
    """Fixed ``(h, w, dim)`` encoding of this rank's tokens from their *global* position.

    * ``"sincos"``: the 2-D sine-cosine encoding of token row/column indices (MAE/ViT style);
      half of the channels encode the row, half the column.
    * ``"spherical"``: Fourier features of the token centre's latitude and longitude,
      ``sin/cos(k·lat)`` and ``sin/cos(k·lon)`` for ``k = 1 … dim/4`` — periodic in longitude.
    * ``"none"``: no encoding (returns ``None``).

    Computed from global coordinates, so every mesh gives the same encoding for the same token.
    """
    check_position_encoding(kind, dim)
    if kind == "none":
        return None
    tile, q = domain.tile, dim // 4
    if kind == "sincos":
        rows = torch.arange(tile.lat_start, tile.lat_stop, dtype=torch.float64)
        cols = torch.arange(tile.lon_start, tile.lon_stop, dtype=torch.float64)
        freqs = 1.0 / 10000.0 ** (torch.arange(q, dtype=torch.float64) / q)
    elif kind == "spherical":
        rows, cols = field_coordinates(domain, centred=True)
        freqs = torch.arange(1, q + 1, dtype=torch.float64)
    a, b = rows[:, None] * freqs, cols[:, None] * freqs  # (h, q), (w, q)
    h, w = a.shape[0], b.shape[0]
    enc = torch.cat(
        [
            torch.sin(a)[:, None, :].expand(h, w, q),
            torch.cos(a)[:, None, :].expand(h, w, q),
            torch.sin(b)[None, :, :].expand(h, w, q),
            torch.cos(b)[None, :, :].expand(h, w, q),
        ],
        dim=-1,
    )
    return enc.to(dtype=dtype, device=device)


def assemble_inputs(
    state: torch.Tensor,
    static: torch.Tensor,
    time: torch.Tensor,
    coords: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(B, n_state + n_static + n_time [+ 4], h, w)``: state, static broadcast over the batch
    (or per sample, ``(B, n_static, h, w)``: a stochastic model's noise channels), time features
    broadcast to every pixel, and optionally the coordinate channels."""
    B, _, h, w = state.shape
    parts = [
        state,
        (static.to(state.dtype) if static.dim() == 4 else static.to(state.dtype).unsqueeze(0)).expand(
            B, -1, h, w
        ),
        time.to(state.dtype)[:, :, None, None].expand(-1, -1, h, w),
    ]
    if coords is not None:
        parts.append(coords.unsqueeze(0).expand(B, -1, h, w))
    return torch.cat(parts, dim=1)


class Forecaster(nn.Module):
    """Base class: ``forward(state, static, time) → next state`` on this rank's tile.

    * ``state``: ``(B, n_state, h, w)`` normalised variables × levels;
    * ``static``: ``(n_static, h, w)`` static fields (land–sea mask, orography, …), or
      ``(B, n_static, h, w)`` per sample (with noise channels, ``models/noise.py``);
    * ``time``: ``(B, n_time)`` time features;
    * returns ``(B, n_state, h, w)``: ``state + Δ`` when ``residual`` (the default), else ``Δ``.

    Subclasses implement ``predict(x) → Δ`` on the assembled input field ``x``, and name the
    layer that reads it (``input_layer``: no gradient flows into the input, so that layer's
    backward sends nothing for it) and the layer that writes the state's channels
    (``output_layer``). ``channel_dims`` (the fine-tuning hook) names the channel-indexed
    weights of those two layers; a model with more of them extends it (docs/models.md).
    """

    input_layer = "embed"
    output_layer = "recover"

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """``nn.Module.compile`` with every exchange a graph break (``comm.arm_for_compile``)."""
        arm_for_compile()
        super().compile(*args, **kwargs)

    def forward_stage(self, path: str) -> int:
        """Where the module at ``path`` runs in the forward, for ordering: modules registered in
        forward order (the default) all share stage 0; a model that registers them otherwise
        says so (``plan`` frees saved activations in reverse forward order)."""
        return 0

    def __init__(
        self,
        domain: Domain,
        n_state: int,
        n_static: int,
        n_time: int,
        residual: bool = True,
        coord_channels: bool = True,
    ):
        super().__init__()
        for name, value in (("n_state", n_state), ("n_static", n_static), ("n_time", n_time)):
            if value < (1 if name == "n_state" else 0):
                raise ValueError(
                    f"{type(self).__name__}: {name} must be ≥ {int(name == 'n_state')}, got {value}"
                )
        self.domain, self.n_state, self.n_static, self.n_time = domain, n_state, n_static, n_time
        self.residual, self.coord_channels = residual, coord_channels

    @property
    def in_channels(self) -> int:
        return self.n_state + self.n_static + self.n_time + (N_COORD_CHANNELS if self.coord_channels else 0)

    def _check(self, state: torch.Tensor, static: torch.Tensor, time: torch.Tensor) -> None:
        tile, name = self.domain.tile.shape, type(self).__name__
        want = {
            "state": ((-1, self.n_state, *tile), state),
            "static": ((self.n_static, *tile) if static.dim() != 4 else (-1, self.n_static, *tile), static),
            "time": ((-1, self.n_time), time),
        }
        for key, (shape, t) in want.items():
            if t.dim() != len(shape) or any(s not in (-1, n) for s, n in zip(shape, t.shape)):
                raise ValueError(
                    f"{name}.forward: {key} must be {tuple('B' if s == -1 else s for s in shape)} "
                    f"(this rank's {tile[0]}x{tile[1]} tile of the {self.domain.grid.n_lat}x"
                    f"{self.domain.grid.n_lon} grid), got {tuple(t.shape)}"
                )
        if static.dim() == 4 and static.shape[0] != state.shape[0]:
            raise ValueError(
                f"{name}.forward: static has {static.shape[0]} rows for a batch of {state.shape[0]}"
            )
        if time.shape[0] != state.shape[0]:
            raise ValueError(f"{name}.forward: time has {time.shape[0]} rows for a batch of {state.shape[0]}")

    def patch_layers(
        self,
        embed_dim: int,
        patch: int | tuple[int, int],
        stride: int | tuple[int, int] | None,
        lat_mode: str,
        recover_dim: int | None = None,
    ) -> tuple[PatchEmbed, PatchRecovery]:
        """The inputs' patch embedding and the state's patch recovery (token models): ``patch``
        and ``stride`` one size or ``(lat, lon)``; ``stride`` None means non-overlapping patches;
        overlapping ones (stride < patch) average. ``recover_dim``: the channels recovery reads
        (default ``embed_dim``)."""
        grid = self.domain.grid
        embed = PatchEmbed(self.domain, self.in_channels, embed_dim, patch, stride, lat_mode=lat_mode)
        overlap = "mean" if any(s < p for s, p in zip(embed.stride, embed.patch)) else "sum"
        recover = PatchRecovery(
            embed.out_domain, recover_dim or embed_dim, self.n_state, embed.patch, embed.stride,
            (grid.n_lat, grid.n_lon), overlap,
        )  # fmt: skip
        return embed, recover

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def input_names(self, channels: ModelChannels) -> tuple[str, ...]:
        """The names of the assembled input's channels (``assemble_inputs``' order)."""
        coords = COORD_CHANNEL_NAMES if self.coord_channels else ()
        return (*channels.state, *channels.static, *channels.time, *coords)

    def channel_dims(self, channels: ModelChannels) -> ChannelDims:
        """The fine-tuning hook: every parameter indexed by the data's channels, by path.

        Here: the input layer's weights by input channel and the output layer's by state
        channel, each layer describing its own (``channel_dims`` of ``PatchEmbed``,
        ``PatchRecovery``, ``Linear``, ``Conv2d``, the norms). A pure function of the names, so
        the same call with a parent's names describes the parent's tensors.
        """
        layers = dict(self.named_modules())
        dims: ChannelDims = {}
        for path, kwargs in (
            (self.input_layer, {"inputs": self.input_names(channels)}),
            (self.output_layer, {"outputs": channels.state}),
        ):
            layer = layers.get(path)
            hook = getattr(layer, "channel_dims", None)
            if hook is None:
                role = "input_layer" if "inputs" in kwargs else "output_layer"
                what = "missing" if layer is None else f"a {type(layer).__name__}, which has no channel_dims"
                raise ValueError(
                    f"{type(self).__name__}.{role} = {path!r} is {what}; name a jigsaw layer there or "
                    "override channel_dims (docs/models.md, fine-tuning)"
                )
            dims.update(prefixed(path, hook(**kwargs)))
        return dims

    def forward(self, state: torch.Tensor, static: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        self._check(state, static, time)
        coords = coordinate_channels(self.domain, state.dtype, state.device) if self.coord_channels else None
        held = prefetch_affine(self) if self.domain.size > 1 else ()  # every norm's affine, one all-gather
        delta = self.predict(assemble_inputs(state, static, time, coords))
        release_affine(held)
        return state + delta if self.residual else delta
