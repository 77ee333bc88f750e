"""The plain-PyTorch twins equal their jigsaw layers and models on one rank (fp32): outputs,
input gradients and every parameter gradient; uneven grids, pole / zeros / replicate modes."""

from __future__ import annotations

import pytest
import torch
from jigsaw_earth.models import build_model

from jigsaw_earth import layers as J
from jigsaw_earth import twins as T
from jigsaw_earth.distributed.halo import Halo, pad_reference
from jigsaw_earth.layers.base import init_model, local_domain
from jigsaw_earth.twins.check import twin_errors
from jigsaw_earth.validation.checks_models import PAPER_TINY

TOL = 1e-5
MODEL_TOL = 3e-5
G = (9, 14)  # uneven: 9 rows, an even number of columns (across-the-pole needs one)


def _x(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _assert_equal(jig, twin, *inputs, seed: int = 1, dead: str | None = None, tol: float = TOL) -> None:
    """``dead``: parameter names ending so have an analytically zero gradient (a bias that a later
    LayerNorm cancels): both sides' are rounding noise, checked to be tiny instead of equal."""
    init_model(jig, seed)
    T.load_jigsaw(twin, jig)
    errors = twin_errors(jig, twin, inputs, seed=99)  # cotangent unlike any input
    assert len(errors) >= 2 + sum(1 for _ in jig.parameters()), errors
    grads = {name: p.grad.abs().max().item() for name, p in jig.named_parameters()}
    zero = {name for name in grads if dead and name.endswith(dead)}
    assert all(grads[name] <= 1e-5 * max(grads.values()) for name in zero), grads
    bad = {k: v for k, v in errors.items() if not v <= tol and k.removeprefix("grad:") not in zero}
    assert not bad, bad


@pytest.mark.parametrize("lat_mode", ["zeros", "replicate", "pole"])
@pytest.mark.parametrize("lon", [(2, 3), (15, 1)])
def test_sphere_pad_matches_reference(lat_mode, lon):
    x = _x(2, 3, *G)
    want = pad_reference(x, Halo((2, 1), lon, lat_mode, "periodic"))
    assert torch.equal(T.sphere_pad(x, (2, 1), lon, lat_mode, "periodic"), want)
    if lat_mode != "pole":
        want = pad_reference(x, Halo((1, 2), lon, lat_mode, "zeros"))
        assert torch.equal(T.sphere_pad(x, (1, 2), lon, lat_mode, "zeros"), want)


FIELD_CASES = {
    "conv2d_zeros": (lambda d: J.Conv2d(d, 3, 5, 3), lambda: T.Conv2d(3, 5, 3)),
    "conv2d_pole": (
        lambda d: J.Conv2d(d, 3, 5, 3, lat_mode="pole"),
        lambda: T.Conv2d(3, 5, 3, lat_mode="pole"),
    ),
    "conv2d_s2_d2_replicate_lonzeros": (
        lambda d: J.Conv2d(d, 3, 4, 3, 2, 2, lat_mode="replicate", lon_mode="zeros"),
        lambda: T.Conv2d(3, 4, 3, 2, 2, lat_mode="replicate", lon_mode="zeros"),
    ),
    "conv2d_nobias": (lambda d: J.Conv2d(d, 3, 5, 3, bias=False), lambda: T.Conv2d(3, 5, 3)),
    "conv_transpose_pole_k4": (
        lambda d: J.ConvTranspose2d(d, 3, 4, 4, 2, 1, (17, 27), "pole"),
        lambda: T.ConvTranspose2d(3, 4, 4, 2, 1, (17, 27), "pole"),
    ),
    "downsample_conv_pole": (
        lambda d: J.Downsample(d, 3, 6, lat_mode="pole"),
        lambda: T.Downsample(3, 6, lat_mode="pole"),
    ),
    "downsample_maxpool": (lambda d: J.Downsample(d, 3, 6, "maxpool"), lambda: T.Downsample(3, 6, "maxpool")),
    "upsample_transposed": (
        lambda d: J.Upsample(d, 3, 2, out_grid=(17, 27)),
        lambda: T.Upsample(G, 3, 2, out_grid=(17, 27)),
    ),
    "upsample_bilinear_pole": (
        lambda d: J.Upsample(d, 3, 2, "bilinear", lat_mode="pole"),
        lambda: T.Upsample(G, 3, 2, "bilinear", lat_mode="pole"),
    ),
    "upsample_nearest": (
        lambda d: J.Upsample(d, 3, 3, "nearest", out_grid=(17, 27)),
        lambda: T.Upsample(G, 3, 3, "nearest", out_grid=(17, 27)),
    ),
    "patch_embed_pole": (
        lambda d: J.PatchEmbed(d, 3, 8, 4, lat_mode="pole"),
        lambda: T.PatchEmbed(G, 3, 8, 4, lat_mode="pole"),
    ),
    "patch_embed_overlap_zeros": (
        lambda d: J.PatchEmbed(d, 3, 8, 4, 2, lat_mode="zeros"),
        lambda: T.PatchEmbed(G, 3, 8, 4, 2, lat_mode="zeros"),
    ),
    "instance_norm_affine": (
        lambda d: J.InstanceNorm(d, 3, affine=True),
        lambda: T.InstanceNorm(3, affine=True),
    ),
    "group_norm": (lambda d: J.GroupNorm(d, 3, 3), lambda: T.GroupNorm(3, 3)),
    "layer_norm_channels_first": (
        lambda d: J.LayerNorm(d, 3, channels_first=True),
        lambda: T.LayerNorm(3, channels_first=True),
    ),
}


@pytest.mark.parametrize("name", sorted(FIELD_CASES))
def test_field_layer_twin(name):
    jig, twin = FIELD_CASES[name]
    _assert_equal(jig(local_domain(*G)), twin(), _x(2, 3, *G))


TOKEN_CASES = {
    "linear": (lambda d: J.Linear(d, 8, 5), lambda: T.Linear(8, 5)),
    "mlp": (lambda d: J.MLP(d, 8, 16, activation="silu"), lambda: T.MLP(8, 16, activation="silu")),
    "layer_norm": (lambda d: J.LayerNorm(d, 8), lambda: T.LayerNorm(8)),
    "token_mixing": (lambda d: J.TokenMixing(d, 7), lambda: T.TokenMixing(G, 7)),
    "global_attention": (lambda d: J.GlobalAttention(d, 8, 2), lambda: T.GlobalAttention(8, 2)),
    "local_attention_pole_relbias": (
        lambda d: J.LocalAttention(d, 8, 2, 1, "pole", rel_pos_bias=True),
        lambda: T.LocalAttention(G, 8, 2, 1, "pole", rel_pos_bias=True),
    ),
    "local_attention_zeros_r2": (
        lambda d: J.LocalAttention(d, 8, 4, 2, "zeros", qkv_bias=False),
        lambda: T.LocalAttention(G, 8, 4, 2, "zeros", qkv_bias=False),
    ),
}


@pytest.mark.parametrize("name", sorted(TOKEN_CASES))
def test_token_layer_twin(name):
    jig, twin = TOKEN_CASES[name]
    _assert_equal(jig(local_domain(*G)), twin(), _x(2, *G, 8))


@pytest.mark.parametrize("stride,overlap", [(None, "sum"), (2, "mean")])
def test_patch_recovery_twin(stride, overlap):
    tokens = J.PatchEmbed(local_domain(*G), 3, 8, 4, stride).out_domain
    jig = J.PatchRecovery(tokens, 8, 3, 4, stride, out_grid=G, overlap=overlap)
    twin = T.PatchRecovery(8, 3, 4, stride, G, overlap)
    _assert_equal(jig, twin, _x(2, tokens.grid.n_lat, tokens.grid.n_lon, 8))


MODEL_CASES = [
    ("vit", (17, 24), {}),
    ("vit", (16, 24), dict(stride=2, local_every=1, lat_mode="zeros", pos_encoding="sincos")),
    ("unet", (17, 28), {}),
    ("unet", (16, 24), dict(lat_mode="zeros", down="avgpool", up="bilinear")),
    ("weathermixer", (17, 24), {}),
    ("weathermixer", (16, 24), dict(stride=2, lat_mode="zeros")),
    ("weathermixer", (17, 24), PAPER_TINY),  # the paper's arrangement: 1 x 8 patches, concat, linear residual
]


@pytest.mark.parametrize("name,grid,overrides", MODEL_CASES)
def test_model_twin(name, grid, overrides):
    jig = build_model(name, local_domain(*grid), 3, 2, 2, "tiny", **overrides)
    twin = T.build_twin(name, grid, 3, 2, 2, "tiny", **overrides)
    dead = "token_mixing.b2" if overrides.get("final_norm") else None
    # a whole model accumulates float32 rounding: the patch embedding is GEMMs here and a
    # convolution in the twin (conv_ring), e.g. 1.1e-5 on the paper arrangement's static input
    inputs = (_x(2, 3, *grid), _x(2, *grid, seed=1), _x(2, 2, seed=2))
    _assert_equal(jig, twin, *inputs, dead=dead, tol=MODEL_TOL)


def test_loader_names_what_does_not_fit():
    jig = init_model(J.Conv2d(local_domain(*G), 3, 5, 3), 0)
    with pytest.raises(ValueError, match="weight"):
        T.load_jigsaw(T.Conv2d(3, 6, 3), jig)
    with pytest.raises(ValueError, match="no place in the twin"):
        T.load_jigsaw(T.Conv2d(3, 5, 3), {**dict(jig.named_parameters()), "extra": torch.zeros(1)})
