"""The model card of a shared model: ``README.md`` with Hugging Face's YAML header.

The header holds the license the exporter chose, the tags and the datasets; the text says what the
model is (architecture, size, inputs and outputs, grid and step), what it was trained on and how
long, its validation scores with their intervals against persistence and climatology (the tables
``jigsaw-earth score`` prints, from the PREFIX.json given with ``--scores``), its reference
forecast, how to run, verify, load and fine-tune it, and its limits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["model_card"]

TAGS = ["weather-forecasting", "earth-system", "jigsaw-earth", "safetensors"]


def _header(contract: dict[str, Any], license: str, datasets: tuple[str, ...]) -> str:
    meta: dict[str, Any] = {
        "license": license,
        "library_name": "jigsaw-earth",
        "tags": [*TAGS, str(contract["model"]["name"])],
    }
    if datasets:
        meta["datasets"] = list(datasets)
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n"


def _scores(scores: tuple[list[dict[str, Any]], dict[str, Any]] | None) -> list[str]:
    if scores is None:
        return [
            "No validation scores were given at export. Score a forecast with `jigsaw-earth score`, then",
            "export with `--scores PREFIX.json` to show them here with their intervals.",
        ]
    from ..metrics.scorecard import format_scorecard
    from ..metrics.significance_card import format_comparisons

    rows, info = scores
    forecast, truth = (Path(str(info.get(k) or "?")).name for k in ("forecast", "truth"))
    table = format_scorecard(rows, [], info.get("resolution") or "?", _period(info),
                             members=info.get("members"), interval=info.get("interval"))  # fmt: skip
    lines = [
        f"Scored by `jigsaw-earth score`: the forecast `{forecast}` against `{truth}`. RMSE, ACC and bias",
        "per lead beside persistence and climatology,",
        "each `value±h` with h half the width of its interval; then the relative differences with their",
        "intervals (`*`: significant).",
        "",
        "```text",
        table,
    ]
    if info.get("comparisons") and info.get("interval"):
        lines += ["", format_comparisons(info["comparisons"], info["interval"])]
    return [*lines, "```"]


def _period(info: dict[str, Any]) -> str:
    inits = info.get("inits") or []
    return f"{inits[0]} … {inits[1]}, {inits[2]} inits" if len(inits) == 3 else "?"


def _span(period: list[str]) -> str:
    return " … ".join(period) if period else "all times"


def _bytes(n: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _model(contract: dict[str, Any], weights: list[str], size: int) -> list[str]:
    m, g, ch = contract["model"], contract["grid"], contract["channels"]["inputs"]
    overrides = ", ".join(f"{k}={v}" for k, v in (m.get("overrides") or {}).items()) or "none"
    v = contract["variables"]
    upper = ", ".join(f"{i['name']} [{i['units']}]" for i in v["upper_air"]) or "none"
    surface = ", ".join(f"{i['name']} [{i['units']}]" for i in v["surface"]) or "none"
    static = ", ".join(i["name"] for i in v["static"]) or "none"
    order = g["training_store_latitude_order"].replace("_", " ")
    return [
        f"- architecture: `{m['name']}`, preset `{m['preset']}`, overrides: {overrides}",
        f"- parameters: {m['parameters']:,} (`{'`, `'.join(weights)}`, {_bytes(size)}), trained in "
        f"{contract['precision']}",
        f"- grid: {g['n_lat']} latitudes × {g['n_lon']} longitudes ({g['model_order']}; the training store "
        f"held its latitudes {order})",
        f"- time step: {contract['step_hours']} h (one step maps the state to the state that much later)",
        f"- inputs: {len(ch['state'])} state channels, {len(ch['static'])} static, {len(ch['time'])} time "
        "features, in the order of `contract.json` (`channels`); outputs: the state channels",
        f"- upper-air: {upper} on {', '.join(map(str, contract['levels']))} hPa",
        f"- surface: {surface}",
        f"- static fields: {static} and the grid's geometry (`static.safetensors`, as the model reads them)",
    ]


def _training(contract: dict[str, Any]) -> list[str]:
    t, d = contract["training"], contract["training_data"]
    times = f"{d['times'][2]} times, {d['times'][0]} … {d['times'][1]}" if d["times"] else "no times"
    how = ""
    if "train_wall_s" in t:
        how = f" in {t['train_wall_s']:.0f} s ({t.get('samples_per_s', float('nan')):.3g} samples/s)"
    if "final_loss" in t:
        how += f", final loss {t['final_loss']:.6g}"
    return [
        f"- data: `{d['store']}` ({times}; layout SHA-256 `{d['layout_sha256'][:16]}…`): training inits "
        f"{_span(d['train_period'])}, validation {_span(d['val_period'])}",
        f"- {t['step']} steps of run `{t.get('run')}` on mesh {t['mesh']}{how}; exported on "
        f"{t['exported_on']} with torch {t['torch']}",
        "- normalisation: each channel's mean and std over the training store (`contract.json`, "
        "`normalisation`)",
    ]


USE = """```bash
jigsaw-earth model verify MODEL_DIR
torchrun --nproc-per-node 4 -m jigsaw_earth predict --model MODEL_DIR --out fc.zarr data.store=STORE.zarr
```

```python
import jigsaw_earth

model = jigsaw_earth.load_model("MODEL_DIR")  # an nn.Module on one device; model.contract: contract.json
state = model(state, model.time_features(times))  # (B, C, H, W), physical units, model.channels' order
```

Fine-tune it with `training.init_from: MODEL_DIR` in a jigsaw-earth config."""


def model_card(
    contract: dict[str, Any],
    files: dict[str, dict[str, Any]],
    expected: dict[str, Any],
    request: Any,
    scores: tuple[list[dict[str, Any]], dict[str, Any]] | None,
) -> str:
    """The card's text (``request``: the export's license and datasets)."""
    m, d = contract["model"], contract["training_data"]
    weights = sorted(n for n in files if n.startswith("model") and n.endswith(".safetensors"))
    size = sum(files[n]["bytes"] for n in weights)
    name = contract["training"].get("run") or m["name"]
    lines = [
        _header(contract, request.license, tuple(request.datasets)),
        f"# {name}: a {m['name']} weather forecasting model ({m['parameters']:,} parameters)",
        "",
        "Trained and exported with jigsaw-earth. This folder holds all it needs: the weights (consolidated",
        "global tensors), the input contract (`contract.json`), the static fields and a reference forecast.",
        "",
        "## Model",
        "",
        *_model(contract, weights, size),
        "",
        "## Training",
        "",
        *_training(contract),
        "",
        "## Validation scores",
        "",
        *_scores(scores),
        "",
        "## Reference forecast",
        "",
        f"`reference.safetensors` holds the state at {expected['init_time']}, `reference.json` the mean,",
        f"std, min and max of each field after each of {expected['steps']} steps, to within "
        f"{expected['tolerance']:g} × the field's std.",
        "`jigsaw-earth model verify MODEL_DIR` reruns it and checks every file against the export.",
        "",
        "## How to use it",
        "",
        USE,
        "",
        "## Limits",
        "",
        "- It forecasts only from inputs like its training data: the variables, levels and units of",
        "  `contract.json`, on its grid, latitudes in the contract's order. jigsaw-earth checks a store or",
        "  an analysis against the contract before the model loads; code of your own must keep to it.",
        f"- Its scores hold for its validation period ({_span(d['val_period'])}) on `{d['store']}`;",
        "  other data, seasons or resolutions are untested.",
    ]
    if d.get("source") == "synth":
        lines += [
            "- It was trained on synthetic data (`jigsaw-earth data synth`): a demonstration of the toolkit,",
            "  not a forecast of the real atmosphere.",
        ]
    return "\n".join(lines) + "\n"
