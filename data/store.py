"""Opening an ERA5 Zarr store and mapping its names and coordinates onto the WB2 conventions.

Everything goes by coordinate *names and values*, never by position: latitude may be stored
ascending or descending, levels in any order (hPa or Pa), dimensions as ``(lat, lon)`` or
``(lon, lat)``, and variables under other names (``t2m``, ``u10``, ``msl``, ``z``, ``t`` ...).
The *normalised* grid every other module uses is latitude descending (north → south, the WB2
convention) and longitude ascending; ``StoreView.lat_storage`` / ``lon_storage`` map normalised
positions back to storage positions.

``CountingStore`` wraps any zarr store and counts the bytes actually returned by chunk reads:
the honest I/O measurement behind ``jigsaw-earth data io-report``.
"""

from __future__ import annotations

import logging
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
import zarr
import zarr.storage
from jigsaw_earth.data.grib_messages import GRIB_SUFFIXES
from jigsaw_earth.data.objects import is_object_url, zarr_object_store
from jigsaw_earth.data.times import decode_times
from jigsaw_earth.data.variables import VARIABLES, names_of

__all__ = [
    "ACCUMULATED",
    "ACCUMULATION_ATTR",
    "ALIASES",
    "STATIC_VARIABLES",
    "SURFACE_VARIABLES",
    "UPPER_AIR_VARIABLES",
    "CountingStore",
    "StoreView",
    "canonical_dataset",
    "canonical_name",
    "open_dataset",
    "open_store",
    "rename_fix",
]

log = logging.getLogger(__name__)

# The variable lists and the naming table come from the one table of variables (``variables.py``).
UPPER_AIR_VARIABLES = names_of("pressure")
SURFACE_VARIABLES = names_of("surface", "static")
STATIC_VARIABLES = names_of("static")
# Accumulated fields: canonical name -> accumulation period in hours (see ``variables.py``).
ACCUMULATED: dict[str, int | None] = {v.name: v.accumulation_hours for v in VARIABLES if v.accumulation_hours}
ACCUMULATION_ATTR = "accumulation_hours"
# THE naming table: canonical (WB2) name -> other names ERA5 files use (CDS netCDF short names,
# GRIB shortNames, CMIP names), the variables' from ``variables.py``, then the coordinates'. Upper-air
# aliases only match variables with a level dimension and surface aliases only ones without, so ``z``
# maps to geopotential in a pressure-level file and to geopotential_at_surface in a single-level one
# (the CDS pair of files both hold ``z``; merging them goes through this table, see
# ``prepare.open_source``).
ALIASES: dict[str, tuple[str, ...]] = {
    **{v.name: v.names for v in VARIABLES},
    "latitude": ("lat", "nav_lat", "y"),
    "longitude": ("lon", "nav_lon", "x"),
    "level": ("plev", "pressure_level", "isobaricInhPa", "lev", "pressure"),
    # WB2's ``time`` is a forecast's initialisation time: ``init_time`` wins over ``valid_time``
    "time": ("init_time", "valid_time", "datetime", "t_axis", "date"),
    "prediction_timedelta": ("lead_time", "step"),  # forecast stores' lead dimension
    # an ensemble forecast's member dimension: WB2 and ECMWF call it ``number`` (also ``realization``)
    "number": ("realization", "member", "ensemble_member"),
}
COORDS = ("time", "level", "latitude", "longitude")

# zarr decodes/encodes chunks one at a time by default (batch_size 1); batching them is 2–4×
# faster for the many small inner chunks of tile-aligned shards, for reads and writes alike.
if zarr.config.get("codec_pipeline.batch_size") == 1:
    zarr.config.set({"codec_pipeline.batch_size": 128})


class CountingStore(zarr.storage.WrapperStore):
    """A zarr store wrapper counting the bytes and requests its reads return (thread-safe)."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.bytes_read = 0
        self.requests = 0
        self._lock = threading.Lock()

    def _with_store(self, store: Any) -> CountingStore:
        return type(self)(store)

    def _count(self, *buffers: Any) -> None:
        n = sum(len(b) for b in buffers if b is not None)
        with self._lock:
            self.bytes_read += n
            self.requests += sum(b is not None for b in buffers)

    def reset(self) -> None:
        with self._lock:
            self.bytes_read = 0
            self.requests = 0

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        out = await self._store.get(key, prototype, byte_range)
        self._count(out)
        return out

    async def get_partial_values(self, prototype: Any, key_ranges: Any) -> list[Any]:
        outs = await self._store.get_partial_values(prototype, key_ranges)
        self._count(*outs)
        return outs


def _is_url(path: str) -> bool:
    return "://" in path


def open_store(path: str | Path, *, count: bool = False, read_only: bool = True) -> Any:
    """A zarr store for a local path, a bucket URL (``s3://``, ``gs://``: ``objects.zarr_object_store``)
    or any other fsspec URL (``memory://``, ...)."""
    text = str(path)
    if is_object_url(text):
        store: Any = zarr_object_store(text, read_only=read_only)
    elif _is_url(text) and not text.startswith("file://"):
        try:
            store = zarr.storage.FsspecStore.from_url(text, read_only=read_only)
        except (ImportError, ValueError) as err:
            protocol = text.split("://", 1)[0]
            raise ValueError(
                f"cannot open {text!r}: {err}. Install the fsspec backend for {protocol}:// "
                f"(e.g. `pip install gcsfs` for gs://, `s3fs` for s3://)"
            ) from None
    else:
        local = Path(text.removeprefix("file://"))
        if read_only and not local.exists():
            raise FileNotFoundError(
                f"data store {text!r} does not exist; create one with `jigsaw-earth data synth "
                f"--out {text}` or `jigsaw-earth data prepare SRC --out {text}`"
            )
        store = zarr.storage.LocalStore(local, read_only=read_only)
    return CountingStore(store) if count else store


def open_dataset(path: str | Path, store: Any = None) -> xr.Dataset:
    """The xarray dataset of a Zarr store at a local path or any fsspec URL, arrays read lazily.

    The one opener behind training, predict, score and plots (``store``: an ``open_store`` result
    to reuse, e.g. a counting one); missing consolidated metadata is not a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return xr.open_zarr(open_store(path) if store is None else store, chunks=None, consolidated=None)


def _store_fix(path: str | Path) -> str:
    """What to do about a path that holds no Zarr store: convert the GRIB or netCDF files it holds, or
    make a store."""
    local = Path(str(path))
    files = [local] if local.is_file() else sorted(local.iterdir()) if local.is_dir() else []
    kinds = sorted({f.suffix.lower() for f in files if f.suffix.lower() in (*GRIB_SUFFIXES, ".nc", ".nc4")})
    if kinds:
        return (
            f"it holds {'/'.join(kinds)} files, which this command does not read: convert them into a "
            f"store with `jigsaw-earth data prepare {path} --out STORE`"
        )
    return "check the path or URL, or create one with `jigsaw-earth data synth --out PATH`"


def rename_fix(canonical: str, option: bool) -> str:
    """How to have a source's own name read as ``canonical``: ``--name`` where the command has it
    (``data prepare``), else renaming it in the source (``predict --init``, a training store)."""
    if option:
        return f"Map it with --name {canonical}=NAME_IN_SOURCE"
    return (
        f"Rename it to {canonical!r} in the source (netCDF: `ncrename -v NAME,{canonical}`; GRIB: "
        f"`grib_set -s shortName=…`; or convert it with jigsaw-earth data prepare SRC --name "
        f"{canonical}=NAME --out STORE)"
    )


def _find(names: list[str], canonical: str, mapping: dict[str, str]) -> str | None:
    if canonical in mapping:
        return mapping[canonical] if mapping[canonical] in names else None
    for cand in (canonical, *ALIASES.get(canonical, ())):
        if cand in names:
            return cand
    return None


@dataclass
class StoreView:
    """Metadata of an opened store: names, normalised coordinates and zarr arrays.

    ``lat`` is descending and ``lon`` ascending (normalised); ``lat_storage[i]`` is the storage
    row of normalised row ``i`` (likewise ``lon_storage``). ``levels`` are in hPa, in storage
    order. ``names`` maps canonical variable names to the store's names.
    """

    path: str
    store: Any
    dataset: xr.Dataset
    group: Any
    coord_names: dict[str, str]
    lat: np.ndarray
    lon: np.ndarray
    lat_storage: np.ndarray
    lon_storage: np.ndarray
    times: np.ndarray
    levels: np.ndarray | None
    names: dict[str, str] = field(default_factory=dict)
    messages: Any = None  # a GRIB source's ``grib.GribMessages``: what each variable holds, for errors
    renamable: bool = False  # opened with a name mapping (``data prepare --name``): errors offer it

    @classmethod
    def open(
        cls,
        path: str | Path,
        names: dict[str, str] | None = None,
        count: bool = False,
        time_units: str | None = None,
    ) -> StoreView:
        store = open_store(path, count=count)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                ds = open_dataset(path, store)
                group = zarr.open_group(store, mode="r")
            except FileNotFoundError:
                raise FileNotFoundError(f"no Zarr store at {str(path)!r}; {_store_fix(path)}") from None
        info = group.attrs.get("jigsaw_earth")
        if str(path).rstrip("/").rsplit("/", 1)[-1].find(".tmp-") >= 0 or (
            isinstance(info, dict) and info.get("complete") is False
        ):
            raise ValueError(
                f"store {str(path)!r} is an incomplete write (a crashed prepare/synth); "
                f"delete it and run the command again"
            )
        return cls.from_dataset(ds, path, store=store, group=group, names=names, time_units=time_units)

    @classmethod
    def from_dataset(
        cls,
        ds: xr.Dataset,
        path: str | Path,
        store: Any = None,
        group: Any = None,
        names: dict[str, str] | None = None,
        time_units: str | None = None,
    ) -> StoreView:
        """A view of an opened dataset (zarr reads need ``group``; netCDF sources have none)."""
        mapping = dict(names or {})
        present = [str(n) for n in ds.variables]
        coords: dict[str, str] = {}
        for c in COORDS:
            found = _find(present, c, mapping)
            if found is None and c != "level":
                raise ValueError(
                    f"store {str(path)!r} has no {c} coordinate; it has {sorted(present)}. "
                    f"{rename_fix(c, names is not None)}"
                )
            if found is not None:
                coords[c] = found
        lat = np.asarray(ds[coords["latitude"]].values, dtype=np.float64)
        lon = np.asarray(ds[coords["longitude"]].values, dtype=np.float64)
        lat_storage = np.argsort(-lat, kind="stable")
        lon_storage = np.argsort(lon, kind="stable")
        for name, values in (("latitude", lat), ("longitude", lon)):
            if values.ndim != 1 or len(np.unique(values)) != len(values):
                raise ValueError(f"{name} of {str(path)!r} must be 1-D with distinct values")
        tvar = ds[coords["time"]]
        times = decode_times(
            tvar.values,
            {**tvar.encoding, **tvar.attrs},
            ds.attrs,
            time_units,
            f"{str(path)!r} ({coords['time']!r})",
        )
        if not np.issubdtype(tvar.dtype, np.datetime64):
            ds = ds.assign_coords({coords["time"]: (tvar.dims, times, {})})
        levels = None
        if "level" in coords:
            levels = np.asarray(ds[coords["level"]].values, dtype=np.float64)
            if levels.size and levels.max() > 2000:  # stored in Pa
                levels = levels / 100.0
        view = cls(
            str(path),
            store,
            ds,
            group,
            coords,
            lat[lat_storage],
            lon[lon_storage],
            lat_storage,
            lon_storage,
            times,
            levels,
        )
        view._mapping = mapping  # type: ignore[attr-defined]
        view.renamable = names is not None  # the command maps names (data prepare's --name)
        return view

    # ---- grid -----------------------------------------------------------------------------
    @property
    def grid_shape(self) -> tuple[int, int]:
        return len(self.lat), len(self.lon)

    @property
    def lat_descending_in_storage(self) -> bool:
        """Whether the store keeps latitude north to south (its rows in the normalised order)."""
        return bool(np.all(self.lat_storage == np.arange(len(self.lat))))

    # ---- variables ------------------------------------------------------------------------
    def available(self) -> list[str]:
        """Data variables of the store (store names)."""
        return sorted(str(v) for v in self.dataset.data_vars)

    def resolve(self, canonical: str, upper_air: bool) -> str:
        """Store name of a canonical variable; a clear error listing the store when missing."""
        if canonical in self.names:
            return self.names[canonical]
        level = self.coord_names.get("level")
        candidates = [v for v in self.available() if (level in self.dataset[v].dims) == upper_air]
        found = _find(candidates, canonical, getattr(self, "_mapping", {}))
        if found is None:
            kind = "upper-air (with a level dimension)" if upper_air else "surface (no level)"
            raise ValueError(
                f"variable {canonical!r} ({kind}) is not in store {self.path!r}; the store has "
                f"{self.describe_variables()}. {rename_fix(canonical, self.renamable)}, or drop it from "
                f"the variable list"
            )
        self.names[canonical] = found
        return found

    def known_variables(self) -> tuple[list[str], list[str], list[str]]:
        """(upper-air, surface, static) canonical names the store holds, in the table's order."""
        found: dict[str, list[str]] = {"upper": [], "surface": [], "static": []}
        for kind, names, upper in (
            ("upper", UPPER_AIR_VARIABLES, True),
            ("surface", SURFACE_VARIABLES, False),
        ):
            for v in names:
                try:
                    self.resolve(v, upper_air=upper)
                except ValueError:
                    continue
                found["static" if v in STATIC_VARIABLES else kind].append(v)
        return found["upper"], found["surface"], found["static"]

    def describe_variables(self) -> str:
        level = self.coord_names.get("level")
        parts = []
        for v in self.available():
            dims = self.dataset[v].dims
            parts.append(f"{v}{'[level]' if level in dims else ''}")
        found = ", ".join(parts) or "no data variables"
        return found if self.messages is None else f"{found}, from {self.messages.describe()}"

    def level_indices(self, canonical: str, wanted: tuple[int, ...]) -> np.ndarray:
        """Storage indices of the wanted levels (hPa), in the order asked."""
        if self.levels is None:
            raise ValueError(f"store {self.path!r} has no level coordinate but {canonical!r} needs levels")
        out = []
        for lev in wanted:
            hits = np.nonzero(np.isclose(self.levels, float(lev)))[0]
            if not len(hits):
                raise ValueError(
                    f"level {lev} hPa of {canonical!r} is not in store {self.path!r}; it has "
                    f"levels {[int(x) if float(x).is_integer() else float(x) for x in self.levels]}"
                    f". Choose levels from that list"
                )
            out.append(int(hits[0]))
        return np.asarray(out)

    def array(self, store_name: str) -> Any:
        cache = self.__dict__.setdefault("_arrays", {})
        if store_name not in cache:
            cache[store_name] = self.group[store_name]
        return cache[store_name]

    def dims(self, store_name: str) -> tuple[str, ...]:
        """Dimensions of a variable, as canonical coordinate names."""
        cache = self.__dict__.setdefault("_dims", {})
        if store_name not in cache:
            inverse = {v: k for k, v in self.coord_names.items()}
            cache[store_name] = tuple(inverse.get(str(d), str(d)) for d in self.dataset[store_name].dims)
        return cache[store_name]

    def encoding(self, store_name: str) -> tuple[float, float, Any]:
        """(scale_factor, add_offset, _FillValue) of a variable: (1, 0, fill) unless CF-packed."""
        cache = self.__dict__.setdefault("_enc", {})
        if store_name not in cache:
            enc = self.dataset[store_name].encoding
            cache[store_name] = (
                float(enc.get("scale_factor", 1.0)),
                float(enc.get("add_offset", 0.0)),
                enc.get("_FillValue"),
            )
        return cache[store_name]


def canonical_name(var: str, upper: bool, mapping: dict[str, str]) -> str | None:
    """The canonical name a store variable (upper-air: with levels) maps to: the user's mapping, then
    the naming table; None when neither names it."""
    for canonical, store_name in mapping.items():
        if store_name == var and canonical not in COORDS:
            return canonical
    for canonical in UPPER_AIR_VARIABLES if upper else SURFACE_VARIABLES:
        if canonical not in mapping and var in (canonical, *ALIASES.get(canonical, ())):
            return canonical
    return None


def canonical_dataset(
    ds: xr.Dataset, path: str | Path, names: dict[str, str] | None = None, time_units: str | None = None
) -> xr.Dataset:
    """``ds`` with canonical coordinates (time, [level] in hPa, latitude, longitude) and variable
    names from ``ALIASES`` (or ``names``); non-dimension coordinates (``expver``, ``number``) are
    dropped. Unmapped variables keep their names. Used per file before files are merged, so the
    ``z`` of a pressure-level file and the ``z`` of a single-level file cannot collide.
    """
    mapping = dict(names or {})
    view = StoreView.from_dataset(ds, path, names=mapping, time_units=time_units)
    ds = view.dataset.rename({v: k for k, v in view.coord_names.items() if v != k})
    ds = ds.reset_coords(drop=True)
    if view.levels is not None:
        ds = ds.assign_coords(level=np.rint(view.levels).astype(np.int64))
    rename: dict[str, str] = {}
    for var in map(str, ds.data_vars):
        canonical = canonical_name(var, "level" in ds[var].dims, mapping)
        if canonical is None or canonical == var:
            continue
        if canonical in rename.values() or canonical in ds.data_vars:
            log.warning("%s: %r also maps to %r; keeping the first", path, var, canonical)
            continue
        rename[var] = canonical
    if rename:
        log.info("%s: %s", path, ", ".join(f"{a} -> {b}" for a, b in rename.items()))
    return ds.rename(rename)
