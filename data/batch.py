"""The typed batch a rank receives, and the channel order.

Channel order (stable, documented): every upper-air variable in the order given, each on every
level in ascending hPa (``geopotential@500``, ``geopotential@850``, ``temperature@500``, ...),
then the surface variables in the order given. Static channels: the static variables found in
the store (land_sea_mask, geopotential_at_surface), then cos/sin latitude and cos/sin longitude.
Time features: sin/cos of hour of day and of day of year, at the input time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from jigsaw_earth.data.store import STATIC_VARIABLES

from jigsaw_earth.distributed.halo import Halo
from jigsaw_earth.distributed.tiles import Tile

__all__ = [
    "DEFAULT_LEVELS",
    "DEFAULT_STATIC",
    "DEFAULT_SURFACE",
    "DEFAULT_UPPER_AIR",
    "N_GEOMETRY_CHANNELS",
    "STATIC_GEOMETRY",
    "TRAIN_SURFACE",
    "TRAIN_UPPER_AIR",
    "Batch",
    "VariableSpec",
    "channel_names",
]

log = logging.getLogger(__name__)

# The default variables, named once. What ``data synth`` writes and a ``VariableSpec`` reads:
DEFAULT_UPPER_AIR = (
    "geopotential",
    "temperature",
    "u_component_of_wind",
    "v_component_of_wind",
    "specific_humidity",
)
DEFAULT_LEVELS = (500, 850)
DEFAULT_SURFACE = (
    "2m_temperature",
    "10m_u_component_of_wind",
    "10m_v_component_of_wind",
    "mean_sea_level_pressure",
)
DEFAULT_STATIC = STATIC_VARIABLES
# ... and the smaller default a training config trains on (``data.upper_air``, ``data.surface``)
TRAIN_UPPER_AIR = ("geopotential", "temperature")
TRAIN_SURFACE = ("2m_temperature",)
# the reader's geometry channels (``sphere.coordinate_channels`` of the store's own coordinates)
STATIC_GEOMETRY = ("cos_latitude", "sin_latitude", "cos_longitude", "sin_longitude")
N_GEOMETRY_CHANNELS = len(STATIC_GEOMETRY)


def channel_names(
    upper_air: tuple[str, ...] | list[str],
    levels: tuple[int, ...] | list[int],
    surface: tuple[str, ...] | list[str],
) -> list[str]:
    """Names ``variable@level`` for upper-air variables (levels ascending) then surface names."""
    levs = sorted(int(x) for x in levels)
    return [f"{v}@{lev}" for v in upper_air for lev in levs] + list(surface)


@dataclass(frozen=True)
class VariableSpec:
    """Which fields make up a sample: upper-air variables × levels (hPa), surface, static."""

    upper_air: tuple[str, ...] = DEFAULT_UPPER_AIR
    levels: tuple[int, ...] = DEFAULT_LEVELS
    surface: tuple[str, ...] = DEFAULT_SURFACE
    static: tuple[str, ...] = DEFAULT_STATIC

    def __post_init__(self) -> None:
        object.__setattr__(self, "upper_air", tuple(self.upper_air))
        object.__setattr__(self, "levels", tuple(sorted(int(x) for x in self.levels)))
        object.__setattr__(self, "surface", tuple(self.surface))
        object.__setattr__(self, "static", tuple(self.static))
        if self.upper_air and not self.levels:
            raise ValueError(f"upper-air variables {list(self.upper_air)} need at least one level")
        names = [*self.upper_air, *self.surface]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"variables {dup} are listed twice; list each once")
        if not names:
            raise ValueError("no variables: give at least one upper-air or surface variable")

    @property
    def channels(self) -> list[str]:
        return channel_names(self.upper_air, self.levels, self.surface)

    @property
    def n_channels(self) -> int:
        return len(self.upper_air) * len(self.levels) + len(self.surface)


@dataclass
class Batch:
    """One batch of samples for one rank's tile.

    Shapes (``B`` batch, ``C`` channels, ``h × w`` the tile, ``H = h + sum(halo.lat)``,
    ``W = w + sum(halo.lon)``):

    - ``inputs``: ``(B, C, H, W)`` float32, normalised, with the halo (= the tile's window of
      ``pad_reference`` applied to the global field).
    - ``targets``: ``(B, lead_steps, C, h, w)`` float32, normalised, no halo.
    - ``static``: ``(C_static, H, W)`` float32, with the halo (same for every sample).
    - ``time_features``: ``(B, F)`` float32 (``times.TIME_FEATURES``) at the input time.
    - ``times``: ``B`` input (initialisation) times; ``target_times``: ``(B, lead_steps)``.
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    static: torch.Tensor
    time_features: torch.Tensor
    channels: list[str]
    static_channels: list[str]
    times: np.ndarray
    target_times: np.ndarray
    tile: Tile
    halo: Halo = field(default_factory=Halo)

    def __post_init__(self) -> None:
        b, c, hh, ww = self.inputs.shape
        h, w = self.tile.shape
        if (hh, ww) != (h + sum(self.halo.lat), w + sum(self.halo.lon)):
            raise ValueError(
                f"inputs are {hh}x{ww} but tile {h}x{w} with halo lat={self.halo.lat} "
                f"lon={self.halo.lon} needs {h + sum(self.halo.lat)}x{w + sum(self.halo.lon)}"
            )
        if c != len(self.channels):
            raise ValueError(f"inputs have {c} channels but {len(self.channels)} names were given")
        if self.targets.ndim != 5 or tuple(self.targets.shape[-2:]) != (h, w):
            raise ValueError(f"targets {tuple(self.targets.shape)} must be (B, lead, C, {h}, {w})")
        if self.static.shape[-2:] != self.inputs.shape[-2:]:
            raise ValueError(f"static {tuple(self.static.shape)} must match inputs' grid {hh}x{ww}")
        if self.time_features.shape[0] != b:
            raise ValueError(f"time_features has {self.time_features.shape[0]} rows for batch {b}")

    @property
    def batch_size(self) -> int:
        return int(self.inputs.shape[0])

    @property
    def lead_steps(self) -> int:
        return int(self.targets.shape[1])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """Move the tensors to ``device`` (pinned host memory makes ``non_blocking`` async)."""
        return self._map_tensors(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        return self._map_tensors(lambda t: t.pin_memory())

    def _map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
        """This batch with ``fn`` of each of its tensors; names, times, tile and halo shared."""
        return replace(
            self, **{k: fn(getattr(self, k)) for k in ("inputs", "targets", "static", "time_features")}
        )
