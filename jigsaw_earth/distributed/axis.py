"""One communication axis of the mesh as seen from this rank: what ``comm`` and every collective
take. ``mesh.DomainMesh`` builds them (``data``, ``ensemble``, ``lat × lon`` domain)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist

from .transport import Wire

__all__ = ["Axis"]


@dataclass(frozen=True)
class Axis:
    """One communication axis as seen from this rank.

    ``ranks`` are the global ranks along the axis in axis order, ``index`` is this rank's
    position. ``group`` is ``None`` when the axis has size 1 (nothing to communicate). ``wire``:
    how the mesh's messages travel (``transport.Wire``; the mesh's own, shared by its axes).
    """

    name: str
    ranks: tuple[int, ...]
    index: int
    group: dist.ProcessGroup | None
    wire: Wire = field(default_factory=Wire, compare=False, repr=False)

    @property
    def size(self) -> int:
        return len(self.ranks)

    def peer(self, offset: int) -> int:
        """Global rank ``offset`` steps along the axis (cyclically)."""
        return self.ranks[(self.index + offset) % self.size]
