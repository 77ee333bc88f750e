"""The README's picture: a field split into latitude × longitude tiles, one tile's halo, a weight's shards.

``python scripts/readme_picture.py`` writes ``docs/images/jigsaw-tiles.png``: a smooth global field on a
34 × 64 grid split over a 3 × 4 mesh by the toolkit's own rule (``TileGrid``: uneven rows), the halo
one tile reads from its neighbours (longitude periodic), and a weight matrix split into the same
twelve ranks' shards.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

from jigsaw_earth.distributed.tiles import TileGrid

OUT = Path(__file__).resolve().parents[1] / "docs" / "images" / "jigsaw-tiles.png"
N_LAT, N_LON, MESH_LAT, MESH_LON, HALO = 34, 64, 3, 4, 2


def field() -> np.ndarray:
    lat = np.linspace(90, -90, N_LAT)[:, None] * np.pi / 180
    lon = np.arange(N_LON)[None, :] * 2 * np.pi / N_LON
    return (
        np.cos(lat) ** 2 + 0.25 * np.sin(3 * lon) * np.sin(2 * lat) + 0.15 * np.cos(5 * lon + 1) * np.cos(lat)
    )


def main() -> None:
    grid = TileGrid(N_LAT, N_LON, MESH_LAT, MESH_LON)
    fig, (ax, aw) = plt.subplots(1, 2, figsize=(10, 3.4), gridspec_kw={"width_ratios": [2.2, 1]})
    ax.imshow(field(), cmap="viridis", origin="upper", extent=(0, N_LON, N_LAT, 0))
    for r in range(MESH_LAT):
        for c in range(MESH_LON):
            t = grid.tile(r, c)
            r0, r1, c0, c1 = t.lat_start, t.lat_stop, t.lon_start, t.lon_stop
            ax.add_patch(Rectangle((c0, r0), c1 - c0, r1 - r0, fill=False, ec="white", lw=1.5))
            ax.text((c0 + c1) / 2, (r0 + r1) / 2, f"rank {r * MESH_LON + c}\n{r1 - r0}×{c1 - c0}",
                    ha="center", va="center", color="white", fontsize=8)  # fmt: skip
    t = grid.tile(1, 1)
    r0, r1, c0, c1 = t.lat_start, t.lat_stop, t.lon_start, t.lon_stop
    ax.add_patch(Rectangle((c0 - HALO, r0 - HALO), c1 - c0 + 2 * HALO, r1 - r0 + 2 * HALO, fill=False,
                           ec="orange", lw=2, ls="--"))  # fmt: skip
    ax.set_title("a sample: each rank reads and holds its tile (+ halo, dashed)", fontsize=9)
    ax.set_xlabel("longitude index (periodic)")
    ax.set_ylabel("latitude index (uneven tiles)")
    shards = np.arange(MESH_LAT * MESH_LON).reshape(MESH_LAT * MESH_LON, 1) * np.ones((1, 6))
    aw.imshow(shards, cmap="tab20", aspect="auto")
    for k in range(MESH_LAT * MESH_LON):
        aw.text(2.5, k, f"rank {k}", ha="center", va="center", fontsize=7)
    aw.set_title("a weight: each rank holds a shard", fontsize=9)
    aw.set_xticks([])
    aw.set_yticks([])
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT.relative_to(OUT.parents[2])}")


if __name__ == "__main__":
    main()
