"""Whether a store's values are there and readable: a variable whose data files are gone, and a
damaged chunk, each named (the variable, the first unreadable time and its shard file) instead of
read as NaN or raised as a codec's bare error. Used by ``data inspect``, ``config validate --nans``
and the store preflight of training (``preflight.store_preflight``).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import xarray as xr
from jigsaw_earth.data.store import StoreView

__all__ = ["missing_files", "read_values"]


def read_values(view: StoreView, store_name: str, da: xr.DataArray) -> np.ndarray:
    """``da`` (a selection of variable ``store_name``) read as float64; a damaged or truncated
    chunk is a ``ValueError`` naming the variable, the first time that cannot be read and its
    shard file (when one time names one file), and the fix."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return np.asarray(da.values, dtype=np.float64)
    except (ValueError, RuntimeError, OSError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0].split(". Stored:")[0]
        where = _damaged_file(view, store_name, da)
        raise ValueError(
            f"store {view.path!r}: variable {store_name!r} cannot be read ({reason}){where}; a chunk is "
            f"damaged or truncated — re-write the store (data prepare / data synth --overwrite) or "
            f"restore it from a copy"
        ) from None


def _damaged_file(view: StoreView, store_name: str, da: xr.DataArray) -> str:
    """``: at TIME, file PATH`` for the first time of ``da`` that cannot be read ('' if unknown)."""
    tdim = view.coord_names["time"]
    if tdim not in da.dims:
        return ""
    for k in range(da.sizes[tdim]):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                np.asarray(da.isel({tdim: k}).values)
        except (ValueError, RuntimeError, OSError):
            when = np.datetime_as_string(np.asarray(da[tdim].values[k]).astype("datetime64[s]"), unit="h")
            arr = view.array(store_name)
            block = getattr(arr, "shards", None) or arr.chunks
            axis = list(view.dataset[store_name].dims).index(tdim)
            index = int(np.nonzero(view.times == da[tdim].values[k])[0][0])
            if any(n > b for i, (n, b) in enumerate(zip(arr.shape, block)) if i != axis):
                return f": at {when}, a file of {Path(view.path) / store_name}"
            coords = tuple(index // block[i] if i == axis else 0 for i in range(len(block)))
            key = arr.metadata.encode_chunk_key(coords)
            return f": at {when}, file {Path(view.path) / store_name / key}"
    return ""


def missing_files(view: StoreView, store_name: str) -> str | None:
    """Why the values of ``store_name`` are not on disk (``None``: they are, or the store is not
    local): its array folder or its metadata is gone while the store's consolidated metadata
    still lists it, or it holds no chunk while its fill value is NaN. Either way every value
    reads as NaN (the fill value) instead of failing."""
    if "://" in view.path and not view.path.startswith("file://"):
        return None
    folder = Path(view.path.removeprefix("file://")) / store_name
    meta = next((folder / n for n in ("zarr.json", ".zarray") if (folder / n).is_file()), None)
    if meta is None:
        missing = f"{folder} is gone" if not folder.exists() else f"{folder} has no zarr.json"
    else:
        try:
            fill = json.loads(meta.read_text()).get("fill_value")
        except (OSError, ValueError):
            return None
        chunks = folder / "c" if meta.name == "zarr.json" else folder
        if fill != "NaN" or any(p.name not in (".zarray", ".zattrs") for p in chunks.glob("*")):
            return None
        missing = f"{folder} holds no chunk"
    return (
        f"the data files of {store_name!r} are missing: {missing}, though the store still lists the "
        f"variable (every value would read as NaN). Restore {folder} from a copy or re-write the store "
        f"(data prepare, data synth --overwrite)"
    )
