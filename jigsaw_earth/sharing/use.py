"""``predict --model DIR``: forecast with a shared model, on any mesh, without its run directory.

``model_config`` makes the forecast's configuration from the contract (model, variables, levels,
static fields, step, tendency scaling, precision; ``data.store`` defaults to the training store,
``data.val_period`` to its validation period) on the squarest ``lat × lon`` mesh of the job's
ranks, then applies the user's ``KEY=VALUE`` overrides (a store, a mesh); an override of what
decides the weights' shapes or the channels' meaning is refused. ``check_inputs`` checks the
store (and an ``--init`` analysis) against the contract before any model is built, logging the
warnings of fields far from the training statistics; ``use_contract`` gives the data the model's
own normalisation and static fields (not the store's).
"""

from __future__ import annotations

import copy
import logging
import os
from typing import TYPE_CHECKING, Any

from ..config import parse_config
from ..config.parse import to_dict
from ..config.schema import TrainConfig
from ..config.shape_keys import compare_shape_keys
from ..data.samples import TrainData
from ..data.store import StoreView
from ..distributed.mesh import MeshShape
from .contract import check_source, statistics_tensors
from .folder import STATIC, ModelFolder

if TYPE_CHECKING:
    from ..data.analysis import Analysis

__all__ = ["check_analysis", "check_config", "check_store", "fit_mesh", "model_config", "use_contract"]

log = logging.getLogger(__name__)


def _raw(folder: ModelFolder) -> dict[str, Any]:
    """The configuration the contract describes (as a YAML config would hold it): a copy, which
    overrides may change in place."""
    c = copy.deepcopy(folder.contract)
    names = {k: [i["name"] for i in c["variables"][k]] for k in ("upper_air", "surface", "static")}
    model = {k: v for k, v in c["model"].items() if k != "parameters"}
    return {
        "run": {"dir": str(folder.path), "name": str(c["training"].get("run") or "shared-model")},
        "data": {
            "store": c["training_data"]["store"],
            **names,
            "levels": list(c["levels"]),
            "step_hours": c["step_hours"],
            "train_period": [],
            "val_period": list(c["training_data"]["val_period"]),
        },
        "model": model,
        "loss": {"tendency_scaling": bool(c["normalisation"]["tendency_scaling"])},
        "training": {"precision": c["precision"], "batch_size": 1},
        # what a config must name (predict reads neither): channels the model has, one step's lead
        "validation": {"variables": list(c["channels"]["outputs"]), "lead_hours": [c["step_hours"]]},
        "logging": {"wandb": {"mode": "disabled"}},
    }


def fit_mesh(raw: dict[str, Any], overrides: list[str] | None, world_size: int) -> dict[str, Any]:
    """``raw`` (a config as YAML holds it) on the squarest ``lat × lon`` mesh of ``world_size`` ranks
    when its own mesh has another number of ranks and no ``mesh.*`` override sets one."""
    mesh = raw.get("mesh") or {}
    ranks = 1
    for axis in ("data", "ensemble", "lat", "lon"):
        ranks *= int(mesh.get(axis, 1))
    if ranks == world_size or any(o.split("=", 1)[0].startswith("mesh.") for o in overrides or []):
        return raw
    shape = MeshShape.squarest(world_size)
    return {**raw, "mesh": {"data": 1, "ensemble": 1, "lat": shape.lat, "lon": shape.lon}}


def model_config(folder: ModelFolder, overrides: list[str] | None, world_size: int) -> TrainConfig:
    """The forecast's configuration for a job of ``world_size`` ranks (collective-free)."""
    cfg = parse_config(fit_mesh(_raw(folder), overrides, world_size), overrides)
    check_config(folder, cfg)
    cfg.check(world_size)
    return cfg


def check_config(folder: ModelFolder, cfg: TrainConfig) -> None:
    """Refuse a configuration whose model or channels are not the contract's, naming the item."""
    compare_shape_keys(cfg, to_dict(parse_config(_raw(folder))), f"{folder.path / 'contract.json'}",
                       "predict with the model as exported (drop the override of {item})")  # fmt: skip


def _warn(lines: list[str]) -> None:
    if int(os.environ.get("RANK", "0")) == 0:  # every rank checks; one tells
        for line in lines:
            log.warning("%s", line)


def check_store(folder: ModelFolder, store: str) -> None:
    """Refuse a store that breaks the contract, before any model is built; warn of fields of its
    first state far from the training statistics."""
    _warn(check_source(folder.contract, StoreView.open(store), f"store {store}", time_index=0))


def check_analysis(folder: ModelFolder, analysis: Analysis) -> None:
    """Refuse an ``--init`` analysis that breaks the contract; warn of fields of its first state far
    from the training statistics."""
    where = f"--init {analysis.path}"
    lines = check_source(
        folder.contract, analysis.view, where, static=False, time_index=int(analysis.time_index[0])
    )
    _warn(lines)


def use_contract(folder: ModelFolder, data: TrainData) -> None:
    """Normalise ``data`` with the model's own statistics and give it the model's static fields."""
    stats = statistics_tensors(folder.contract)
    tile = data.tile
    n_static = data.n_static
    static = folder.read(STATIC, "static", (0, tile.lat_start, tile.lon_start), (n_static, *tile.shape))
    data.use_normalisation(stats["mean"].numpy(), stats["std"].numpy(), stats["tendency_std"], static.float())
