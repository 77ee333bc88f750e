"""Tile geometry: a global latitude × longitude grid split over the mesh's lat and lon axes.

Sizes may be uneven: ``n`` rows over ``k`` ranks gives the first ``n % k`` ranks one extra row
(721 over 4 is 181, 180, 180, 180), the same rule as ``torch.tensor_split``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["Tile", "TileGrid", "split_offsets", "split_sizes"]


def split_sizes(n: int, parts: int) -> tuple[int, ...]:
    """Sizes of ``parts`` near-equal pieces of ``n`` (larger pieces first)."""
    if parts < 1:
        raise ValueError(f"cannot split into {parts} parts; need at least 1")
    base, extra = divmod(n, parts)
    return tuple(base + (1 if k < extra else 0) for k in range(parts))


def split_offsets(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """Start offsets for consecutive pieces of the given sizes (length ``len(sizes) + 1``)."""
    out = [0]
    for s in sizes:
        out.append(out[-1] + s)
    return tuple(out)


@dataclass(frozen=True)
class Tile:
    """One rank's piece of the global grid: rows ``[lat_start, lat_stop)``, columns likewise."""

    lat_start: int
    lat_stop: int
    lon_start: int
    lon_stop: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.lat_stop - self.lat_start, self.lon_stop - self.lon_start)

    @property
    def slices(self) -> tuple[slice, slice]:
        return slice(self.lat_start, self.lat_stop), slice(self.lon_start, self.lon_stop)


@dataclass(frozen=True)
class TileGrid:
    """A ``n_lat × n_lon`` grid split into ``mesh_lat × mesh_lon`` tiles.

    Sizes and offsets are computed once at construction (plain attributes, so ``torch.compile``
    traces through them without graph breaks).
    """

    n_lat: int
    n_lon: int
    mesh_lat: int = 1
    mesh_lon: int = 1
    lat_sizes: tuple[int, ...] = field(init=False, repr=False, compare=False)
    lon_sizes: tuple[int, ...] = field(init=False, repr=False, compare=False)
    lat_offsets: tuple[int, ...] = field(init=False, repr=False, compare=False)
    lon_offsets: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, n, k in (("latitude", self.n_lat, self.mesh_lat), ("longitude", self.n_lon, self.mesh_lon)):
            if n < k:
                raise ValueError(
                    f"{name} has {n} points but the mesh splits it over {k} ranks; every rank "
                    f"needs at least one point: use a mesh with at most {n} ranks along {name}"
                )
        object.__setattr__(self, "lat_sizes", split_sizes(self.n_lat, self.mesh_lat))
        object.__setattr__(self, "lon_sizes", split_sizes(self.n_lon, self.mesh_lon))
        object.__setattr__(self, "lat_offsets", split_offsets(self.lat_sizes))
        object.__setattr__(self, "lon_offsets", split_offsets(self.lon_sizes))

    @property
    def n_tiles(self) -> int:
        return self.mesh_lat * self.mesh_lon

    def tile(self, lat_index: int, lon_index: int) -> Tile:
        a, b = self.lat_offsets, self.lon_offsets
        return Tile(a[lat_index], a[lat_index + 1], b[lon_index], b[lon_index + 1])

    def tile_of(self, domain_index: int) -> Tile:
        """Tile of the rank at position ``domain_index`` of the (lat-major) domain axis."""
        return self.tile(domain_index // self.mesh_lon, domain_index % self.mesh_lon)

    def tiles(self) -> list[Tile]:
        """All tiles in domain-axis order."""
        return [self.tile_of(k) for k in range(self.n_tiles)]

    def lat_owner(self, row: int) -> int:
        """Index along the lat axis of the rank that owns global ``row``."""
        return _owner(self.lat_offsets, row)

    def lon_owner(self, col: int) -> int:
        return _owner(self.lon_offsets, col)

    def scatter(self, field: torch.Tensor, domain_index: int) -> torch.Tensor:
        """This rank's tile of a global field shaped ``(..., n_lat, n_lon)`` (a copy)."""
        self._check_global(field)
        rows, cols = self.tile_of(domain_index).slices
        return field[..., rows, cols].clone()

    def assemble(self, tiles: list[torch.Tensor]) -> torch.Tensor:
        """Global field from all tiles given in domain-axis order."""
        rows = [
            torch.cat(tiles[i * self.mesh_lon : (i + 1) * self.mesh_lon], dim=-1)
            for i in range(self.mesh_lat)
        ]
        return torch.cat(rows, dim=-2)

    def _check_global(self, field: torch.Tensor) -> None:
        if tuple(field.shape[-2:]) != (self.n_lat, self.n_lon):
            raise ValueError(
                f"field has trailing shape {tuple(field.shape[-2:])}, expected the global grid "
                f"({self.n_lat}, {self.n_lon})"
            )


def _owner(offsets: tuple[int, ...], index: int) -> int:
    lo, hi = 0, len(offsets) - 2
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if offsets[mid] <= index:
            lo = mid
        else:
            hi = mid - 1
    return lo
