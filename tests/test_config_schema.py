"""The config schema: the exported JSON schema (for editors) agrees with the parser, lists each
model's presets and override keys from ``models/presets.py``, and validates every bundled config;
``config show`` documents every field. Bad values are in ``tests/test_bad_inputs.py``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from jigsaw_earth.models.presets import PRESETS
from jigsaw_earth.models.registry import model_entry, model_names

from jigsaw_earth.cli import main
from jigsaw_earth.config import load_config, parse_config
from jigsaw_earth.config.parse import load_yaml

CONFIGS_DIR = Path(__file__).parents[1] / "configs"
BUNDLED = sorted(CONFIGS_DIR.rglob("*.yaml"))
CONFIGS = {name: model_entry(name).config_cls for name in model_names()}


@pytest.fixture(scope="module")
def schema(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("schema") / "sub" / "jigsaw-earth.schema.json"
    assert main(["config", "schema", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_schema_sections_are_documented_and_closed(schema: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator.check_schema(schema)
    sections = {"data", "run", "mesh", "model", "optim", "loss", "training", "validation"}
    assert set(schema["properties"]) == sections | {"checkpoint", "logging", "distributed"}
    optim = schema["$defs"]["OptimConfig"]
    assert optim["additionalProperties"] is False
    assert optim["properties"]["lr"]["description"].startswith("peak learning rate")
    assert optim["properties"]["lr"]["exclusiveMinimum"] == 0
    assert schema["required"] == ["data"]


def test_schema_lists_each_models_presets_and_overrides(schema: dict[str, Any]) -> None:
    model = schema["properties"]["model"]
    sections = [schema["$defs"][ref["$ref"].rsplit("/", 1)[-1]] for ref in model["oneOf"]]
    mapping = {s["properties"]["name"].get("const"): s for s in sections}
    assert set(mapping) == {*CONFIGS, None}  # None: the package.module:Class section
    assert ":" in mapping[None]["properties"]["name"]["pattern"]
    for name, cls in CONFIGS.items():
        section = mapping[name]
        assert section["additionalProperties"] is False
        assert section["properties"]["name"]["const"] == name
        assert section["properties"]["preset"]["enum"] == list(PRESETS[name])
        ref = section["properties"]["overrides"]["$ref"].rsplit("/", 1)[-1]
        overrides = schema["$defs"][ref]
        assert overrides["additionalProperties"] is False
        fields = {f.name: f for f in dataclasses.fields(cls)}
        assert list(overrides["properties"]) == list(fields)
        for key, prop in overrides["properties"].items():
            default = fields[key].default
            assert prop["default"] == (list(default) if isinstance(default, tuple) else default), key
    vit = mapping["vit"]
    vit_keys = schema["$defs"][vit["properties"]["overrides"]["$ref"].rsplit("/", 1)[-1]]["properties"]
    assert vit_keys["embed_dim"]["type"] == "integer" and "tiny 16" in vit_keys["embed_dim"]["description"]
    assert vit_keys["mlp_ratio"]["type"] == "number" and vit_keys["coord_channels"]["type"] == "boolean"


@pytest.mark.parametrize("path", BUNDLED, ids=[p.name for p in BUNDLED])
def test_bundled_configs_fit_the_schema_and_the_parser(path: Path, schema: dict[str, Any]) -> None:
    jsonschema.validate(load_yaml(path.read_text()), schema)
    load_config(path)


@pytest.mark.parametrize(
    ("model", "valid"),
    [
        ({"name": "vit", "preset": "small", "overrides": {"num_heads": 2, "stride": None}}, True),
        ({"name": "unet", "overrides": {"channel_mults": [1, 2, 4]}}, True),
        ({"preset": "1b"}, True),  # name absent: weathermixer
        ({"name": "vit", "preset": "medium"}, False),
        ({"name": "vit", "overrides": {"token_hidden": 8}}, False),  # a WeatherMixer key
        ({"name": "unet", "overrides": {"groups": 1.5}}, False),
        ({"name": "graphcast"}, False),
    ],
)
def test_schema_and_parser_agree_on_model_sections(
    model: dict[str, Any], valid: bool, schema: dict[str, Any]
) -> None:
    raw = {"data": {"store": "x"}, "model": model}
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(raw))
    assert (not errors) is valid, errors
    if valid:
        parsed = parse_config(raw).model
        assert parsed.name == model.get("name", "weathermixer")
        assert parsed.overrides == model.get("overrides", {})  # only the keys given: the preset fills in
    else:
        with pytest.raises(ValueError, match=r"^config.*model"):
            parse_config(raw)


def test_unquoted_dates_and_yaml_exponents_parse(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "data: {store: x, train_period: [2020-01-01, 2020-01-31 18:00:00]}\noptim: {lr: 3e-4, min_lr: 1E-6}\n"
    )
    cfg = load_config(path)
    assert cfg.data.train_period == ["2020-01-01", "2020-01-31T18:00:00"]
    assert cfg.optim.lr == pytest.approx(3e-4) and cfg.optim.min_lr == pytest.approx(1e-6)


def test_config_show_documents_every_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show"]) == 0
    text = capsys.readouterr().out
    assert "  lr: float = 0.001  # peak learning rate" in text
    for name, cls in CONFIGS.items():
        assert f"# model.name: {name}" in text
        for f in dataclasses.fields(cls):
            assert f"    {f.name}: " in text, (name, f.name)
    assert "channel_mults: list[int] = [1, 2]  # UNetConfig.channel_mults; presets: tiny (1, 2)" in text
