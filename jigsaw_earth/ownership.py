"""Overwrite only what is yours: the one rule for every store jigsaw-earth writes.

Every store written by jigsaw-earth carries a marker in its root attributes,
``jigsaw_earth = {"kind": KIND, "complete": bool, ...}`` (``KIND``: ``forecast``, ``store``,
``climatology``). ``check_output`` decides, before any work, whether ``--out`` may be written:

* a path that is, contains or lies inside a protected path (the truth or training store, its
  climatology, the run directory's checkpoints, a checkpoint, the source of a prepare) is
  refused, with or without ``--overwrite``; the run directory itself may hold new outputs (the
  README writes ``runs/demo/forecast.zarr``) but is never replaced;
* an existing path is replaced (with ``--overwrite``) only if it is an empty directory or a
  complete or unfinished store marked with the same kind; anything else is refused.

Temporary names are unique per invocation (``unique_tmp``), so two writers never share one; a
forecast in progress has one name per output instead (``in_progress_path``: ``OUT.in-progress``),
which the same predict command resumes (``inference/progress.py``).

Files and folders of files (``--scores``, ``--json``, ``--plot``, ``score --out``, ``config schema
--out``, ``bench report --out``) and run directories go through the same rule
(``check_file_output``, ``check_dir_output``, ``check_run_dir``): never a record of a training run
(``RUN/summary.json``, ``metrics.jsonl``, …, anything in ``RUN/checkpoints``), never inside a
Zarr store (a store that is read, or any other), never over a file that is not the same kind of
output of jigsaw-earth (each writer says how to recognise its own: ``json_with_keys``,
``text_with``, ``png_of_ours``).
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "FOLDER_MARKER",
    "IN_PROGRESS",
    "MARKER",
    "PNG_SOURCE",
    "RUN_RECORDS",
    "check_dir_output",
    "check_file_output",
    "check_output",
    "check_run_dir",
    "in_progress_path",
    "json_with_keys",
    "kind_of",
    "png_of_ours",
    "read_marker",
    "replace_output",
    "run_dir_of",
    "store_of",
    "text_with",
    "unfinished_reason",
    "unique_tmp",
]

#: what a training run writes in its directory (``training/rundir.py``, ``training/monitor.py``)
RUN_RECORDS = (
    "checkpoints",
    "config.yaml",
    "history.jsonl",
    "metrics.jsonl",
    "summary.json",
    "validation.txt",
    "run.lock",
)
#: the PNG text chunk ``Source`` of every picture jigsaw-earth draws (``metrics/plots.py``)
PNG_SOURCE = "jigsaw-earth"
Recognise = Callable[[Path], bool]

MARKER = "jigsaw_earth"
FOLDER_MARKER = "jigsaw_earth.json"  # a folder of files (predict --format grib2|netcdf): its marker
IN_PROGRESS = ".in-progress"
#: what bucket URLs serve, for the refusals of outputs that must be local
BUCKETS = (
    "bucket URLs, s3:// and gs://, are read as data stores by train, predict and score, and written by "
    "`jigsaw-earth data prepare --out` and `jigsaw-earth predict --out` (a Zarr forecast)"
)
_TMP = ".tmp-"


def _bucket_marker(url: str) -> dict[str, Any] | None:
    import obstore
    from obstore.exceptions import NotFoundError

    from jigsaw_earth.data.objects import object_store

    try:
        meta = json.loads(bytes(obstore.get(object_store(url), "zarr.json").bytes()))
    except (NotFoundError, FileNotFoundError, ValueError):
        return None
    marker = meta.get("attributes", {}).get(MARKER) if isinstance(meta, dict) else None
    return marker if isinstance(marker, dict) else None


def read_marker(path: str | Path) -> dict[str, Any] | None:
    """The ``jigsaw_earth`` root attribute of a local Zarr store (v2 or v3), of a Zarr v3 store in a
    bucket (``s3://``, ``gs://``), or the ``jigsaw_earth`` entry of a folder's ``FOLDER_MARKER`` file,
    or ``None``."""
    from jigsaw_earth.data.objects import is_object_url

    if is_object_url(str(path)):
        return _bucket_marker(str(path))
    path = Path(path)
    for name, key in (("zarr.json", "attributes"), (".zattrs", None), (FOLDER_MARKER, None)):
        meta = path / name
        if not meta.is_file():
            continue
        try:
            attrs = json.loads(meta.read_text())
        except (OSError, ValueError):
            return None
        attrs = attrs.get(key, {}) if key else attrs
        marker = attrs.get(MARKER) if isinstance(attrs, dict) else None
        return marker if isinstance(marker, dict) else None
    return None


def kind_of(path: str | Path) -> str | None:
    """The kind of jigsaw-earth store at ``path`` (``None``: not one). Stores written before the
    ``kind`` attribute existed are recognised by their other attributes."""
    marker = read_marker(path)
    if marker is None:
        return None
    if "kind" in marker:
        return str(marker["kind"])
    if "source" not in marker:
        return "forecast"
    return "climatology" if marker["source"] == "synth-climatology" else "store"


def unfinished_reason(path: str | Path) -> str | None:
    """Why ``path`` (a local path or a bucket URL) is a store that a writer did not finish (``None``:
    it is not one)."""
    if "://" in str(path):  # a bucket's store is written in place: its marker says
        marker = read_marker(path)
        if marker is not None and marker.get("complete") is False:
            return f"{path} is marked unfinished (its writer has not finished it, or stopped before the end)"
        return None
    path = Path(path)
    if _TMP in path.name:
        return f"{path} is the temporary store of a writer that did not finish (its name has {_TMP!r})"
    if path.name.endswith(IN_PROGRESS):
        return (
            f"{path} is a forecast in progress (predict stopped before the end); run the same predict "
            f"command again to finish it"
        )
    marker = read_marker(path)
    if marker is not None and marker.get("complete") is False:
        return f"{path} is marked unfinished (its writer stopped before the end)"
    return None


def unique_tmp(dst: Path, token: str | None = None) -> Path:
    """``DST.tmp-<token>`` beside ``dst``; ``token`` defaults to a fresh random one."""
    return dst.with_name(f"{dst.name}{_TMP}{token or uuid.uuid4().hex[:12]}")


def replace_output(new: Path, dst: Path) -> None:
    """Move the finished output ``new`` to ``dst``; an earlier ``dst`` is moved aside first and removed
    after (the caller has checked, just before, that it may be replaced: ``check_output``)."""
    if dst.exists():
        old = unique_tmp(dst)
        dst.rename(old)
        new.rename(dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        new.rename(dst)


def in_progress_path(dst: str | Path) -> Path:
    """``DST.in-progress`` beside ``dst``: where a forecast is written until it is complete."""
    dst = Path(dst)
    return dst.with_name(f"{dst.name}{IN_PROGRESS}")


def store_of(path: str | Path) -> Path | None:
    """The Zarr store (v2 or v3) that ``path`` is or lies inside, or ``None``."""
    p = Path(path).expanduser().resolve()
    for d in (p, *p.parents):
        if any((d / name).is_file() for name in ("zarr.json", ".zgroup", ".zarray")):
            return d
    return None


def _is_run_dir(d: Path) -> bool:
    return (d / "history.jsonl").is_file() or (d / "checkpoints" / "latest").is_file()


def run_dir_of(path: str | Path) -> Path | None:
    """The training run directory (it holds ``history.jsonl`` or ``checkpoints/latest``) that
    ``path`` is or lies inside, or ``None``."""
    p = Path(path).expanduser().resolve()
    for d in (p, *p.parents):
        if d.is_dir() and _is_run_dir(d):
            return d
    return None


def json_with_keys(*keys: str) -> Recognise:
    """An output is this kind of JSON: a mapping with ``keys``, or a list of such mappings."""

    def recognise(path: Path) -> bool:
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            return False
        items = data if isinstance(data, list) else [data]
        return all(isinstance(x, dict) and all(k in x for k in keys) for x in items)

    return recognise


def text_with(fragment: str) -> Recognise:
    """An output is a text file holding ``fragment`` (what its writer always puts in it)."""

    def recognise(path: Path) -> bool:
        try:
            return fragment in path.read_text()
        except (OSError, UnicodeDecodeError):
            return False

    return recognise


def png_of_ours(path: Path) -> bool:
    """A PNG whose text chunks name jigsaw-earth as its source (``PNG_SOURCE``)."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return False
    return head.startswith(b"\x89PNG") and b"Source\x00" + PNG_SOURCE.encode() in head


def _check_common(text: str, option: str, what: str) -> Path:
    if not text.strip():
        raise ValueError(f"{option} is empty; give the path of the {what} to write")
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:/", text):
        raise ValueError(
            f"{option} {text!r} must be a local path: checkpoints and run records are files written under "
            f"a temporary name and renamed, which object stores cannot do; write locally and copy it "
            f"afterwards ({BUCKETS})"
        )
    return Path(text).expanduser().resolve()


def _refuse_protected(out: Path, text: str, option: str, protected: Iterable, allow: tuple[str, ...]) -> None:
    for label, other in protected:
        if other is None or "://" in str(other):
            continue
        rel = _relation(out, Path(other).expanduser().resolve())
        if rel is not None and rel not in allow:
            raise ValueError(
                f"{option} {text} {rel} the {label} {other}; nothing was written. Choose an {option} "
                f"outside it"
            )


def _refuse_store_and_records(out: Path, text: str, option: str) -> None:
    store = store_of(out)
    if store is not None:
        rel = "is" if store == out else "lies inside"
        raise ValueError(
            f"{option} {text} {rel} the Zarr store {store}; nothing was written. Stores hold only "
            f"what their writer put there: choose an {option} outside it"
        )
    run = run_dir_of(out.parent)
    if run is not None:
        inner = out.relative_to(run).parts
        if inner and inner[0] in RUN_RECORDS:
            raise ValueError(
                f"{option} {text} is {'in ' if len(inner) > 1 else ''}the record {run / inner[0]} of "
                f"the training run in {run}; nothing was written. Choose another {option} (a new name "
                f"in the run directory is fine)"
            )


def check_file_output(
    dst: str | Path,
    option: str,
    what: str,
    recognise: Recognise,
    *,
    protected: Iterable[tuple[str, str | Path | None]] = (),
) -> Path:
    """Raise ``ValueError`` (option, value, fix) unless the file ``dst`` may be written as ``what``.

    Refused: a run's record, a path inside a Zarr store or one of ``protected`` (``(label,
    path)`` pairs), a directory or link, or an existing file that ``recognise`` does not know as
    an earlier ``what``. Returns the resolved path."""
    text = str(dst)
    out = _check_common(text, option, what)
    _refuse_protected(out, text, option, protected, ())
    _refuse_store_and_records(out, text, option)
    if Path(text).expanduser().is_symlink() or out.is_dir():
        kind = "a link" if Path(text).expanduser().is_symlink() else "a directory"
        raise ValueError(
            f"{option} {text} is {kind}, not a {what}; nothing was written. Choose another {option} "
            f"(a file name)"
        )
    if out.exists() and not recognise(out):
        raise ValueError(
            f"{option} {text} exists and is not an earlier {what}: a file of yours, or an output of "
            f"another kind; nothing was written or deleted. Choose another {option} or remove it yourself"
        )
    return out


def check_dir_output(
    dst: str | Path,
    option: str,
    files: dict[str, Recognise],
    *,
    protected: Iterable[tuple[str, str | Path | None]] = (),
    what: str = "picture",
) -> Path:
    """A folder to write ``files`` (name → how to recognise an earlier one) into: not inside a
    Zarr store, a run's records or one of ``protected``; not a file; and every file of ``files``
    that exists is an earlier output of the same kind (``check_file_output``). Other entries of
    the folder are left alone. Returns the resolved folder."""
    text = str(dst)
    out = _check_common(text, option, f"folder for the {what}s")
    _refuse_protected(out, text, option, protected, ("contains",))
    _refuse_store_and_records(out, text, option)
    if out.exists() and not out.is_dir():
        raise ValueError(
            f"{option} {text} is a file, not a folder; nothing was written. Choose another {option}"
        )
    for name, recognise in files.items():
        check_file_output(out / name, option, what, recognise)
    return out


def check_run_dir(
    run_dir: str | Path,
    protected: Iterable[tuple[str, str | Path | None]] = (),
    config_file: str | Path | None = None,
) -> None:
    """``run.dir`` may hold a training run: not a Zarr store, not inside one, not containing or
    inside one of ``protected`` (the data and climatology stores); and an existing folder that
    is not a run yet holds none of the files a run writes (``RUN_RECORDS``), other than the
    config file being trained (``config_file``)."""
    text = str(run_dir)
    out = _check_common(text, "run.dir", "run directory")
    for label, other in protected:
        if other is None or "://" in str(other):
            continue
        rel = _relation(out, Path(other).expanduser().resolve())
        if rel is not None:
            beside = Path(other).expanduser().resolve().parent / "runs" / "my-run"  # outside every store
            raise ValueError(
                f"run.dir {text} {rel} the {label} {other}; nothing was written. Choose a run.dir "
                f"beside the stores, e.g. {beside}"
            )
    store = store_of(out)
    if store is not None:
        raise ValueError(
            f"run.dir {text} {'is' if store == out else 'lies inside'} the Zarr store {store}; nothing "
            f"was written. Choose a run.dir outside every store"
        )
    if not out.is_dir() or _is_run_dir(out) or (out / "run.lock").exists():
        return  # a run, or one starting (its lock says whose: training/rundir.py)

    def foreign(name: str) -> bool:
        p = out / name
        if not p.exists() or (mine is not None and p.resolve() == mine):
            return False
        return not (p.is_dir() and not any(p.iterdir()))  # an empty checkpoints/ of a start that stopped

    mine = None if config_file is None else Path(config_file).expanduser().resolve()
    clash = [n for n in RUN_RECORDS if foreign(n)]
    if clash:
        raise ValueError(
            f"run.dir {text} is not a jigsaw-earth run directory (no history.jsonl) but holds "
            f"{', '.join(clash)}, which a run writes; nothing was written or deleted. Choose another "
            f"run.dir, or move those files away"
        )


def _relation(out: Path, other: Path) -> str | None:
    if out == other:
        return "is"
    if other in out.parents:
        return "lies inside"
    if out in other.parents:
        return "contains"
    return None


def check_output(
    dst: str | Path,
    kind: str,
    *,
    overwrite: bool,
    protected: Iterable[tuple[str, str | Path | None]] = (),
    may_hold_outputs: Iterable[tuple[str, str | Path | None]] = (),
    option: str = "--out",
) -> None:
    """Raise ``ValueError`` (option, value, fix) unless ``dst`` may be written as a ``kind`` store.

    ``protected``: ``(label, path)`` pairs that ``dst`` may not be, contain or lie inside.
    ``may_hold_outputs``: pairs that ``dst`` may lie inside but not be or contain (a run directory).
    """
    text = str(dst)
    if not text.strip():
        raise ValueError(f"{option} is empty; give the path of the {kind} store to write")
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:/", text):  # a URL (pathlib turns '://' into ':/')
        raise ValueError(
            f"{option} {text!r} must be local: a path, written atomically by rename (object stores have "
            f"no rename); write locally and copy it afterwards ({BUCKETS})"
        )
    out = Path(dst).expanduser().resolve()
    for allow_inside, pairs in ((True, may_hold_outputs), (False, protected)):
        for label, other in pairs:
            if other is None or "://" in str(other):
                continue
            rel = _relation(out, Path(other).expanduser().resolve())
            if rel is not None and not (allow_inside and rel == "lies inside"):
                raise ValueError(
                    f"{option} {text} {rel} the {label} {other}; nothing was written or deleted. "
                    f"Choose an {option} outside it"
                )
    store = store_of(out.parent)
    if store is not None:
        raise ValueError(
            f"{option} {text} lies inside the Zarr store {store}; nothing was written or deleted. "
            f"Choose an {option} outside it"
        )
    if not out.exists() and not out.is_symlink():
        return
    if not overwrite:
        raise ValueError(
            f"{option} {text} already exists; pass --overwrite to replace it (only an empty "
            f"directory or a {kind} store written by jigsaw-earth is replaced) or choose "
            f"another {option}"
        )
    if out.is_symlink() or not out.is_dir():
        raise ValueError(
            f"{option} {text} is a file or link, not a {kind} store; --overwrite replaces only "
            f"an empty directory or a {kind} store written by jigsaw-earth: choose another "
            f"{option} or remove it yourself"
        )
    entries = sorted(p.name for p in out.iterdir())
    if not entries:
        return
    found = kind_of(out)
    if found == kind:
        return
    what = (
        f"a jigsaw-earth store of another kind ({found!r}, not {kind!r})"
        if found
        else f"not a jigsaw-earth {kind} store (no {MARKER}.kind={kind!r} attribute; it holds "
        f"{len(entries)} entries, e.g. {', '.join(entries[:3])})"
    )
    raise ValueError(
        f"{option} {text} is {what}; --overwrite replaces only an empty directory or a {kind} "
        f"store written by jigsaw-earth. Nothing was deleted: choose another {option} or "
        f"remove it yourself"
    )
