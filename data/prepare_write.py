"""``data prepare``'s writer: the source read once, in time blocks, into a local or bucket store; resumable.

The selected source (``prepare.prepare_store``'s lazy dataset) is computed one block of times at a
time (about ``memory_mb`` of float32 fields: one ARCO-ERA5 time, all levels, the whole globe, is
~1 GB) and each block is written into the training layout (tile shards) while the next is read, so
memory stays at two blocks whatever the store's length, and every source chunk is fetched once
(blocks follow the source's time chunks). Statistics are accumulated as the blocks pass
(``stats.RunningStats``): nothing is read twice.

Commit without rename (object stores have none): the store is created with the root attribute
``jigsaw_earth = {"kind": "store", "complete": false}``, which ``StoreView.open`` refuses naming the
store; after each block its progress (the times written and the statistics so far) goes to
``_prepare/progress.json`` inside it; the statistics and then ``complete: true`` with the consolidated
metadata are written last. A bucket store is written in place; a local one under ``DST.tmp-prepare``
(refused as unfinished by its name as well) and renamed to ``DST`` once complete. The same command
run again after an interruption finds the progress record, checks that it asks for the same store
(source, variables, times, layout, statistics period) and resumes at the first time not recorded.
"""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
import zarr
from jigsaw_earth.data.objects import is_object_url
from jigsaw_earth.data.stats import STATS, RunningStats, _grid_attrs, write_statistics
from jigsaw_earth.data.store import open_store
from jigsaw_earth.data.zarr_api import default_buffer_prototype, sync
from tqdm.auto import tqdm

from jigsaw_earth.ownership import MARKER, check_output, replace_output

__all__ = ["LOCAL_SUFFIX", "PROGRESS_KEY", "Target", "write_blocks"]

log = logging.getLogger(__name__)
PROGRESS_KEY = "_prepare/progress.json"
LOCAL_SUFFIX = ".tmp-prepare"  # a local store being written (``ownership``'s temporary names)
KIND = "store"


@dataclass
class Target:
    """Where a prepare writes: ``dst`` as asked, ``at`` the store being written (the same URL for a
    bucket, ``DST.tmp-prepare`` for a local path) and its writable zarr store."""

    dst: str
    at: str
    bucket: bool
    store: Any

    @classmethod
    def of(cls, dst: str | Path, overwrite: bool, protected: tuple) -> Target:
        text = str(dst)
        if is_object_url(text):
            target = cls(text.rstrip("/"), text.rstrip("/"), True, open_store(text, read_only=False))
            target._check_bucket(overwrite)
            return target
        check_output(dst, KIND, overwrite=overwrite, protected=protected)
        local = Path(dst).expanduser()
        at = local.with_name(local.name + LOCAL_SUFFIX)
        at.mkdir(parents=True, exist_ok=True)
        return cls(text, str(at), False, open_store(at, read_only=False))

    # ---- the store's own records, through zarr's store API (a folder and a bucket alike) -----------
    def _read(self, key: str) -> dict[str, Any] | None:
        got = sync(self.store.get(key, default_buffer_prototype()))
        return None if got is None else json.loads(got.to_bytes())

    def _write(self, key: str, value: dict[str, Any]) -> None:
        data = default_buffer_prototype().buffer.from_bytes(json.dumps(value).encode())
        sync(self.store.set(key, data))

    def marker(self) -> dict[str, Any] | None:
        meta = self._read("zarr.json")
        found = (meta or {}).get("attributes", {}).get(MARKER)
        return found if isinstance(found, dict) else None

    def progress(self) -> dict[str, Any] | None:
        return self._read(PROGRESS_KEY)

    def save_progress(self, value: dict[str, Any]) -> None:
        self._write(PROGRESS_KEY, value)

    def clear(self) -> None:
        """Delete everything of the store being written."""
        sync(self.store.delete_dir(""))

    def discard(self) -> None:
        """Delete the store being written, folder and all."""
        self.clear()
        if not self.bucket:
            shutil.rmtree(self.at, ignore_errors=True)

    def _check_bucket(self, overwrite: bool) -> None:
        """A bucket prefix holding anything but this kind of store, or a complete one without
        ``--overwrite``, is refused before anything is written."""
        if sync(self.store.is_empty("")):
            return
        marker = self.marker()
        if marker is None or marker.get("kind") != KIND:
            raise ValueError(
                f"--out {self.dst} holds objects that are not a jigsaw-earth training store; nothing was "
                f"written or deleted. Choose another --out (an empty prefix)"
            )
        if marker.get("complete") and not overwrite:
            raise ValueError(
                f"--out {self.dst} already holds a complete store; pass --overwrite to replace it or "
                f"choose another --out"
            )

    def publish(self, protected: tuple, overwrite: bool) -> None:
        """A local store moves from ``DST.tmp-prepare`` to ``DST`` (checked again just before)."""
        if self.bucket:
            return
        check_output(self.dst, KIND, overwrite=overwrite, protected=protected)
        replace_output(Path(self.at), Path(self.dst))


def _block_times(ds: xr.Dataset, time_shard: int, memory_mb: float) -> int:
    """Times per block: within ``memory_mb`` for the float32 fields of one block (at least one
    output time shard), a multiple of the output's time shard and of the source's time chunks."""
    timed = [v for v in ds.data_vars.values() if "time" in v.dims]
    per_time = sum(4 * v.size // max(v.sizes["time"], 1) for v in timed)
    source = max([max(v.chunks[v.dims.index("time")]) for v in timed if v.chunks] or [1])
    step = int(np.lcm(max(1, time_shard), source))
    return max(step, int(memory_mb * 2**20) // max(per_time, 1) // step * step)


def _stats_state(stats: RunningStats) -> dict[str, Any]:
    """The sums of ``stats`` as JSON (its last field is read back from the store on resume)."""
    out = {}
    for name, a in stats.acc.items():
        out[name] = {k: np.asarray(a[k], np.float64).tolist() for k in ("n", "s", "ss", "dn", "ds", "dss")}
    return out


def _restore_stats(state: dict[str, Any], group: Any, row: int | None) -> RunningStats:
    stats = RunningStats()
    for name, a in state.items():
        acc = {k: np.asarray(v, np.float64) for k, v in a.items()}
        acc["n"], acc["dn"] = int(acc["n"]), int(acc["dn"])
        acc["last"] = None if row is None else np.asarray(group[name][row : row + 1], np.float64)
        stats.acc[name] = acc
    return stats


def _nan_check(block: xr.Dataset, where: str) -> None:
    bad = {str(v): int(np.isnan(block[v].values).sum()) for v in block.data_vars}
    bad = {v: n for v, n in bad.items() if n}
    if bad:
        first = str(block["time"].values[0])[:13]
        raise ValueError(
            f"source {where} holds NaN values: "
            + "; ".join(f"{v}: {n} NaNs in the times from {first}" for v, n in bad.items())
            + ". Nothing was kept. Fill them with each variable's mean (--nans fill), keep them (--nans "
            "keep: training stops at the first step that reads one), or choose --start/--end or "
            "--surface/--upper-air without them"
        )


def write_blocks(
    ds: xr.Dataset,
    target: Target,
    encoding: dict[str, Any],
    request: dict[str, Any],
    *,
    time_shard: int,
    stats_period: tuple[str, str] | None,
    check_nans: bool,
    memory_mb: float,
    progress: bool,
    where: str,
    info: dict[str, Any],
) -> None:
    """Write ``ds`` (lazy, the source's selection in the training layout) into ``target`` as the
    module docstring says, resuming a matching progress record; ``info`` goes into the marker."""
    timed = [str(v) for v in ds.data_vars if "time" in ds[v].dims]
    static = [str(v) for v in ds.data_vars if "time" not in ds[v].dims]
    times = ds["time"].values
    in_stats = np.ones(len(times), bool)
    if stats_period is not None:
        in_stats = (times >= np.datetime64(stats_period[0])) & (times <= np.datetime64(stats_period[1]))
        if in_stats.sum() < 2:
            raise ValueError(
                f"statistics period {stats_period} holds {int(in_stats.sum())} times of {where}; "
                f"choose a period with at least 2 times"
            )
    recorded = target.progress()
    start, stats = 0, RunningStats()
    if recorded is not None and recorded.get("request") == request:
        start = int(recorded["done"])
        group = zarr.open_group(target.store, mode="r")
        last = max((i for i in range(start) if in_stats[i]), default=None)
        stats = _restore_stats(recorded["stats"], group, last)
        at = str(times[start])[:13] if start < len(times) else "all written: the statistics and marker"
        log.info("%s: resuming at time %d of %d (%s)", target.at, start, len(times), at)
    else:
        marker = target.marker()
        if marker is not None and marker.get("complete"):
            log.info("%s: replacing the complete store (--overwrite)", target.at)
        elif recorded is not None or marker is not None:
            log.info("%s: an unfinished prepare of another request; starting again", target.at)
        target.clear()
        template = ds.copy()
        template.attrs = {**ds.attrs, MARKER: {"kind": KIND, "complete": False}}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            template.to_zarr(
                target.store,
                zarr_format=3,
                encoding=encoding,
                compute=False,
                consolidated=False,
                safe_chunks=False,  # nothing of the data is written here: the blocks are, whole shards
            )
        group = zarr.open_group(target.store, mode="r+")
        for v in static:
            group[v][...] = ds[v].values
        target.save_progress({"request": request, "done": 0, "stats": {}})
    group = zarr.open_group(target.store, mode="r+")
    block = _block_times(ds, time_shard, memory_mb)
    writer = ThreadPoolExecutor(1, thread_name_prefix="jigsaw-prepare-write")
    pending: list[Any] = []  # the block being written: (future, its end, statistics then)
    written = [start]  # times recorded
    bar = tqdm(total=len(times), initial=start, desc=f"prepare {Path(target.dst).name}", unit="time",
               disable=not progress, leave=False)  # fmt: skip

    def write(a: int, values: dict[str, np.ndarray]) -> None:
        for v, x in values.items():
            group[v][a : a + len(x)] = x

    def finish_write() -> int:
        """Wait for the block being written and record it; the times recorded so far."""
        if pending:
            future, end, state = pending.pop()
            future.result()
            target.save_progress({"request": request, "done": end, "stats": state})
            bar.update(end - written[0])
            written[0] = end
        return written[0]

    try:
        for a in range(start, len(times), block):  # a block is read while the one before is written
            b = min(a + block, len(times))
            try:
                part = ds[timed].isel(time=slice(a, b)).compute()
            except Exception as err:  # whatever stops the source's reading: recorded, resumable
                done = finish_write()
                raise ValueError(
                    f"reading {where} failed at {str(times[a])[:13]}: {type(err).__name__}: {err}. "
                    f"{done} of {len(times)} times are written; run the same command again to resume"
                ) from None
            if check_nans:
                try:
                    _nan_check(part, where)
                except ValueError:
                    writer.shutdown(wait=True)
                    target.discard()
                    raise
            values = {v: np.ascontiguousarray(part[v].values, np.float32) for v in timed}
            rows = np.nonzero(in_stats[a:b])[0]
            for v in timed:
                if len(rows):
                    stats.update(v, values[v][rows])
            finish_write()
            pending.append((writer.submit(write, a, values), b, _stats_state(stats)))
        finish_write()
    finally:
        writer.shutdown(wait=True)
        bar.close()
    t = times[in_stats]
    attrs = {"period": [str(t[0])[:19], str(t[-1])[:19]], **_grid_attrs(ds)}
    levels = ds["level"].values if "level" in ds.coords else None
    result = stats.result(levels, {v: ds[v].values.astype(np.float64) for v in static}, attrs)
    for name, da in result.data_vars.items():
        if not np.isfinite(da.values).all():
            raise ValueError(
                f"statistics of {name!r} are not finite (NaNs in the data over {attrs['period']}); run "
                f"`jigsaw-earth data inspect` to find them"
            )
    write_statistics(target.store, result.sel(stat=list(STATS)))
    commit(target, info)


def commit(target: Target, info: dict[str, Any]) -> None:
    """The last writes: the marker ``complete: true`` and the consolidated metadata; then the
    progress record goes."""
    group = zarr.open_group(target.store, mode="r+")
    group.attrs[MARKER] = {"kind": KIND, "complete": True, **info}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.consolidate_metadata(target.store)
    sync(target.store.delete(PROGRESS_KEY))
    if not target.bucket:
        shutil.rmtree(Path(target.at) / "_prepare", ignore_errors=True)
