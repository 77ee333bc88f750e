"""What commands write: checked before any work (``ownership``: never a run's record, never
inside a store, never over a file that is not an earlier output of the same kind), then written
whole or not at all."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ..ownership import Recognise, check_file_output, json_with_keys

__all__ = ["check_json", "write_json", "write_text"]

log = logging.getLogger(__name__)


def check_json(path: Path | None, option: str, *keys: str, protected: tuple = ()) -> Path | None:
    """Check ``path`` (``None``: nothing to write) as a JSON output whose mapping (or every item of
    its list) has ``keys``; call it before the command's work."""
    if path is None:
        return None
    what = f"JSON output of this command (keys {', '.join(keys)})"
    return check_file_output(path, option, what, json_with_keys(*keys), protected=protected)


def _atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    log.info("wrote %s", path)


def write_json(path: Path, obj: Any, option: str = "--json", *keys: str, protected: tuple = ()) -> None:
    """Write ``obj`` as indented JSON to ``path`` through a ``.tmp`` file, so a reader never sees
    half of it (values JSON cannot hold are written as their ``str``). ``path`` is checked again
    (``check_json`` with ``keys``) just before: it may have changed while the command ran."""
    check_json(path, option, *keys, protected=protected)
    _atomic(path, json.dumps(obj, indent=1, default=str))


def write_text(path: Path, text: str, option: str, what: str, recognise: Recognise) -> None:
    """Write ``text`` to ``path`` (checked as a ``what`` that ``recognise`` knows), whole."""
    check_file_output(path, option, what, recognise)
    _atomic(path, text)
