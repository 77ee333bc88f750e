"""The plain-PyTorch twins (``twins.plain``: each jigsaw layer swapped for torch's own ops) equal
their jigsaw layers and models on one rank (fp32): outputs, input gradients and every parameter
gradient; uneven grids, pole / zeros / replicate modes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from jigsaw_earth.models import build_model
from torch import nn

from jigsaw_earth import layers as J
from jigsaw_earth import twins as T
from jigsaw_earth.bench.plain_forms import user_pad
from jigsaw_earth.layers.base import init_model, local_domain
from jigsaw_earth.twins.check import twin_errors
from jigsaw_earth.validation.checks_models import PAPER_TINY

TOL = 1e-5
MODEL_TOL = 3e-5
G = (9, 14)  # uneven: 9 rows, an even number of columns (across-the-pole needs one)


def _x(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _assert_equal(jig, *inputs, seed: int = 1, dead: str | None = None, tol: float = TOL) -> None:
    """``dead``: parameter names ending so have an analytically zero gradient (a bias that a later
    LayerNorm cancels): both sides' are rounding noise, checked to be tiny instead of equal."""
    init_model(jig, seed)
    twin = T.plain(jig)
    _assert_plain(twin)
    errors = twin_errors(jig, twin, inputs, seed=99)  # cotangent unlike any input
    assert len(errors) >= 2 + sum(1 for _ in jig.parameters()), errors
    grads = {name: p.grad.abs().max().item() for name, p in jig.named_parameters()}
    zero = {name for name in grads if dead and name.endswith(dead)}
    assert all(grads[name] <= 1e-5 * max(grads.values()) for name in zero), grads
    bad = {k: v for k, v in errors.items() if not v <= tol and k.removeprefix("grad:") not in zero}
    assert not bad, bad


def _assert_plain(twin: nn.Module) -> None:
    """No jigsaw layer and no sharded parameter is left in a twin."""
    assert not [m for m in twin.modules() if getattr(m, "jigsaw_layer", False)]
    assert not [n for n, p in twin.named_parameters() if hasattr(p, "_jigsaw_spec")]


FIELD_CASES = {
    "conv2d_zeros": lambda d: J.Conv2d(d, 3, 5, 3),
    "conv2d_pole": lambda d: J.Conv2d(d, 3, 5, 3, lat_mode="pole"),
    "conv2d_s2_d2_replicate_lonzeros": lambda d: J.Conv2d(
        d, 3, 4, 3, 2, 2, lat_mode="replicate", lon_mode="zeros"
    ),
    "conv2d_nobias": lambda d: J.Conv2d(d, 3, 5, 3, bias=False),
    "conv_transpose_pole_k4": lambda d: J.ConvTranspose2d(d, 3, 4, 4, 2, 1, (17, 27), "pole"),
    "downsample_conv_pole": lambda d: J.Downsample(d, 3, 6, lat_mode="pole"),
    "downsample_maxpool": lambda d: J.Downsample(d, 3, 6, "maxpool"),
    "upsample_transposed": lambda d: J.Upsample(d, 3, 2, out_grid=(17, 27)),
    "upsample_bilinear_pole": lambda d: J.Upsample(d, 3, 2, "bilinear", lat_mode="pole"),
    "upsample_nearest": lambda d: J.Upsample(d, 3, 3, "nearest", out_grid=(17, 27)),
    "patch_embed_pole": lambda d: J.PatchEmbed(d, 3, 8, 4, lat_mode="pole"),
    "patch_embed_overlap_zeros": lambda d: J.PatchEmbed(d, 3, 8, 4, 2, lat_mode="zeros"),
    "instance_norm_affine": lambda d: J.InstanceNorm(d, 3, affine=True),
    "group_norm": lambda d: J.GroupNorm(d, 3, 3),
    "layer_norm_channels_first": lambda d: J.LayerNorm(d, 3, channels_first=True),
}


@pytest.mark.parametrize("name", sorted(FIELD_CASES))
def test_field_layer_twin(name):
    _assert_equal(FIELD_CASES[name](local_domain(*G)), _x(2, 3, *G))


TOKEN_CASES = {
    "linear": lambda d: J.Linear(d, 8, 5),
    "mlp": lambda d: J.MLP(d, 8, 16, activation="silu"),
    "layer_norm": lambda d: J.LayerNorm(d, 8),
    "token_mixing": lambda d: J.TokenMixing(d, 7),
    "global_attention": lambda d: J.GlobalAttention(d, 8, 2),
    "local_attention_pole_relbias": lambda d: J.LocalAttention(d, 8, 2, 1, "pole", rel_pos_bias=True),
    "local_attention_zeros_r2": lambda d: J.LocalAttention(d, 8, 4, 2, "zeros", qkv_bias=False),
}


@pytest.mark.parametrize("name", sorted(TOKEN_CASES))
def test_token_layer_twin(name):
    _assert_equal(TOKEN_CASES[name](local_domain(*G)), _x(2, *G, 8))


@pytest.mark.parametrize("stride,overlap", [(None, "sum"), (2, "mean")])
def test_patch_recovery_twin(stride, overlap):
    tokens = J.PatchEmbed(local_domain(*G), 3, 8, 4, stride).out_domain
    jig = J.PatchRecovery(tokens, 8, 3, 4, stride, out_grid=G, overlap=overlap)
    _assert_equal(jig, _x(2, tokens.grid.n_lat, tokens.grid.n_lon, 8))


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
    dead = "token_mixing.b2" if overrides.get("final_norm") else None
    # a whole model accumulates float32 rounding: the patch embedding is GEMMs here and a
    # convolution in the twin (conv_ring), e.g. 1.1e-5 on the paper arrangement's static input
    inputs = (_x(2, 3, *grid), _x(2, *grid, seed=1), _x(2, 2, seed=2))
    _assert_equal(jig, *inputs, dead=dead, tol=MODEL_TOL)


def test_build_twin_is_the_plain_form_of_the_model():
    twin = T.build_twin("unet", (17, 28), 3, 2, 2, "tiny")
    _assert_plain(twin)
    assert isinstance(twin.encoder[0].convs[0], nn.Conv2d) and isinstance(
        twin.encoder[0].norms[0], nn.GroupNorm
    )


def test_loader_names_what_does_not_fit():
    jig = init_model(J.Conv2d(local_domain(*G), 3, 5, 3), 0)
    with pytest.raises(ValueError, match="weight"):
        T.load_jigsaw(T.plain(J.Conv2d(local_domain(*G), 3, 6, 3)), jig)
    with pytest.raises(ValueError, match="no place in the twin"):
        T.load_jigsaw(T.plain(jig), {**dict(jig.named_parameters()), "extra": torch.zeros(1)})


def test_a_layer_without_a_plain_form_is_named():
    class Custom(nn.Module):
        jigsaw_layer = True

    model = nn.Sequential(J.Linear(local_domain(*G), 8, 5), Custom())
    with pytest.raises(ValueError, match=r"1 \(Custom\)"):
        T.plain(model)


# ------------------------------------------------------------ the twin is what a user would write
def _user_conv(conv: nn.Conv2d, pad, modes):
    (top, bottom), (left, right) = pad
    return lambda x: F.conv2d(
        user_pad(x, top, bottom, left, right, *modes), conv.weight, conv.bias, conv.stride, 0, conv.dilation
    )


USER_FORMS = {  # jigsaw layer → (its conv-like twin module, the user's forward with the twin's weights)
    "conv2d_zeros": (
        lambda d: J.Conv2d(d, 3, 5, 3),
        lambda t: _user_conv(t, ((1, 1), (1, 1)), ("zeros", "periodic")),
    ),
    "conv2d_pole": (
        lambda d: J.Conv2d(d, 3, 5, 3, lat_mode="pole"),
        lambda t: _user_conv(t, ((1, 1), (1, 1)), ("pole", "periodic")),
    ),
    "conv2d_s2_d2_replicate_lonzeros": (
        lambda d: J.Conv2d(d, 3, 4, 3, 2, 2, lat_mode="replicate", lon_mode="zeros"),
        lambda t: _user_conv(t, ((2, 2), (2, 2)), ("replicate", "zeros")),
    ),
    "downsample_conv_pole": (
        lambda d: J.Downsample(d, 3, 6, lat_mode="pole"),
        lambda t: _user_conv(t.conv, ((1, 1), (1, 1)), ("pole", "periodic")),
    ),
    "patch_embed_pole": (  # 9 x 14 in 4 x 4 patches: 3 x 4 tokens, padded by (1, 2) rows, (1, 1) columns
        lambda d: J.PatchEmbed(d, 3, 8, 4, lat_mode="pole"),
        lambda t: lambda x: _user_conv(t, ((1, 2), (1, 1)), ("pole", "periodic"))(x).permute(0, 2, 3, 1),
    ),
    "upsample_transposed": (  # torch's size is 18 x 28: the output's first 17 x 27
        lambda d: J.Upsample(d, 3, 2, out_grid=(17, 27)),
        lambda t: lambda x: F.conv_transpose2d(x, t.conv.weight, t.conv.bias, 2)[..., :17, :27],
    ),
}


def _aten_ops(fn, x: torch.Tensor) -> tuple[list[str], torch.Tensor]:
    """The aten ops of one forward and backward of ``fn`` on ``x``, and its output."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    x = x.detach().requires_grad_()
    with Record() as rec:
        y = fn(x)
        y.backward(torch.ones_like(y))
    return rec.ops, y.detach()


@pytest.mark.parametrize("name", sorted(USER_FORMS))
def test_conv_like_twin_is_what_a_user_writes(name):
    """The twin of a convolution-like layer runs the aten ops, forward and backward, of
    ``nn.Conv2d``/``nn.ConvTranspose2d`` after ``F.pad`` (circular in longitude; zeros, replicate
    or the rows across the pole in latitude) on the same weights, bit for bit the same output:
    no cell-by-cell indexing of the serial reference (``pad_reference``)."""
    make, user = USER_FORMS[name]
    twin = T.plain(init_model(make(local_domain(*G)), 0))
    x = _x(2, 3, *G)
    twin_ops, y_twin = _aten_ops(twin, x)
    twin.zero_grad(set_to_none=True)  # the user's form accumulates into the same weights
    user_ops, y_user = _aten_ops(user(twin), x)
    assert twin_ops == user_ops
    assert not [op for op in twin_ops if "index" in op]
    assert torch.equal(y_twin, y_user)
