"""One registry of forecast models: a name → the model class, its config dataclass and its presets.

Everything that needs a model by name — the config schema, ``train``, ``predict``, resume,
``export``, ``plan``, ``model summary``, the validator and the bench — asks this registry. A
model enters it in one of three ways:

* ``register_model(name, model_cls, config_cls, presets)`` (the built-ins, at the end of this
  module, with their configs and presets from ``presets.py``);
* an installed package's entry point in the group ``jigsaw_earth.models``: the entry point's name
  is the model name and its object a model class (with ``config_cls`` and ``presets`` attributes,
  as below) or a function that calls ``register_model`` itself;
* an import path ``package.module:Class`` given as ``model.name``: the class is imported and
  described by its attributes ``config_cls`` (a dataclass; absent: no options) and ``presets``
  (``{preset: {field: value}}``; absent: one preset ``default``).

The model contract (docs/models.md, "Write your own model"): ``model_cls(domain, n_state,
n_static, n_time, cfg)`` with ``cfg`` the config instance (``None`` without a config class), and
``forward(state (B, n_state, h, w), static (n_static, h, w), time (B, n_time)) → (B, n_state, h,
w)`` on this rank's tile.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from jigsaw_earth.models.presets import PRESETS, UNetConfig, ViTConfig, WeatherMixerConfig
from torch import nn

__all__ = [
    "ENTRY_POINT_GROUP",
    "ModelEntry",
    "build_model",
    "make_config",
    "model_entry",
    "model_from_config",
    "model_names",
    "register_model",
]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "jigsaw_earth.models"


def _nearest(name: str, options: list[str]) -> str:
    close = difflib.get_close_matches(name, options, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _import(path: str, what: str) -> Any:
    """The object at ``package.module:attr``; a one-line error naming the path otherwise."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{what} {path!r}: write it as package.module:ClassName")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(
            f"{what} {path!r}: cannot import module {module_name!r} ({err}); install the package or put it "
            "on PYTHONPATH"
        ) from None
    try:
        return getattr(module, attr)
    except AttributeError:
        names = [n for n in vars(module) if not n.startswith("_")]
        raise ValueError(
            f"{what} {path!r}: module {module_name!r} has no {attr!r}{_nearest(attr, names)}"
        ) from None


@dataclass
class ModelEntry:
    """A registered model. ``model_cls`` may be ``package.module:Class`` (imported on use)."""

    name: str
    model_cls: type[nn.Module] | str
    config_cls: type | None
    presets: Mapping[str, Mapping[str, Any]]

    def cls(self) -> type[nn.Module]:
        """The model class (imported on first use: each model pulls in its own layers)."""
        if isinstance(self.model_cls, str):
            self.model_cls = _import(self.model_cls, f"model {self.name}")
        return self.model_cls

    @property
    def default_preset(self) -> str:
        return "tiny" if "tiny" in self.presets else next(iter(self.presets))

    @property
    def fields(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self.config_cls)] if self.config_cls else []

    def config(self, preset: str | None = None, **overrides: Any) -> Any:
        """The config at ``preset`` with ``overrides``; unknown presets and options are one-line errors."""
        preset = self.default_preset if preset is None else preset
        if preset not in self.presets:
            options = list(self.presets)
            raise ValueError(
                f"preset {preset!r} for {self.name}: use one of {options}{_nearest(preset, options)}"
            )
        for key in overrides:
            if key not in self.fields:
                raise ValueError(
                    f"{self.name} has no option {key!r}{_nearest(key, self.fields)}; options: "
                    f"{', '.join(self.fields) or 'none'}"
                )
        if self.config_cls is None:
            return None
        values = {**self.presets[preset], **overrides}
        for key, value in values.items():
            if isinstance(value, list):  # YAML lists: tuples in the (frozen, hashable) config
                values[key] = tuple(value)
        return self.config_cls(**values)


_REGISTRY: dict[str, ModelEntry] = {}
_ENTRY_POINTS_LOADED = False


def _entry(
    name: str,
    model_cls: type[nn.Module] | str,
    config_cls: type | None,
    presets: Mapping[str, Mapping[str, Any]] | None,
) -> ModelEntry:
    if config_cls is not None and not dataclasses.is_dataclass(config_cls):
        raise ValueError(f"model {name}: config_cls {config_cls!r} must be a dataclass")
    entry = ModelEntry(name, model_cls, config_cls, dict(presets or {"default": {}}))
    for preset, values in entry.presets.items():
        unknown = [k for k in values if k not in entry.fields]
        if unknown:
            raise ValueError(f"model {name}: preset {preset!r} sets unknown options {unknown}")
    return entry


def register_model(
    name: str,
    model_cls: type[nn.Module] | str,
    config_cls: type | None = None,
    presets: Mapping[str, Mapping[str, Any]] | None = None,
) -> ModelEntry:
    """Add a model under ``name`` (registering the same name again must name the same class)."""
    if not name[:1].isalpha() or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"model name {name!r}: use letters, digits, '-' and '_', starting with a letter")
    old = _REGISTRY.get(name)
    if old is not None and old.model_cls is not model_cls and str(old.model_cls) != str(model_cls):
        raise ValueError(
            f"model name {name!r} is already registered for {old.model_cls!r}; pick another name"
        )
    _REGISTRY[name] = _entry(name, model_cls, config_cls, presets)
    return _REGISTRY[name]


def _from_class(cls: Any, name: str) -> ModelEntry:
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ValueError(f"model {name!r} is {cls!r}, not an nn.Module class")
    return _entry(name, cls, getattr(cls, "config_cls", None), getattr(cls, "presets", None))


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            if isinstance(obj, type):
                register_model(ep.name, obj, getattr(obj, "config_cls", None), getattr(obj, "presets", None))
            else:
                obj()
        except Exception as err:  # a broken plug-in must not break the built-in models
            log.warning("model entry point %s = %s not loaded: %s", ep.name, ep.value, err)
            continue
        if ep.name not in _REGISTRY:
            log.warning("model entry point %s = %s registered no model named %s", ep.name, ep.value, ep.name)


def model_names() -> tuple[str, ...]:
    """Registered model names: the built-ins first, then installed entry points."""
    _load_entry_points()
    return tuple(_REGISTRY)


def model_entry(name: str) -> ModelEntry:
    """The registered model ``name``, or the class at ``package.module:Class``."""
    names = model_names()
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name:
        cls = _import(name, "model.name")
        for entry in _REGISTRY.values():  # a class that registered itself keeps its name and presets
            if entry.model_cls is cls:
                return entry
        return _from_class(cls, name)
    raise ValueError(
        f"model {name!r}: use one of {', '.join(names)}{_nearest(name, list(names))}, or give your own "
        "model as package.module:ClassName"
    )


def build_model(
    name: str,
    domain: Any,
    n_state: int,
    n_static: int,
    n_time: int,
    preset: str | None = None,
    **overrides: Any,
) -> nn.Module:
    """Model ``name`` (registered or ``package.module:Class``) at ``preset`` with config ``overrides``."""
    entry = model_entry(name)
    return entry.cls()(domain, n_state, n_static, n_time, entry.config(preset, **overrides))


def model_from_config(model_cfg: Any, domain: Any, n_state: int, n_static: int, n_time: int = 4) -> nn.Module:
    """The model of a config's ``model`` section on ``domain``: what train, resume and predict build."""
    return build_model(
        model_cfg.name, domain, n_state, n_static, n_time, model_cfg.preset, **model_cfg.overrides
    )


def make_config(model: str, preset: str = "tiny", **overrides: Any) -> Any:
    """The config of ``model`` at ``preset`` with ``overrides`` applied; unknown names are errors."""
    return model_entry(model).config(preset, **overrides)


# The one place that names each built-in model: its class, config and presets.
for _name, _config in (("vit", ViTConfig), ("unet", UNetConfig), ("weathermixer", WeatherMixerConfig)):
    _cls = _config.__name__.removesuffix("Config")
    register_model(_name, f"jigsaw_earth.models.{_name}:{_cls}", _config, PRESETS[_name])
