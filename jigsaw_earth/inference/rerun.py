"""A finished forecast asked for again: the same request is a no-op, another one is refused by name.

When predict completes an output it records its request (``progress.forecast_request``: checkpoint,
inits, fields, leads, members, mesh, batch, format, initial conditions, scoring …) in the output's
marker: the root attribute ``jigsaw_earth.request`` of a Zarr store, or the ``jigsaw_earth`` entry of
``jigsaw_earth.json`` in a folder of GRIB or netCDF files. The same predict command on that ``--out``
then finds the same request (``finished``): the output is complete, nothing is forecast or written, and
the command exits 0, as a finished training run does. A different request is refused, naming each
item that differs (``progress.differences``). ``--overwrite`` asks to replace the output: it is
forecast again, whatever it holds. An
output that records no request is like any existing output: only ``--overwrite`` replaces it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..ownership import read_marker
from .forecast_store import KIND
from .progress import differences

__all__ = ["finished", "finished_request"]

log = logging.getLogger(__name__)


def finished_request(out: str | Path | None) -> dict[str, Any] | None:
    """The request recorded in the complete forecast output ``out`` (None: none there, or none recorded)."""
    if out is None:
        return None
    marker = read_marker(out if "://" in str(out) else Path(out).expanduser())
    if not marker or marker.get("kind") != KIND or marker.get("complete") is not True:
        return None
    request = marker.get("request")
    return request if isinstance(request, dict) else None


def finished(out: str | Path, recorded: dict[str, Any], request: dict[str, Any], overwrite: bool) -> bool:
    """Whether the complete output ``out`` (its ``recorded`` request) already holds ``request``: True,
    nothing to do; False, it is to be replaced (``overwrite``: forecast again, whatever it holds); a
    ``ValueError`` naming what differs otherwise."""
    if overwrite:
        log.info("--overwrite: --out %s is forecast again and replaced", out)
        return False
    diffs = differences(recorded, request)
    if not diffs:
        return True
    raise ValueError(
        f"--out {out} holds a complete forecast of another request; it differs in: {'; '.join(diffs)}. "
        f"Nothing was forecast or written: pass --overwrite to replace it, choose another --out, or ask for "
        f"the recorded forecast (the same command again is a no-op)"
    )
