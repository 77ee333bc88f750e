"""The distributed core: mesh, tiles, collectives, halo exchange and the distributed matmul."""

from .collectives import all_gather, all_reduce, reduce_scatter
from .comm import comm_site, ledger
from .halo import Halo, halo_exchange, pad_reference
from .matmul import matmul_channels, matmul_tokens
from .mesh import Axis, DomainMesh, MeshShape, init_mesh, parse_mesh
from .tiles import Tile, TileGrid, split_sizes

__all__ = [
    "Axis",
    "DomainMesh",
    "Halo",
    "MeshShape",
    "Tile",
    "TileGrid",
    "all_gather",
    "all_reduce",
    "comm_site",
    "halo_exchange",
    "init_mesh",
    "ledger",
    "matmul_channels",
    "matmul_tokens",
    "pad_reference",
    "parse_mesh",
    "reduce_scatter",
    "split_sizes",
]
