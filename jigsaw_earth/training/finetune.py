"""Fine-tuning: start a run from another run's weights and train only part of the model.

``training.init_from`` (a checkpoint; or a run directory, its checkpoints folder or that folder's
``latest``: the newest checkpoint; or a shared model's folder, ``model export``) gives a new run
the parent's weights at its first start, with a fresh optimizer, step and schedule; the config's
data, mesh, schedule and loss may differ.
Channels are matched by name (``variable@level``, static fields, time features): the model's
``channel_dims`` hook names the tensors indexed by them, and ``checkpoint.transfer`` keeps the kept
channels' weights, drops the removed ones and starts the added ones at zero (weights from new
inputs and to new outputs) or at the model's own initialisation (a norm's scale and shift). A
parent of another model (name, or any tensor of another shape) or another grid is refused, naming
what differs.

``training.freeze`` (module patterns) turns off ``requires_grad`` of the parameters under the
matching modules before the optimizer is built: they get no gradient and no optimizer state, and
the gradient sums, the norm, clipping and the ledger's gradient traffic cover only the rest.

What a run records for its children (``run_record``, in every checkpoint's state): the model
section, the grid, the channel names and the normalisation statistics. A parent written without
it is described from its run directory's ``config.yaml`` (and its store's grid, when readable); a
shared model by its contract, its weights read from its safetensors files.
"""

from __future__ import annotations

import difflib
import fnmatch
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from torch import nn

from ..checkpoint import latest_checkpoint, read_meta
from ..checkpoint.transfer import (
    ChannelMap,
    ParentWeights,
    channel_maps,
    check_transfer,
    checkpoint_sha256,
    load_transferred,
)
from ..config.parse import to_dict
from ..config.schema import TrainConfig
from ..data.batch import STATIC_GEOMETRY, channel_names
from ..data.samples import TrainData, model_channels
from ..data.times import TIME_FEATURES
from ..distributed.mesh import DomainMesh
from ..layers.channels import ModelChannels
from ..sharing.folder import ModelFolder, is_model_folder

__all__ = [
    "ParentPlan",
    "apply_freeze",
    "frozen_parameters",
    "load_parent",
    "parent_record",
    "plan_init_from",
    "resolve_parent",
    "run_record",
]

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------ freeze
def frozen_parameters(model: nn.Module, patterns: list[str]) -> set[str]:
    """The parameter paths ``training.freeze`` selects (fnmatch: ``blocks``, ``blocks.*``,
    ``*norm*``; a module's path or a parameter's own). A pattern that matches nothing is an error
    naming the model's top-level modules, as is freezing everything. Nothing is changed (``config
    validate`` checks the patterns on a model built on the meta device)."""
    modules = [name for name, _ in model.named_modules() if name]
    params = dict(model.named_parameters())
    frozen: set[str] = set()
    for pattern in patterns:
        hit = {
            name
            for name in params
            if fnmatch.fnmatchcase(name, pattern)
            or any(fnmatch.fnmatchcase(prefix, pattern) for prefix in _prefixes(name))
        }
        if not hit:
            top = sorted({m.split(".")[0] for m in modules})
            close = difflib.get_close_matches(pattern, modules, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"training.freeze: {pattern!r} matches no module of the model{hint}; its modules start "
                f"with {top} (`jigsaw-earth model summary` lists them)"
            )
        frozen |= hit
    if len(frozen) == len(params):
        raise ValueError(
            f"training.freeze={patterns} freezes every parameter; leave some of the model to train"
        )
    return frozen


def apply_freeze(model: nn.Module, patterns: list[str]) -> list[str]:
    """Freeze the parameters ``frozen_parameters`` selects; returns their sorted paths."""
    if not patterns:
        return []
    params = dict(model.named_parameters())
    frozen = frozen_parameters(model, patterns)
    for name in frozen:
        params[name].requires_grad_(False)
    n_all = sum(_global_numel(p) for p in params.values())
    n_frozen = sum(_global_numel(params[name]) for name in frozen)
    log.info(
        "training.freeze %s: %d of %d parameter tensors frozen (%d of %d weights); %d weights train",
        patterns,
        len(frozen),
        len(params),
        n_frozen,
        n_all,
        n_all - n_frozen,
    )
    return sorted(frozen)


def _prefixes(path: str) -> list[str]:
    parts = path.split(".")
    return [".".join(parts[:k]) for k in range(1, len(parts))]


def _global_numel(p: nn.Parameter) -> int:
    spec = getattr(p, "_jigsaw_spec", None)
    return int(np.prod(spec.global_shape)) if spec is not None else p.numel()


# ------------------------------------------------------------------------ what a run records
def run_record(cfg: TrainConfig, data: TrainData) -> dict[str, Any]:
    """What a child run needs to know about this one (JSON-ready; stored in every checkpoint)."""
    ch = model_channels(cfg, data)
    std = data.std.reshape(-1)
    return {
        "model": to_dict(cfg.model),
        "grid": [data.grid.n_lat, data.grid.n_lon],
        "channels": {"state": list(ch.state), "static": list(ch.static), "time": list(ch.time)},
        "statistics": {
            "mean": data.mean.reshape(-1).tolist(),
            "std": std.tolist(),
            "diff_std": (data.tendency_std.numpy() * std).tolist(),
        },
    }


def _from_config_yaml(ckpt: Path) -> dict[str, Any]:
    """A parent checkpoint written without a run record: its run directory's ``config.yaml``."""
    path = ckpt.parent.parent / "config.yaml"
    if not path.is_file():
        raise ValueError(
            f"training.init_from: checkpoint {ckpt} records neither its model and channels nor has "
            f"{path} beside its checkpoints; copy the parent run's config.yaml there"
        )
    raw = yaml.safe_load(path.read_text()) or {}
    model, data = raw.get("model") or {}, raw.get("data") or {}
    noise = [f"noise:{k}" for k in range(int(model.get("noise_channels") or 0))]
    state = channel_names(data.get("upper_air", []), data.get("levels", []), data.get("surface", []))
    grid = None
    try:  # the grid is the store's; a parent whose store is gone is checked tensor by tensor
        from ..data.store import StoreView

        grid = list(StoreView.open(data["store"]).grid_shape)
    except Exception as err:  # any failure to open only skips the grid check
        log.warning("parent store not readable (%s): its grid is checked by the weights' shapes", err)
    return {
        "model": model,
        "grid": grid,
        "channels": {
            "state": state,
            "static": [*data.get("static", []), *STATIC_GEOMETRY, *noise],
            "time": list(TIME_FEATURES),
        },
        "statistics": None,
        "source": str(path),
    }


def _shared_parent(path: Path) -> ModelFolder | None:
    """The shared model at ``path`` (opened, its files checked), or None when it is not one."""
    return ModelFolder.open(path) if is_model_folder(path) else None


def _from_contract(folder: ModelFolder) -> dict[str, Any]:
    c = folder.contract
    norm = c["normalisation"]
    return {
        "model": {k: v for k, v in c["model"].items() if k != "parameters"},
        "grid": [c["grid"]["n_lat"], c["grid"]["n_lon"]],
        "channels": c["channels"]["inputs"],
        "statistics": {k: norm[k] for k in ("mean", "std", "diff_std")},
        "source": str(folder.path / "contract.json"),
        "run": c["training"].get("run"),
        "config_hash": None,
    }


def parent_record(ckpt: Path) -> dict[str, Any]:
    """The parent's record: from its checkpoint, else from its run directory's ``config.yaml``; a
    shared model's from its contract."""
    folder = _shared_parent(ckpt)
    if folder is not None:
        return _from_contract(folder)
    state = read_meta(ckpt)["state"]
    saved = state.get("run_record")
    record = _from_config_yaml(ckpt) if saved is None else {**saved, "source": str(ckpt / "meta.json")}
    record["run"] = state.get("run")
    record["config_hash"] = state.get("config_hash")
    return record


def resolve_parent(init_from: str, run_dir: str | Path | None = None) -> Path:
    """The checkpoint ``training.init_from`` names: itself, a run directory's newest one, or the
    newest of a checkpoints folder (``RUN/checkpoints``) or its ``latest`` file."""
    path = Path(init_from)
    if _shared_parent(path) is not None:
        return path
    if path.name == "latest" and path.is_file():  # RUN/checkpoints/latest: the checkpoint it names
        path = path.parent / path.read_text().strip()
    if (path / "meta.json").is_file():
        ckpt = path
    elif path.is_dir():
        # a run directory, or its checkpoints folder (step_N folders and ``latest``)
        holds = path.parent if (path / "latest").is_file() or any(path.glob("step_*")) else path
        found = latest_checkpoint(holds)
        if found is None:
            raise ValueError(
                f"training.init_from={init_from!r} is a directory without a complete checkpoint; name a "
                "run directory that holds checkpoints/step_N, its checkpoints folder, or a step_N folder"
            )
        ckpt = found
    else:
        raise ValueError(
            f"training.init_from={init_from!r} does not exist; name a run directory (its newest checkpoint "
            "is used), a checkpoint folder RUN_DIR/checkpoints/step_N or a shared model's folder"
        )
    read_meta(ckpt)  # complete, or an error naming what is missing
    if run_dir is not None and ckpt.resolve().parent == (Path(run_dir) / "checkpoints").resolve():
        raise ValueError(
            f"training.init_from={init_from!r} is a checkpoint of this run (run.dir={str(run_dir)!r}); "
            "a run continues from its own checkpoints with checkpoint.resume, not init_from"
        )
    return ckpt


# ---------------------------------------------------------------------------- initialisation
def _diff(parent: Any, child: Any, key: str) -> list[str]:
    if isinstance(parent, dict) or isinstance(child, dict):
        p, c = parent if isinstance(parent, dict) else {}, child if isinstance(child, dict) else {}
        return [d for k in sorted(set(p) | set(c)) for d in _diff(p.get(k), c.get(k), f"{key}.{k}")]
    if isinstance(parent, list) and isinstance(child, tuple | list):
        child = list(child)
    return [] if parent == child else [f"{key} is {parent!r} in the parent, {child!r} here"]


def _check_model_and_grid(parent: dict[str, Any], child: dict[str, Any], ckpt: Path) -> list[str]:
    """Refuse another model name or grid; return the other model-config differences."""
    source = parent.get("source", ckpt)
    if parent["model"].get("name") != child["model"]["name"]:
        raise ValueError(
            f"training.init_from: checkpoint {ckpt} holds model {parent['model'].get('name')!r}, this config "
            f"builds {child['model']['name']!r} ({source}); fine-tune with the parent's model.name"
        )
    if parent.get("grid") is not None and list(parent["grid"]) != list(child["grid"]):
        pg, cg = parent["grid"], child["grid"]
        raise ValueError(
            f"training.init_from: checkpoint {ckpt} was trained on a {pg[0]}x{pg[1]} grid, this store is "
            f"{cg[0]}x{cg[1]}; fine-tune on a store of the parent's grid"
        )
    model_p = {k: v for k, v in parent["model"].items() if k != "noise_channels"}
    model_c = {k: v for k, v in child["model"].items() if k != "noise_channels"}
    return _diff(model_p, model_c, "model")


def _channels(record: dict[str, Any]) -> ModelChannels:
    ch = record["channels"]
    return ModelChannels.from_lists(ch["state"], ch["static"], ch["time"])


def _statistics_note(parent: dict[str, Any], child: dict[str, Any]) -> str | None:
    """How far this store's statistics of the kept channels are from the parent's (None: unknown)."""
    ps, cs = parent.get("statistics"), child["statistics"]
    if not ps:
        return None
    where = {n: k for k, n in enumerate(parent["channels"]["state"])}
    worst, name = 0.0, None
    for i, ch in enumerate(child["channels"]["state"]):
        j = where.get(ch)
        if j is None:
            continue
        for key in ("mean", "std", "diff_std"):
            a, b = ps[key][j], cs[key][i]
            rel = abs(a - b) / max(abs(a), 1e-12)
            if rel > worst:
                worst, name = rel, f"{ch} {key}"
    return "equal" if worst == 0 else f"up to {worst:.3g} relative ({name})"


def _shapes(ckpt: Path) -> tuple[dict[str, tuple[int, ...]], ...]:
    """A shared parent's weight shapes by ``model/`` key (as ``check_transfer``'s argument), or ()."""
    folder = _shared_parent(ckpt)
    return () if folder is None else ({f"model/{k}": v[0] for k, v in folder.shapes().items()},)


def _parent_weights(ckpt: Path) -> ParentWeights | None:
    """A shared parent's weights (read from its safetensors files), or None for a checkpoint."""
    folder = _shared_parent(ckpt)
    if folder is None:
        return None
    shapes = {f"model/{k}": v[0] for k, v in folder.shapes().items()}
    info = {"step": folder.step, "state": {}, "mesh": folder.contract["training"]["mesh"]}
    return ParentWeights(shapes, folder.fill, info)


@dataclass(frozen=True)
class ParentPlan:
    """What ``load_parent`` reads: the parent checkpoint, both runs' records, the channel maps."""

    ckpt: Path
    parent: dict[str, Any]
    child: dict[str, Any]
    maps: dict[str, tuple[ChannelMap, ...]]
    model_diffs: list[str]


def plan_init_from(cfg: TrainConfig, model: nn.Module, data: TrainData) -> ParentPlan:
    """Every check of ``training.init_from`` from metadata alone (nothing written, no tensor read):
    the parent exists, is the same model on the same grid, its tensors fit this model's once the
    channels are matched by name. Raises ``ValueError`` naming what differs."""
    ckpt = resolve_parent(cfg.training.init_from or "", cfg.run.dir)
    parent, child = parent_record(ckpt), run_record(cfg, data)
    model_diffs = _check_model_and_grid(parent, child, ckpt)
    p_ch, c_ch = _channels(parent), _channels(child)
    maps: dict[str, tuple[ChannelMap, ...]] = {}
    if p_ch != c_ch:
        hook = getattr(model, "channel_dims", None)
        if hook is None:
            raise ValueError(
                f"training.init_from: the channels differ from the parent's, and model "
                f"{cfg.model.name!r} does not say which of its weights are indexed by channels; give it a "
                "channel_dims method (docs/models.md, fine-tuning) or fine-tune on the parent's channels"
            )
        maps = channel_maps(hook(c_ch), hook(p_ch))
    try:
        check_transfer(ckpt, model, maps, *_shapes(ckpt))
    except ValueError as err:
        if model_diffs:
            raise ValueError(f"{err}. The model configs differ: {'; '.join(model_diffs)}") from None
        raise
    return ParentPlan(ckpt, parent, child, maps, model_diffs)


def load_parent(plan: ParentPlan, mesh: DomainMesh, model: nn.Module) -> dict[str, Any]:
    """Fill ``model`` with the parent's weights (collective); return the lineage record (parent
    checkpoint, its SHA-256 on rank 0, its step and run, the channels added and removed)."""
    ckpt, parent, child = plan.ckpt, plan.parent, plan.child
    info = load_transferred(ckpt, model, mesh, plan.maps, _parent_weights(ckpt))
    for item in plan.model_diffs:
        log.warning("fine-tuning with a changed model setting: %s (the weights fit)", item)
    p_ch, c_ch = _channels(parent), _channels(child)
    p_names = {*p_ch.state, *p_ch.static, *p_ch.time}
    c_names = {*c_ch.state, *c_ch.static, *c_ch.time}
    lineage: dict[str, Any] = {
        "checkpoint": str(ckpt.resolve()),
        "sha256": checkpoint_sha256(ckpt) if mesh.rank == 0 else None,
        "step": info["step"],
        "run": parent.get("run"),
        "config_hash": parent.get("config_hash"),
        "added": [n for n in [*c_ch.state, *c_ch.static, *c_ch.time] if n not in p_names],
        "removed": [n for n in [*p_ch.state, *p_ch.static, *p_ch.time] if n not in c_names],
    }
    if mesh.rank == 0:
        note = _statistics_note(parent, child)
        kept = [c for c in c_ch.state if c in p_ch.state]
        log.info(
            "initialised from %s (step %s of run %r, sha256 %s): %d of %d state channels kept; inputs "
            "added %s, removed %s; every channel normalised with this store's statistics%s",
            ckpt,
            info["step"],
            parent.get("run"),
            lineage["sha256"][:16],
            len(kept),
            len(c_ch.state),
            lineage["added"] or "none",
            lineage["removed"] or "none",
            f" (the kept channels': {note} from the parent's)" if note else "",
        )
    return lineage
