"""What ``predict --format`` writes: one Zarr store (the default), or a folder of GRIB 2 or netCDF files.

The predict loop writes every format's tiles into a Zarr store (``store``: this rank's blocks of
whole chunks, ``outputs.ForecastOutput``), then calls ``close`` (collective) or ``abort``.
``FileWriter`` puts the tiles into the same in-progress Zarr store as ``--format zarr``
(``ForecastWriter``, one field a chunk: the conversion reads field by field; every rank its own
chunks, a stop and a resume as there), and ``close`` turns it into files: each file of the path template
(``{date}{time}_{step:03d}.grib2`` by default: one per init and lead) is written by one rank, ranks
taking files in turn, one field at a time, so no rank gathers more than one whole field (GRIB) or one
chunk (netCDF). The files are written into ``OUT.in-progress/_output`` and moved to ``OUT`` when every
rank is done, with ``jigsaw_earth.json`` (format, template, files, packing bounds) marking the folder as
predict's own. A run stopped while converting converts again on resume.

Template fields: ``{date}`` (YYYYMMDD) and ``{time}`` (HHMM) of the init, ``{step}`` (the lead in
hours; ``{step:03d}`` pads it), ``{number}`` (the member, ensembles only). A file holds every field of
the inits, leads and members that share its name: a block of inits × leads × members, since the fields
name inits and leads separately.
"""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as dist
import xarray as xr

from ..data.grib_messages import GRIB_SUFFIXES
from ..distributed.tiles import TileGrid
from ..ownership import FOLDER_MARKER, MARKER, check_output, replace_output
from .forecast_store import KIND, ForecastLayout, ForecastWriter
from .unfinished import OUTPUT, record_outputs
from .write_grib import PACKING_BOUND, GribField, check_grib, write_messages
from .write_netcdf import write_netcdf

__all__ = ["FORMATS", "TEMPLATES", "FileWriter", "check_format", "file_groups", "open_writer"]

log = logging.getLogger(__name__)

FORMATS = ("zarr", "grib2", "netcdf")
TEMPLATES = {"grib2": "{date}{time}_{step:03d}.grib2", "netcdf": "{date}{time}.nc"}
#: the endings each format's files take (what ``data prepare`` and ``--init`` read as that format)
SUFFIXES = {"grib2": GRIB_SUFFIXES, "netcdf": (".nc", ".nc4")}
Item = tuple[int, int, int | None]  # (init, lead, member) positions in the layout


def _name(template: str, layout: ForecastLayout, item: Item) -> str:
    init = np.datetime64(layout.init_times[item[0]], "m").astype(object)
    lead = int(layout.leads[item[1]] // np.timedelta64(1, "h"))
    number = None if item[2] is None else layout.first_member + item[2]
    return template.format(date=init.strftime("%Y%m%d"), time=init.strftime("%H%M"), step=lead, number=number)


def file_groups(layout: ForecastLayout, fmt: str, template: str | None) -> dict[str, list[Item]]:
    """File name → the (init, lead, member) items it holds, in order; a bad template is refused."""
    template = template or TEMPLATES[fmt]
    members = list(range(layout.members)) if layout.members else [None]
    items = [
        (i, j, m) for i in range(len(layout.init_times)) for j in range(len(layout.leads)) for m in members
    ]
    groups: dict[str, list[Item]] = defaultdict(list)
    try:
        for item in items:
            groups[_name(template, layout, item)].append(item)
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(
            f"--template {template!r}: {type(err).__name__} {err}; use the fields {{date}}, {{time}}, "
            f"{{step}} (e.g. {{step:03d}}) and, for an ensemble, {{number}}; e.g. --template "
            f"{TEMPLATES[fmt]!r}"
        ) from None
    for name in groups:
        if not name.lower().endswith(SUFFIXES[fmt]):
            raise ValueError(
                f"--template {template!r} gives {name!r}, a name of another kind of file: --format {fmt} "
                f"files end in {' or '.join(SUFFIXES[fmt])}, as readers (data prepare, --init) expect; e.g. "
                f"--template {TEMPLATES[fmt]!r}"
            )
        path = Path(name)
        if path.is_absolute() or ".." in path.parts or not path.name or name == FOLDER_MARKER:
            raise ValueError(
                f"--template {template!r} gives {name!r}; file names must stay inside --out (and not be "
                f"{FOLDER_MARKER})"
            )
    return dict(groups)


def check_format(fmt: str, template: str | None, layout: ForecastLayout) -> None:
    """Before any forecast: the format is known, the template names files, GRIB can say every field."""
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if fmt == "zarr":
        if template is not None:
            raise ValueError(
                "--template names the files of --format grib2 or netcdf; a Zarr store is one path"
            )
        return
    if fmt == "grib2":
        check_grib([*layout.upper_air, *layout.surface], layout.latitude, layout.longitude)
    file_groups(layout, fmt, template)


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


class FileWriter:
    """Collective, like ``ForecastWriter``: tiles into the in-progress store, files at ``close``."""

    def __init__(self, fmt: str, path: str | Path, layout: ForecastLayout, grid: TileGrid, rank: int = 0,
                 *, template: str | None = None, **kwargs: Any):  # fmt: skip
        self.fmt, self.template = fmt, template or TEMPLATES[fmt]
        self.groups = file_groups(layout, fmt, self.template)
        self.tiles = ForecastWriter(path, layout, grid, rank, **kwargs)
        self.path, self.layout, self.rank = self.tiles.path, layout, rank

    @property
    def store(self) -> ForecastWriter:
        """The in-progress Zarr store the tiles go to (``outputs.ForecastOutput`` writes there)."""
        return self.tiles

    def abort(self) -> None:
        self.tiles.abort()

    def close(self, request: dict[str, Any] | None = None, stop: Callable[[str], None] | None = None) -> Path:
        """Collective: every rank writes its files, then rank 0 publishes the folder as ``path`` with
        ``request`` (what was forecast: ``rerun.py``) in its marker. ``stop(what)``: asked before each
        round of files (one a rank), collective; it raises to stop (the resume converts again)."""
        _barrier()  # every tile is in the store
        staging = self.tiles.tmp / OUTPUT
        names = sorted(self.groups)
        if self.rank == 0:
            shutil.rmtree(staging, ignore_errors=True)  # what a stopped conversion left
            record_outputs(self.tiles.tmp, names)  # the only files predict may leave there
            staging.mkdir()
        _barrier()
        world = dist.get_world_size() if dist.is_initialized() else 1
        for first in range(0, len(names), world):
            if stop is not None:
                stop(f"the conversion to {self.fmt} files ({first} of {len(names)} written)")
            if first + self.rank < len(names):
                name = names[first + self.rank]
                target = staging / name
                target.parent.mkdir(parents=True, exist_ok=True)
                (self._grib if self.fmt == "grib2" else self._netcdf)(target, self.groups[name])
        _barrier()
        if self.rank == 0:
            marker = {"kind": KIND, "complete": True, "format": self.fmt}
            if request is not None:
                marker["request"] = request
            info = {MARKER: marker, "template": self.template, "files": names}
            if self.fmt == "grib2":
                variables = [*self.layout.upper_air, *self.layout.surface]
                info["packing_bound"] = {v: PACKING_BOUND[v] for v in variables}
            (staging / FOLDER_MARKER).write_text(json.dumps(info, indent=1))
            check_output(self.path, KIND, overwrite=self.tiles.overwrite, protected=self.tiles.protected)
            replace_output(staging, self.path)
            log.info("wrote %d %s files in %s", len(names), self.fmt, self.path)
        _barrier()
        return self.path

    def _grib(self, target: Path, items: list[Item]) -> None:
        lay, arrays = self.layout, self.tiles._arrays

        def fields() -> Any:
            for i, j, m in items:
                at = (i, j) if m is None else (i, j, m)
                hours = int(lay.leads[j] // np.timedelta64(1, "h"))
                number = None if m is None else lay.first_member + m
                total = None if m is None else lay.first_member + (lay.members or 0)
                for name in lay.upper_air:
                    for k, level in enumerate(sorted(lay.levels)):
                        field = GribField(name, level, lay.init_times[i], hours, number, total)
                        yield field, arrays[name][(*at, k)]
                for name in lay.surface:
                    yield GribField(name, None, lay.init_times[i], hours, number, total), arrays[name][at]

        part = target.with_name(target.name + ".part")
        with open(part, "wb") as f:
            write_messages(f, fields(), lay.latitude, lay.longitude)
        part.replace(target)

    def _netcdf(self, target: Path, items: list[Item]) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # _progress and _output beside the arrays
            ds = xr.open_zarr(self.tiles.tmp, consolidated=False, chunks={})
        block = {
            "time": sorted({i for i, _, _ in items}),
            "prediction_timedelta": sorted({j for _, j, _ in items}),
        }
        if self.layout.members:
            block["number"] = sorted({m for _, _, m in items})
        write_netcdf(target, ds.isel(block))


def open_writer(fmt: str, path: str | Path, layout: ForecastLayout, grid: TileGrid, rank: int,
                template: str | None = None, **kwargs: Any) -> ForecastWriter | FileWriter:  # fmt: skip
    """The writer of ``--format``: the Zarr store itself, or files made from it at ``close``."""
    if fmt == "zarr":
        return ForecastWriter(path, layout, grid, rank, **kwargs)
    return FileWriter(fmt, path, layout, grid, rank, template=template, **kwargs)
