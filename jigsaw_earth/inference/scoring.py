"""``predict --score``: WB2 scores of a forecast while it runs, each rank on its own tile.

Every rank reads its tile of the truth (valid times, and init times for persistence) and of the
climatology, and adds its tile's shares of WB2's weighted sums (``MetricAccumulator`` with
``TileRegions``: the region plan ``score`` uses) for the forecast, persistence and climatology.
``finish`` reduces them once over the mesh (domain: exact per-init global means; data: the inits
of every replica) into the per-init statistics ``score`` keeps (``metrics.statistics``) and returns
``score``'s table rows with their intervals — equal to ``score`` of the written store.
No field is ever gathered. A batch's truth and climatology are read ahead on a thread of their own
(``readahead.ReadAhead``, ``AHEAD`` leads deep), so ``update`` finds each lead's fields read. An
ensemble forecast (``members``) is scored as ``score`` scores a store with a member dimension:
RMSE, bias and ACC of the ensemble mean and WB2's ensemble metrics; each rank's ``update`` gets
every member of its tile. ``last_batch`` and ``restore`` carry the shares over
a stop and resume (``progress.py``).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from ..data.climatology import check_same_grid
from ..data.preflight import default_climatology_path
from ..data.reader import TileReader
from ..data.samples import TrainData
from ..data.sources import TileClimatology
from ..data.store import StoreView
from ..distributed.comm import all_reduce_
from ..distributed.halo import Halo
from ..metrics.accumulator import MetricAccumulator
from ..metrics.ensemble import POINTWISE
from ..metrics.significance import IntervalOptions, score_rows
from ..metrics.statistics import Statistics, field_name
from ..metrics.tile_regions import TileRegions
from ..metrics.units import unit_of
from .readahead import ReadAhead
from .selection import Selection

__all__ = ["ScoreRequest", "TileScorer", "score_stores"]

log = logging.getLogger(__name__)

MODEL = "forecast"  # the model's name in the table, as ``score`` calls a forecast store
AHEAD = 4  # leads of truth and climatology read ahead of the scoring


@dataclass(frozen=True)
class ScoreRequest:
    """``--truth`` (default: ``data.store``), ``--climatology`` (default: the run's, when present)
    and ``--regions`` (default: global; ``["all"]``: every WB2 region)."""

    truth: str | Path | None = None
    climatology: str | Path | None = None
    regions: tuple[str, ...] | None = None


def _absolute(path: str | Path) -> str:
    return str(path) if "://" in str(path) else str(Path(path).resolve())


def score_stores(request: ScoreRequest, cfg: Any) -> tuple[str, str | None]:
    """The truth and climatology stores ``--score`` reads (absolute; no climatology: ``None``):
    ``--truth`` or ``data.store``; ``--climatology``, ``data.climatology`` or the default beside
    the store, when it exists. What the score file records."""
    d = cfg.data
    truth = str(request.truth or d.store)
    clim = request.climatology or d.climatology or default_climatology_path(d.store)
    if request.climatology is None and "://" not in str(clim) and not Path(clim).exists():
        clim = None
    return _absolute(truth), None if clim is None else _absolute(clim)


def _indices(have: np.ndarray, want: np.ndarray, what: str) -> np.ndarray:
    idx = pd.Index(np.asarray(have).astype("datetime64[ns]")).get_indexer(
        np.asarray(want).astype("datetime64[ns]").ravel()
    )
    if (idx < 0).any():
        missing = np.asarray(want).ravel()[idx < 0]
        raise ValueError(
            f"{what} lacks {np.unique(missing).size} of the times the forecast needs (first "
            f"{missing[0]}); it covers {have.min()} … {have.max()}: choose inits inside it or another --truth"
        )
    return idx.reshape(np.shape(want))


class TileScorer:
    """Collective: every rank builds it, ``update``s its tiles, and calls ``finish``. ``members``:
    the ensemble size of the forecasts (None: deterministic)."""

    def __init__(self, request: ScoreRequest, cfg: Any, data: TrainData, selection: Selection,
                 init_times: np.ndarray, members: int | None = None):  # fmt: skip
        d = cfg.data
        self.selection, self.data, self.members = selection, data, members
        self.init_times = np.asarray(init_times)
        self.stats: Statistics | None = None
        truth, clim_path = score_stores(request, cfg)
        self.view = StoreView.open(truth)
        check_same_grid(data.source.view, self.view.lat, self.view.lon, f"--truth {truth!r}")
        spec = selection.spec
        self.reader = TileReader(self.view, spec, data.grid, data.tile, Halo(), threads=d.read_threads)
        self.init_idx = _indices(self.view.times, init_times, f"--truth {truth!r}")
        valid = np.asarray(init_times)[:, None] + selection.leads[None, :]
        self.valid_times = valid
        self.valid_idx = _indices(self.view.times, valid, f"--truth {truth!r}")
        if request.climatology is not None and not Path(request.climatology).exists():
            raise FileNotFoundError(
                f"--climatology {request.climatology} not found; give the WB2 "
                f"climatology store of the truth, or leave --climatology out"
            )
        self.clim = TileClimatology.open(clim_path, self.view, spec, data.tile, "--climatology")
        self.regions = TileRegions.build(self.view.lat, self.view.lon, data.tile, request.regions)
        mesh = data.mesh
        self.device = mesh.device  # shares are taken where the forecast is
        names = [MODEL, "persistence"] + (["climatology"] if self.clim is not None else [])
        self.accs = {
            m: MetricAccumulator(data.lat_weights, (data.grid.n_lat, data.grid.n_lon), mesh.domain,
                                 mesh.axis("data"), selection.channels, regions=self.regions,
                                 members=members if m == MODEL else None, device=mesh.device)
            for m in names
        }  # fmt: skip
        self._leads: dict[str, list[torch.Tensor]] = {m: [] for m in names}
        self._persistence: torch.Tensor | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="jigsaw-predict-truth")
        self._ahead: ReadAhead | None = None
        self.truth_wait_s = 0.0  # the scoring thread waiting for its reads

    def begin(self, positions: np.ndarray) -> None:
        """A new batch of inits (positions in the forecast's init list): its persistence and every
        lead's truth and climatology are read ahead, in order."""
        self.positions = np.asarray(positions)
        if self._ahead is not None:
            self.truth_wait_s += self._ahead.waited_s
            self._ahead.cancel()
        self._ahead = ReadAhead(self._pool, self._read, 1 + self.valid_idx.shape[1], AHEAD + 1)
        self._persistence = torch.from_numpy(self._ahead.take(0)[0]).to(self.device)

    def _read(self, k: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The batch's persistence (``k`` = 0), else the truth and climatology of lead ``k`` − 1."""
        pos = self.positions
        if k == 0:
            return self.reader.read_targets(self.init_idx[pos]), None
        truth = self.reader.read_targets(self.valid_idx[pos, k - 1])
        return truth, None if self.clim is None else self.clim.at(self.valid_times[pos, k - 1])

    def update(self, lead_index: int, forecast: torch.Tensor) -> None:
        """The batch's forecast at selected lead ``lead_index``, ``(B, V, h, w)`` physical units on the
        mesh's device; an ensemble's ``(B, M, V, h, w)``, every member."""
        truth_np, clim_np = self._ahead.take(lead_index + 1)
        truth = torch.from_numpy(truth_np).to(self.device)[:, None]
        clim = None if clim_np is None else torch.from_numpy(clim_np).to(self.device)[:, None]
        candidates = {MODEL: forecast[:, None], "persistence": self._persistence[:, None]}
        if clim is not None:
            candidates["climatology"] = clim
        for m, pred in candidates.items():
            ref = clim if m != "climatology" else None
            self._leads[m].append(self.accs[m].shares(pred, truth, ref))

    def close(self) -> None:
        """Stop reading ahead (after the last batch, or on an error); ``truth_wait_s`` is then final."""
        if self._ahead is not None:
            self.truth_wait_s += self._ahead.waited_s
            self._ahead.cancel()
            self._ahead = None
        self._pool.shutdown(wait=True, cancel_futures=True)

    def end(self) -> None:
        """The batch is done: its leads join one entry per init."""
        for m, parts in self._leads.items():
            self.accs[m].add(torch.cat(parts, dim=1))
            parts.clear()

    def last_batch(self) -> dict[str, torch.Tensor]:
        """This rank's shares of the batch ``end`` closed last, per model: what a resume restores."""
        return {m: acc.parts[-1] for m, acc in self.accs.items()}

    def restore(self, batches: list[dict[str, torch.Tensor]]) -> None:
        """Add the shares of batches an earlier run scored (``last_batch`` of each, in their order),
        so ``finish`` sums exactly what an uninterrupted run sums."""
        for shares in batches:
            for m, acc in self.accs.items():
                acc.add(shares[m])

    def statistics(self) -> Statistics:
        """Collective: the per-init statistics of every model (``metrics.statistics``), the same on every
        rank: each replica's per-init sums reduced over the domain (exact global means), placed at its
        inits' positions and summed over the data axis (each init is one replica's)."""
        mesh, sel = self.data.mesh, self.selection
        data = mesh.axis("data")
        mine = np.arange(len(self.init_times))[data.index :: data.size]  # predict's inits of this replica
        fields = [(v, lev) for v in sel.upper_air for lev in sel.levels] + [(v, None) for v in sel.surface]
        chans = [sel.channels.index(field_name(v, lev)) for v, lev in fields]
        values = {}
        for m, acc in self.accs.items():
            local = acc.per_sample()  # (inits of this replica, L, V, R, k)
            if local.shape[0] != mine.size:
                raise RuntimeError(f"scored {local.shape[0]} inits on this replica, expected {mine.size}")
            every = local.new_zeros((len(self.init_times), *local.shape[1:]))
            every[torch.as_tensor(mine, device=every.device)] = local
            if data.group is not None:
                all_reduce_(every, data, op="metrics")
            arr = every.cpu().numpy()[:, :, chans]  # (time, lead, field, region, k)
            names = (
                "se",
                "e",
                *(("fo", "ff", "oo") if self.clim is not None and m != "climatology" else ()),
                *(POINTWISE if acc.members is not None else ()),
            )  # ``MetricAccumulator.shares``' order
            values[m] = {q: arr[..., i] for i, q in enumerate(names)}
        attrs = [dict(self.view.dataset[self.view.resolve(v, lev is not None)].attrs) for v, lev in fields]
        units = [unit_of(v, a) for (v, _), a in zip(fields, attrs)]
        hours = sel.leads / np.timedelta64(1, "h")
        return Statistics.build(values, self.init_times, hours, fields, self.regions.names, units,
                                members=self.members)  # fmt: skip

    def finish(self, interval: IntervalOptions | None = None) -> list[dict[str, Any]]:
        """Collective: the scores as ``score``'s table rows (one per model, metric, region, variable,
        level, lead), on every rank, with their intervals by ``interval`` (None: the default, ``ar2`` at
        95 %); the statistics they come from stay in ``self.stats``."""
        self.stats = self.statistics()
        return score_rows(self.stats, interval or IntervalOptions())
