"""What ``jigsaw-earth bench layers`` and ``bench models`` measure: each case builds a jigsaw
module on a domain (its plain twin is derived from it on one rank: ``twins.plain``) and the
global inputs (default sizes; ``quick`` sizes for CI; ``large`` sizes for a GPU, where the
default ones measure launch overhead)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from .. import layers as J
from .. import twins as T
from ..layers.base import Domain
from ..models import build_model

__all__ = ["LAYER_CASES", "MODEL_CASES", "Case", "select"]


@dataclass(frozen=True)
class Case:
    """``jigsaw(domain)`` on ``grid``; ``inputs(batch)`` are the global tensors and ``layouts`` says
    how each is split over a mesh (``field``, ``tokens``, ``static`` or ``whole``); the tag
    ``serial`` keeps a case off the meshes; ``same`` times a deep copy of the module as the twin
    (the noise floor)."""

    name: str
    grid: tuple[int, int]
    jigsaw: Callable[[Domain], nn.Module]
    shapes: tuple[tuple[int, ...], ...]
    layouts: tuple[str, ...]
    note: str = ""
    tags: tuple[str, ...] = field(default=())

    def inputs(self, seed: int = 0) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        return [torch.randn(s, generator=gen) for s in self.shapes]


def _field(name, grid, c, jig, note, b=1) -> Case:
    return Case(name, grid, jig, ((b, c, *grid),), ("field",), note)


def _tokens(name, grid, c, jig, note, b=1) -> Case:
    return Case(name, grid, jig, ((b, *grid, c),), ("tokens",), note)


SIZES = ("quick", "default", "large")

# size: (field grid, conv channels, token grid, token channels, small token grid, patch input channels)
_LAYER_SIZES = {
    "quick": ((16, 32), 8, (8, 16), 16, (4, 8), 4),
    "default": ((64, 128), 64, (32, 64), 128, (16, 32), 32),
    "large": ((256, 512), 128, (64, 128), 256, (32, 64), 64),  # 8192 / 2048 tokens
}


def _check_size(size: str) -> None:
    if size not in SIZES:
        raise ValueError(f"bench size {size!r}: use one of {', '.join(SIZES)}")


def layer_cases(size: str = "default") -> list[Case]:
    """Default sizes; quick: the same layers, small (CI smoke); large: for a GPU."""
    _check_size(size)
    quick = size == "quick"
    g, c, t, d, t512, cin = _LAYER_SIZES[size]
    p = 4
    tok = (g[0] // p, g[1] // p)
    coarse = (g[0] // 2, g[1] // 2)
    cases = [
        _field(f"conv2d_{m}", g, c, lambda dm, m=m: J.Conv2d(dm, c, c, 3, lat_mode=m),
               f"k3 {c}->{c}, lon periodic, lat {m}")
        for m in ("zeros", "pole")
    ]  # fmt: skip
    for n, tg in ((t512[0] * t512[1], t512), (t[0] * t[1], t)):
        cases.append(_tokens(f"global_attention_{n}", tg, d, lambda dm: J.GlobalAttention(dm, d, 4),
                             f"{n} tokens, dim {d}, 4 heads"))  # fmt: skip
    groups = 4 if quick else 16
    cases += [
        _field("group_norm", g, c, lambda dm: J.GroupNorm(dm, groups, c), f"{groups} groups, {c} channels"),
        _field("patch_embed", g, cin, lambda dm: J.PatchEmbed(dm, cin, d, p, lat_mode="pole"),
               f"{cin}->{d}, patch {p}, pole"),
        _tokens("patch_recovery", tok, d, lambda dm: J.PatchRecovery(dm, d, cin, p, out_grid=g),
                f"{d}->{cin}, patch {p}"),
        _field("downsample", g, c, lambda dm: J.Downsample(dm, c, 2 * c, lat_mode="pole"),
               f"conv k3 stride 2, {c}->{2 * c}"),
        _field("upsample", coarse, 2 * c, lambda dm: J.Upsample(dm, 2 * c, c, out_grid=g),
               f"transposed k2 s2, {2 * c}->{c}"),
        _tokens("linear", t, d, lambda dm: J.Linear(dm, d, d), f"{d}->{d}"),
        _tokens("mlp", t, d, lambda dm: J.MLP(dm, d, 4 * d), f"{d}->{4 * d}->{d}"),
        _tokens("token_mixing", t, d, lambda dm: J.TokenMixing(dm, t[0] * t[1] // 4),
                f"{t[0] * t[1]} tokens -> {t[0] * t[1] // 4}"),
        _tokens("layer_norm", t, d, lambda dm: J.LayerNorm(dm, d), f"{d} channels"),
        _tokens("local_attention", t, d, lambda dm: J.LocalAttention(dm, d, 4, 1, "pole"),
                f"3x3 window, dim {d}, 4 heads, pole"),
    ]  # fmt: skip
    # the same plain module against itself: the noise floor of the run (ratios ~1 by construction)
    note = f"twin MLP {d}->{4 * d}->{d} timed against itself"
    same = Case("noise_floor", t, lambda dm: T.plain(J.MLP(dm, d, 4 * d)), ((1, *t, d),), ("tokens",))
    cases.append(dataclasses.replace(same, note=note, tags=("serial", "same")))
    return cases


N_STATE, N_STATIC, N_TIME = 8, 2, 4

MODEL_CONFIGS = {
    # name: (grid, quick grid, preset, overrides, quick overrides); large sizes in _LARGE_MODELS
    "vit": ((64, 128), (16, 32), "small", dict(embed_dim=128, depth=4, num_heads=4, local_radius=1),
            dict(embed_dim=16, depth=2, num_heads=2, local_radius=1)),
    "unet": ((128, 256), (16, 32), "small", dict(base_channels=16, channel_mults=(1, 2, 4), groups=8),
             dict(base_channels=4, channel_mults=(1, 2), groups=2)),
    "weathermixer": ((128, 256), (16, 32), "small",
                     dict(embed_dim=128, depth=4, channel_hidden=512, token_hidden=256, patch=8),
                     dict(embed_dim=16, depth=2, channel_hidden=32, token_hidden=16, patch=4)),
}  # fmt: skip


_LARGE_MODELS = {
    "vit": ((256, 512), dict(embed_dim=384, depth=6, num_heads=6, local_radius=1)),
    "unet": ((256, 512), dict(base_channels=32, channel_mults=(1, 2, 4), groups=8)),
    "weathermixer": (
        (256, 512),
        dict(embed_dim=384, depth=6, channel_hidden=1536, token_hidden=1024, patch=8),
    ),
}


def model_cases(size: str = "default") -> list[Case]:
    _check_size(size)
    cases = []
    for name, (grid, qgrid, preset, over, qover) in MODEL_CONFIGS.items():
        g, o = {"quick": (qgrid, qover), "default": (grid, over), "large": _LARGE_MODELS[name]}[size]
        desc = ", ".join(f"{k}={v}" for k, v in o.items())
        cases.append(
            Case(
                name,
                g,
                lambda dm, n=name, o=o, p=preset: build_model(n, dm, N_STATE, N_STATIC, N_TIME, p, **o),
                ((1, N_STATE, *g), (N_STATIC, *g), (1, N_TIME)),
                ("field", "static", "whole"),
                f"{preset} preset with {desc}; {N_STATE} state, {N_STATIC} static, {N_TIME} time channels",
            )
        )
    return cases


LAYER_CASES = tuple(c.name for c in layer_cases("quick"))
MODEL_CASES = tuple(MODEL_CONFIGS)


def select(cases: list[Case], only: list[str] | None) -> list[Case]:
    """The cases named in ``only`` (a name or a prefix, e.g. ``conv2d``); all when empty."""
    if not only:
        return cases
    names = [c.name for c in cases]
    chosen = [c for c in cases if any(c.name == o or c.name.startswith(o) for o in only)]
    unknown = [o for o in only if not any(n == o or n.startswith(o) for n in names)]
    if unknown:
        raise ValueError(f"--only {','.join(unknown)}: no such case; choose from {', '.join(names)}")
    return chosen
