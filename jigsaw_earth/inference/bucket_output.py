"""A forecast written into a bucket (``predict --out s3://…``): in place, resumable, committed last.

Object stores have no rename and no file lock, so a bucket forecast is written where it ends up, as
``data prepare`` writes a bucket store (``data/prepare_write.py``): the Zarr store at the URL itself,
its root attribute ``jigsaw_earth = {kind: forecast, complete: false}`` until every rank has written
(``score`` refuses such a store naming it: ``ownership.unfinished_reason``; ``StoreView.open`` as an
incomplete write), then ``complete: true`` with the request (``rerun.py``) and the consolidated
metadata, the last writes. The
records a local forecast keeps in ``OUT.in-progress/_progress`` are objects under ``URL/_progress/``
(the same names: the request, each rank's batches done, the score shares, predict's mark), removed
once the store is complete; a stop signal records and exits 75 as locally, and the same command
resumes from them, to the same bytes.

One writer at a time: ``_progress/lock`` is created with a conditional put (``If-None-Match: *``,
obstore's ``mode="create"``; S3, GCS and SeaweedFS honour it), so of two predicts starting together
exactly one gets it; the other is refused naming the holder (host, process, Slurm job). A lock whose
process is gone from this host, or whose Slurm job is this one (a requeue), is taken over; a holder
on another host cannot be asked: the message names the object to delete. Without the local
``OUT.lock`` taken at start, a second predict to the same bucket is refused when it claims the
output, after loading its model rather than before.

Only predict's own objects are ever deleted: a prefix holding any other object (anything but the
store's ``zarr.json``, the recorded arrays' metadata and chunks, and the progress records) is refused
before anything is written. Only ``--format zarr`` goes to a bucket (GRIB and netCDF files are made
from a local in-progress store); ``--unfinished`` and ``--remove-unfinished`` work on local folders.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from ..data.objects import is_object_url, object_store
from ..locks import holder_alive
from ..ownership import MARKER, check_output
from .progress import Progress
from .unfinished import (
    FORMAT,
    KIND,
    MARK,
    PROGRESS,
    REQUEST,
    holder,
    holder_text,
)

__all__ = [
    "BucketLock",
    "BucketProgress",
    "Prefix",
    "check_bucket_format",
    "check_forecast_output",
    "forecast_progress",
    "output_path",
]

log = logging.getLogger(__name__)

_PROGRESS_KEYS = re.compile(r"(lock|request\.json|folder\.json|rank-\d+\.json|scores/rank-\d+/batch-\d+\.pt)")
_CHUNK_KEY = re.compile(r"c(/\d+)*")
LOCK = f"{PROGRESS}/lock"


def output_path(out: str | Path) -> str | Path:
    """``--out`` as the result names it: a bucket URL as given, a local path as a path."""
    return str(out).rstrip("/") if is_object_url(str(out)) else Path(out)


class Prefix:
    """The objects under one bucket URL, by key relative to it."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.store = object_store(self.url)

    def get(self, key: str) -> bytes | None:
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            return bytes(obstore.get(self.store, key).bytes())
        except (NotFoundError, FileNotFoundError):
            return None

    def json(self, key: str) -> dict[str, Any] | None:
        data = self.get(key)
        try:
            info = None if data is None else json.loads(data)
        except ValueError:
            return None
        return info if isinstance(info, dict) else None

    def put(self, key: str, data: bytes) -> None:
        import obstore

        obstore.put(self.store, key, data)

    def create(self, key: str, data: bytes) -> bool:
        """Write ``key`` unless it exists (a conditional put); whether it was written."""
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        try:
            obstore.put(self.store, key, data, mode="create")
        except (AlreadyExistsError, PreconditionError):
            return False
        return True

    def list(self, under: str = "") -> list[str]:
        import obstore

        try:
            found = obstore.list(self.store, prefix=under or None).collect()
        except Exception as err:  # obstore's GenericError: the server's answer is in its text
            if "NoSuchBucket" not in str(err):
                raise
            bucket = self.url.split("://", 1)[1].split("/", 1)[0]
            raise ValueError(
                f"{self.url}: the bucket {bucket!r} does not exist; create it (e.g. aws s3 mb "
                f"s3://{bucket}) and run again"
            ) from None
        return sorted(str(o["path"]) for o in found)

    def delete(self, keys: list[str]) -> None:
        import obstore

        for start in range(0, len(keys), 1000):
            obstore.delete(self.store, keys[start : start + 1000])

    def marker(self) -> dict[str, Any] | None:
        found = (self.json("zarr.json") or {}).get("attributes", {}).get(MARKER)
        return found if isinstance(found, dict) else None

    def foreign(self) -> list[str]:
        """Keys predict did not write: anything but the progress records, the store's ``zarr.json``
        and the arrays' (those predict's mark records, else those whose ``zarr.json`` says array)
        metadata and chunks."""
        keys = self.list()
        recorded = (self.json(f"{PROGRESS}/{MARK}") or {}).get("arrays")
        arrays = set(recorded) if isinstance(recorded, list) else None
        foreign = []
        for key in keys:
            head, _, inner = key.partition("/")
            if head == PROGRESS:
                ok = _PROGRESS_KEYS.fullmatch(inner) is not None
            elif not inner:
                ok = key == "zarr.json"
            else:
                known = head in arrays if arrays is not None else self._is_array(head)
                ok = known and (inner == "zarr.json" or _CHUNK_KEY.fullmatch(inner) is not None)
            if not ok:
                foreign.append(key)
        return foreign

    def _is_array(self, name: str) -> bool:
        return (self.json(f"{name}/zarr.json") or {}).get("node_type") == "array"


def _refuse_protected(url: str, protected: Any) -> None:
    for label, other in protected:
        if other is None or not is_object_url(str(other)):
            continue
        theirs = str(other).rstrip("/")
        rel = (
            "is" if theirs == url
            else "lies inside" if url.startswith(theirs + "/")
            else "contains" if theirs.startswith(url + "/")
            else None
        )  # fmt: skip
        if rel is not None:
            raise ValueError(
                f"--out {url} {rel} the {label} {other}; nothing was written or deleted. Choose an --out "
                f"outside it"
            )


def check_prefix(prefix: Prefix, overwrite: bool, option: str = "--out") -> None:
    """``prefix`` may be written as a forecast: empty, or predict's forecast (a complete one only with
    ``overwrite``) holding nothing predict did not write."""
    if not prefix.list():
        return
    marker = prefix.marker()
    mark = prefix.json(f"{PROGRESS}/{MARK}") or prefix.json(f"{PROGRESS}/{REQUEST}") or {}
    ours = (marker or {}).get("kind") == KIND or (marker is None and mark.get("format") == FORMAT)
    if not ours:
        found = f"a jigsaw-earth store of another kind ({marker.get('kind')!r})" if marker else "objects"
        raise ValueError(
            f"{option} {prefix.url} holds {found}, not a forecast of predict; nothing was written or "
            f"deleted. Choose another {option} (an empty prefix)"
        )
    if marker is not None and marker.get("complete") is True and not overwrite:
        raise ValueError(
            f"{option} {prefix.url} already holds a complete forecast; pass --overwrite to replace it or "
            f"choose another {option}"
        )
    foreign = prefix.foreign()
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise ValueError(
            f"{option} {prefix.url} holds {prefix.url}/{foreign[0]}{more}, which predict did not write; "
            f"nothing was written or deleted. Move those objects out, or choose another {option}"
        )


def check_bucket_format(out: str | Path, fmt: str) -> None:
    """A bucket takes a forecast as a Zarr store only (checked before the bucket is asked anything)."""
    if is_object_url(str(out)) and fmt != "zarr":
        url = str(out).rstrip("/")
        raise ValueError(
            f"--out {url} with --format {fmt}: a bucket takes a forecast as a Zarr store (--format zarr); "
            f"write the {fmt} files to a local folder and copy them there"
        )


def check_forecast_output(out: str | Path, fmt: str, *, overwrite: bool, protected: Any = (),
                          may_hold_outputs: Any = ()) -> None:  # fmt: skip
    """Before any work: ``--out`` may be written as a forecast (a local path: ``ownership.check_output``;
    a bucket URL: a Zarr store, not one of ``protected``, the prefix empty or predict's)."""
    if not is_object_url(str(out)):
        check_output(out, KIND, overwrite=overwrite, protected=protected, may_hold_outputs=may_hold_outputs)
        return
    url = str(out).rstrip("/")
    check_bucket_format(url, fmt)
    _refuse_protected(url, protected)
    check_prefix(Prefix(url), overwrite)


class BucketLock:
    """``URL/_progress/lock``, made by a conditional put: one predict writes a bucket forecast at a time."""

    def __init__(self, prefix: Prefix):
        self.prefix, self.held = prefix, False
        self.path = f"{prefix.url}/{LOCK}"

    def read(self) -> dict[str, Any] | None:
        return self.prefix.json(LOCK)

    def acquire(self) -> None:
        """Take the lock (a stale one is taken over); ``ValueError`` naming the holder if it is live."""
        mine = json.dumps(holder()).encode()
        for _ in range(3):
            if self.prefix.create(LOCK, mine):
                self.held = True
                return
            info = self.read()
            if info is not None and holder_alive(info, None):
                raise ValueError(
                    f"{self.prefix.url} is being written by {holder_text(info)}; wait for it or stop it. If "
                    f"that process is gone (another host cannot be asked), delete {self.path} and run again"
                )
            log.info("taking over %s from %s, which is gone", self.path, holder_text(info or {}))
            self.prefix.delete([LOCK])
        raise ValueError(f"cannot take {self.path}: another predict keeps taking it; run again")

    def release(self) -> None:
        if self.held:
            self.prefix.delete([LOCK])
            self.held = False


class BucketProgress(Progress):
    """``Progress`` whose records are objects under the forecast's own URL (the module docstring)."""

    def __init__(self, url: str):
        super().__init__(None)
        self.prefix = Prefix(url)
        self.folder = self.prefix.url  # type: ignore[assignment]  # named in messages; never a path here
        self.lock = BucketLock(self.prefix)  # type: ignore[assignment]

    def check(self, protected: Any = (), may_hold_outputs: Any = ()) -> None:
        self._checked = (protected, may_hold_outputs)
        _refuse_protected(self.prefix.url, protected)
        check_prefix(self.prefix, overwrite=True)

    def _request_info(self) -> dict[str, Any] | None:
        info = self.prefix.json(f"{PROGRESS}/{REQUEST}")
        return info if info is not None and info.get("format") == FORMAT else None

    def _batches_done(self, world: int) -> int:
        done = []
        for key in self.prefix.list(f"{PROGRESS}/rank-"):
            try:
                done.append(int((self.prefix.json(key) or {})["batches"]))
            except (KeyError, TypeError, ValueError):
                done.append(0)
        return min(done) if len(done) >= world else 0

    def _removal(self) -> str:
        return f"delete its objects with the bucket's tools (e.g. aws s3 rm --recursive {self.prefix.url})"

    def _start(self) -> None:
        import time

        self.prefix.delete([k for k in self.prefix.list() if k != LOCK])
        info = {"format": FORMAT, "created": time.time(), **{k: holder()[k] for k in ("host", "pid")}}
        self.prefix.put(f"{PROGRESS}/{MARK}", json.dumps(info, indent=1).encode())

    def _others(self) -> None:
        pass  # abandoned forecasts are listed in local folders only

    def _record_start(self) -> bool:
        arrays = sorted(k.split("/")[0] for k in self.prefix.list() if k.count("/") == 1 and
                        k.endswith("/zarr.json") and not k.startswith(f"{PROGRESS}/"))  # fmt: skip
        info = self.prefix.json(f"{PROGRESS}/{MARK}") or {"format": FORMAT}
        self.prefix.put(f"{PROGRESS}/{MARK}", json.dumps({**info, "arrays": arrays}, indent=1).encode())
        return False  # a bucket output is always a store

    def _get(self, key: str) -> bytes | None:
        return self.prefix.get(key)

    def _put(self, key: str, data: bytes) -> None:
        self.prefix.put(key, data)  # an object is replaced whole

    def _finished(self) -> None:
        keys = self.prefix.list(f"{PROGRESS}/")
        self.prefix.delete([k for k in keys if k != LOCK] + ([LOCK] if LOCK in keys else []))

    def _discard(self) -> None:
        self.prefix.delete(self.prefix.list())


def forecast_progress(out: str | Path | None, scores: str | Path | None = None) -> Progress:
    """The progress of ``--out`` (of ``--scores`` without it): a bucket's objects or a local folder."""
    target = out if out is not None else scores
    if target is not None and is_object_url(str(target)):
        return BucketProgress(str(target))
    return Progress.for_output(out, scores)
