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
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "IN_PROGRESS",
    "MARKER",
    "check_output",
    "in_progress_path",
    "kind_of",
    "read_marker",
    "unfinished_reason",
    "unique_tmp",
]

MARKER = "jigsaw_earth"
IN_PROGRESS = ".in-progress"
_TMP = ".tmp-"


def read_marker(path: str | Path) -> dict[str, Any] | None:
    """The ``jigsaw_earth`` root attribute of a local Zarr store (v2 or v3), or ``None``."""
    path = Path(path)
    for name, key in (("zarr.json", "attributes"), (".zattrs", None)):
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
    """Why ``path`` is a store that a writer did not finish (``None``: it is not one)."""
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


def in_progress_path(dst: str | Path) -> Path:
    """``DST.in-progress`` beside ``dst``: where a forecast is written until it is complete."""
    dst = Path(dst)
    return dst.with_name(f"{dst.name}{IN_PROGRESS}")


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
            f"{option} {text!r} must be local: a path, written atomically by rename; write "
            f"locally and copy it afterwards"
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
