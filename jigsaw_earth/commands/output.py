"""What commands write: a JSON file, whole or not at all."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

__all__ = ["write_json"]

log = logging.getLogger(__name__)


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` through a ``.tmp`` file, so a reader never sees
    half of it (values JSON cannot hold are written as their ``str``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    tmp.replace(path)
    log.info("wrote %s", path)
