"""WeatherBench 2's predefined evaluation regions, as latitude × longitude index sets.

Every predefined region of WB2's evaluation script is a product of latitude ranges and longitude
ranges (bounds inclusive, longitude in 0…360°). A region's spatial mean uses the *global* grid's
latitude weights restricted to its rows and renormalised over the region (WB2 slices the data and
keeps the weights computed on the whole grid). Values outside a region never enter its score, so a
NaN outside the region leaves it finite.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["REGIONS", "Region", "get_regions"]

Ranges = tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Region:
    """A union of latitude ranges × a union of longitude ranges (None: every longitude)."""

    name: str
    lat: Ranges = ((-90.0, 90.0),)
    lon: Ranges | None = None

    def row_mask(self, lat: np.ndarray) -> np.ndarray:
        lat = np.asarray(lat, dtype=np.float64)
        return np.logical_or.reduce([(lat >= lo) & (lat <= hi) for lo, hi in self.lat])

    def col_mask(self, lon: np.ndarray) -> np.ndarray:
        lon = np.mod(np.asarray(lon, dtype=np.float64), 360.0)
        if self.lon is None:
            return np.ones(lon.shape, dtype=bool)
        # 360° is 0°: a range ending at 360 includes longitude 0 only through a range starting at 0
        return np.logical_or.reduce([(lon >= lo) & (lon <= hi) for lo, hi in self.lon])


REGIONS: dict[str, Region] = {
    r.name: r
    for r in (
        Region("global"),
        Region("tropics", ((-20.0, 20.0),)),
        Region("extra-tropics", ((-90.0, -20.0), (20.0, 90.0))),
        Region("northern-hemisphere", ((20.0, 90.0),)),
        Region("southern-hemisphere", ((-90.0, -20.0),)),
        Region("europe", ((35.0, 75.0),), ((347.5, 360.0), (0.0, 42.5))),
        Region("north-america", ((25.0, 60.0),), ((240.0, 285.0),)),
        Region("north-atlantic", ((25.0, 65.0),), ((290.0, 350.0),)),
        Region("north-pacific", ((25.0, 60.0),), ((145.0, 230.0),)),
        Region("east-asia", ((25.0, 60.0),), ((102.5, 150.0),)),
        Region("ausnz", ((-45.0, -12.5),), ((120.0, 175.0),)),
        Region("arctic", ((60.0, 90.0),)),
        Region("antarctic", ((-90.0, -60.0),)),
    )
}


def get_regions(names: Sequence[str] | None) -> list[Region]:
    """Regions by name; ``None`` → global, ``["all"]`` → every predefined region."""
    if not names:
        return [REGIONS["global"]]
    if list(names) == ["all"]:
        return list(REGIONS.values())
    unknown = [n for n in names if n not in REGIONS]
    if unknown:
        hints = {n: difflib.get_close_matches(n, REGIONS, n=1) for n in unknown}
        hint = "; ".join(f"{n!r}: did you mean {h[0]!r}?" for n, h in hints.items() if h)
        raise ValueError(
            f"unknown region(s) {unknown}; WB2's predefined regions are {list(REGIONS)} or 'all'"
            + (f" ({hint})" if hint else "")
        )
    return [REGIONS[n] for n in dict.fromkeys(names)]
