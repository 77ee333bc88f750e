"""A shared model's input contract (``contract.json``): what it reads and how, checked before it runs.

``make_contract`` writes down, at export, what the model was trained on: its variables (WB2 names
and units), levels, grid (latitudes north → south and longitudes as the model sees them, and the
latitude order the training store held), time step, input and output channels in order, static
fields, normalisation statistics, the training store's identity (path, periods, times and a hash
of its layout) and the precision. ``check_source`` compares a store or an analysis with it before
any model is built, and refuses, with one message naming the difference: a variable or level it
lacks, another grid, the latitudes in the other order, a ``units`` attribute naming another unit.
Inputs whose values lie far from the training statistics (a unit slip: °C for K, hPa for Pa) are
returned as warnings naming the variable and, where one fits, the slip.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import numpy as np
import torch

from ..config.parse import to_dict
from ..config.schema import TrainConfig
from ..data.samples import TrainData
from ..data.store import StoreView
from .units import contract_unit, declared_unit, same_unit, slip_hint

__all__ = ["FORMAT", "GRID_TOLERANCE_DEG", "VERSION", "check_source", "layout_sha256", "make_contract"]

log = logging.getLogger(__name__)

FORMAT, VERSION = "jigsaw-earth-model", 1
GRID_TOLERANCE_DEG = 1e-5  # GRIB 2 stores degrees in millionths
FAR_STDS = 5.0  # inputs whose mean lies further than this many training stds away get a warning
SAMPLE_POINTS = 64 * 128  # the grid points a statistics check reads of one field


def _attrs(view: StoreView, name: str, upper: bool) -> dict[str, Any]:
    return dict(view.dataset[view.resolve(name, upper_air=upper)].attrs)


def layout_sha256(view: StoreView) -> str:
    """SHA-256 of a store's layout: every variable's dimensions, shape and dtype, the coordinates
    and the times (first, last, count); not its values."""
    ds = view.dataset
    layout = {
        "variables": {
            str(k): [list(map(str, v.dims)), list(v.shape), str(v.dtype)] for k, v in ds.data_vars.items()
        },
        "latitude": np.round(view.lat, 6).tolist(),
        "longitude": np.round(view.lon, 6).tolist(),
        "levels": None if view.levels is None else np.round(view.levels, 3).tolist(),
        "times": [str(view.times[0]), str(view.times[-1]), len(view.times)] if len(view.times) else [],
    }
    return hashlib.sha256(json.dumps(layout, sort_keys=True).encode()).hexdigest()


def _source(view: StoreView) -> str | None:
    """What wrote the training store, from its record (``synth``, ``prepare``, …; None: unknown)."""
    record = view.group.attrs.get("jigsaw_earth") if view.group is not None else None
    return str(record["source"]) if isinstance(record, dict) and record.get("source") else None


def make_contract(
    cfg: TrainConfig, data: TrainData, channels: dict[str, list[str]], training: dict[str, Any]
) -> dict[str, Any]:
    """The contract of the model ``cfg`` builds on ``data`` (``channels``: its state, static and time
    channel names in order; ``training``: run, step, mesh, device and parameter count)."""
    d, view = cfg.data, data.source.view
    std = data.std.reshape(-1)
    times = np.asarray(view.times).astype("datetime64[s]")
    return {
        "format": FORMAT,
        "version": VERSION,
        "model": {**to_dict(cfg.model), "parameters": int(training["parameters"])},
        "variables": {
            "upper_air": [{"name": v, "units": contract_unit(v, _attrs(view, v, True))} for v in d.upper_air],
            "surface": [{"name": v, "units": contract_unit(v, _attrs(view, v, False))} for v in d.surface],
            "static": [{"name": v, "units": contract_unit(v, _attrs(view, v, False))} for v in d.static],
        },
        "levels": sorted(int(x) for x in d.levels),
        "grid": {
            "n_lat": len(view.lat),
            "n_lon": len(view.lon),
            "latitude": [float(x) for x in view.lat],
            "longitude": [float(x) for x in view.lon],
            "model_order": "latitude north to south, longitude ascending",
            "training_store_latitude_order": "north_to_south"
            if view.lat_descending_in_storage
            else "south_to_north",
        },
        "step_hours": int(d.step_hours),
        "channels": {"inputs": channels, "outputs": list(channels["state"])},
        "normalisation": {
            "mean": data.mean.reshape(-1).tolist(),
            "std": std.tolist(),
            "diff_std": (data.tendency_std.numpy() * std).tolist(),
            "tendency_std": data.tendency_std.tolist(),  # diff_std / std: what the model's step scales by
            "tendency_scaling": bool(cfg.loss.tendency_scaling),
            "static": "static.safetensors holds the static fields as the model reads them (normalised)",
        },
        "training_data": {
            "store": str(d.store),
            "train_period": list(d.train_period),
            "val_period": list(d.val_period),
            "times": [str(times[0]), str(times[-1]), len(times)] if len(times) else [],
            "layout_sha256": layout_sha256(view),
            "source": _source(view),
        },
        "precision": cfg.training.precision,
        "training": {k: v for k, v in training.items() if k != "parameters"},
    }


def _grid_text(lat: np.ndarray, lon: np.ndarray) -> str:
    return (
        f"{len(lat)}x{len(lon)} (latitude {lat[0]:g} … {lat[-1]:g}, longitude {lon.min():g} … {lon.max():g})"
    )


def _check_grid(contract: dict[str, Any], view: StoreView, what: str) -> None:
    grid = contract["grid"]
    want_lat, want_lon = np.asarray(grid["latitude"]), np.asarray(grid["longitude"]) % 360.0
    raw_lat = np.asarray(view.dataset[view.coord_names["latitude"]].values, np.float64)
    raw_lon = np.asarray(view.dataset[view.coord_names["longitude"]].values, np.float64) % 360.0
    same = len(raw_lat) == len(want_lat) and len(raw_lon) == len(want_lon)
    same = same and np.abs(np.sort(raw_lat) - np.sort(want_lat)).max() <= GRID_TOLERANCE_DEG
    same = same and np.abs(np.sort(raw_lon) - np.sort(want_lon)).max() <= GRID_TOLERANCE_DEG
    if not same:
        raise ValueError(
            f"{what} is on another grid than the model: {_grid_text(raw_lat, raw_lon)} against the "
            f"contract's {_grid_text(want_lat, want_lon)} (contract.json: grid); regrid it to the model's "
            "grid first (e.g. `cdo remapbil`), or use a model trained on its grid"
        )
    trained = grid["training_store_latitude_order"]
    order = "north_to_south" if raw_lat[0] > raw_lat[-1] else "south_to_north"
    if order != trained:
        words = {"north_to_south": "north → south", "south_to_north": "south → north"}
        raise ValueError(
            f"{what} holds its latitudes {words[order]} ({raw_lat[0]:g} … {raw_lat[-1]:g}), the model's "
            f"contract {words[trained]} (contract.json: grid.training_store_latitude_order): flipped "
            f"latitude order; write it {words[trained]} first, e.g. `jigsaw-earth data prepare "
            f"{view.path} --out NEW.zarr` (prepare writes latitude north → south)"
        )


def _check_variables(contract: dict[str, Any], view: StoreView, what: str, static: bool) -> None:
    kinds = [("upper_air", True), ("surface", False)] + ([("static", False)] if static else [])
    levels = contract["levels"]
    for kind, upper in kinds:
        for item in contract["variables"][kind]:
            name = item["name"]
            try:
                store_name = view.resolve(name, upper_air=upper)
            except ValueError:
                raise ValueError(
                    f"{what} lacks {name} ({kind.replace('_', '-')}), which the model reads (contract.json: "
                    f"variables.{kind}); it has {view.describe_variables()}. Add it, or map a variable of "
                    f"another name to it (data prepare --name {name}=NAME)"
                ) from None
            if upper:
                have = [] if view.levels is None else [float(x) for x in view.levels]
                missing = [lev for lev in levels if not np.isclose(have, lev).any()]
                if missing:
                    shown = [int(x) if float(x).is_integer() else x for x in have]
                    raise ValueError(
                        f"{what} holds {name} on levels {shown} hPa, not on {missing}: the model reads "
                        f"levels {levels} (contract.json: levels); give it a store or analysis with them"
                    )
            unit = declared_unit(dict(view.dataset[store_name].attrs))
            if unit is not None and not same_unit(unit, item["units"]):
                raise ValueError(
                    f"{what} holds {name} in {unit} (its units attribute), the model reads it in "
                    f"{item['units']} (contract.json: variables.{kind}); convert it to {item['units']} first"
                )


def _sample(view: StoreView, name: str, upper: bool, level: int | None, time_index: int) -> np.ndarray:
    names = view.coord_names
    step_lat = max(1, int(np.ceil(len(view.lat) / 64)))
    step_lon = max(1, int(np.ceil(len(view.lon) / 128)))
    at: dict[str, Any] = {
        names["latitude"]: slice(None, None, step_lat),
        names["longitude"]: slice(None, None, step_lon),
    }
    da = view.dataset[view.resolve(name, upper_air=upper)]
    if names["time"] in da.dims:
        at[names["time"]] = time_index
    if upper:
        at[names["level"]] = int(view.level_indices(name, (level,))[0])
    return np.asarray(da.isel(at).values, np.float64)


def _far(contract: dict[str, Any], view: StoreView, what: str, time_index: int) -> list[str]:
    """Warnings for fields of the state at ``time_index`` whose values lie far from the training's."""
    norm = contract["normalisation"]
    state = contract["channels"]["inputs"]["state"]
    units = {i["name"]: i["units"] for k in ("upper_air", "surface") for i in contract["variables"][k]}
    upper = {i["name"] for i in contract["variables"]["upper_air"]}
    warnings = []
    for k, channel in enumerate(state):
        name, _, lev = channel.partition("@")
        values = _sample(view, name, name in upper, int(lev) if lev else None, time_index)
        values = values[np.isfinite(values)]
        if not values.size:
            continue
        mean, std = float(values.mean()), float(values.std())
        t_mean, t_std = norm["mean"][k], max(norm["std"][k], 1e-12)
        ratio = std / t_std
        if abs(mean - t_mean) / t_std <= FAR_STDS and (ratio == 0 or 0.1 <= ratio <= 10):
            continue
        hint = slip_hint(units[name], t_mean, t_std, mean)
        guess = (
            f": is it in {hint}? The model reads {units[name]}"
            if hint
            else f"; check its units ({units[name]})"
        )
        warnings.append(
            f"{channel} of {what} averages {mean:.6g} (std {std:.3g}) where the training data averaged "
            f"{t_mean:.6g} {units[name]} (std {t_std:.3g}){guess}"
        )
    return warnings


def check_source(
    contract: dict[str, Any], view: StoreView, what: str, *, static: bool = True, time_index: int = 0
) -> list[str]:
    """Refuse ``view`` (a store, or an analysis with ``static=False``) unless it holds what the model
    reads, on its grid, in its latitude order and declared units (one ``ValueError`` naming the
    difference); return warnings for fields of the state at ``time_index`` far from the training
    statistics."""
    _check_variables(contract, view, what, static)
    _check_grid(contract, view, what)
    return _far(contract, view, what, time_index)


def statistics_tensors(contract: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The contract's normalisation as float32 tensors ``(C,)``: ``mean``, ``std``, ``tendency_std``."""
    norm = contract["normalisation"]
    return {k: torch.tensor(norm[k], dtype=torch.float32) for k in ("mean", "std", "tendency_std")}
