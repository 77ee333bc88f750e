"""Convolution, resampling and patch layers: sharded against serial on every mesh, and input errors."""

from __future__ import annotations

import pytest
import torch

from jigsaw_earth.distributed.mesh import MeshShape
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.layers.base import local_domain
from jigsaw_earth.layers.conv import Conv2d
from jigsaw_earth.layers.conv_transpose import ConvTranspose2d
from jigsaw_earth.layers.patch import PatchEmbed, PatchRecovery, patch_layout
from jigsaw_earth.layers.resample import Downsample, Upsample
from jigsaw_earth.validation.registry import run_checks

from .conftest import assert_records_pass, slow_unless

OPS = ["conv", "downsample", "upsample", "patch_embed", "patch_recovery"]
MESHES = slow_unless([(1, 2), (2, 1), (2, 2), (1, 4), (3, 1)], ((2, 2), (3, 1)))  # 1x3: `validate`


@pytest.fixture(scope="module", params=MESHES, ids=lambda m: f"{m[0]}x{m[1]}")
def records(request) -> list[dict]:
    lat, lon = request.param
    return spawn(MeshShape(1, lat, lon), run_checks, OPS)[0]


def test_every_op_checked(records):
    seen = {r["op"].split(".")[0] for r in records}
    assert seen == set(OPS), f"ops without records: {set(OPS) - seen}"


def test_records_pass(records):
    assert_records_pass(records)
    assert all(r["expected_bytes"] is not None for r in records)
    assert any(r["comm_bytes"] > 0 for r in records)


# ------------------------------------------------------------------------- serial, errors
def test_patch_layout():
    assert patch_layout(721, 4, 4) == (181, (1, 2))
    assert patch_layout(64, 4, 4) == (16, (0, 0))
    assert patch_layout(33, 4, 2) == (16, (0, 1))
    assert patch_layout(3, 4, 4) == (1, (0, 1))
    with pytest.raises(ValueError, match="stride 5 > patch 4"):
        patch_layout(10, 4, 5)


def test_output_grids():
    d = local_domain(33, 64)
    assert Downsample(d, 2, mode="conv").out_domain.grid.n_lat == 17
    assert Downsample(d, 2, mode="avgpool").out_domain.grid.n_lat == 17
    assert Upsample(local_domain(17, 32), 2, out_grid=(33, 64)).out_domain.grid.n_lat == 33
    assert Conv2d(d, 2, 3, 3, stride=2).out_domain.grid.n_lon == 32
    assert PatchEmbed(local_domain(721, 1440), 1, 4, 4).out_domain.grid.n_lat == 181


def test_bad_inputs():
    d = local_domain(8, 12)
    conv = Conv2d(d, 3, 4, 3)
    with pytest.raises(ValueError, match=r"Conv2d expects .*\(B, 3, 8, 12\).*got \(2, 2, 8, 12\)"):
        conv(torch.zeros(2, 2, 8, 12))
    with pytest.raises(ValueError, match="got \\(2, 3, 8, 11\\)"):
        conv(torch.zeros(2, 3, 8, 11))
    with pytest.raises(ValueError, match="padding 'valid'"):
        Conv2d(d, 3, 4, 3, padding="valid")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not fit"):
        Conv2d(d, 3, 4, 11, padding=0)
    with pytest.raises(ValueError, match="lat_mode 'polar'"):
        Conv2d(d, 3, 4, 3, lat_mode="polar")(torch.zeros(1, 3, 8, 12))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Downsample mode 'area'"):
        Downsample(d, 3, mode="area")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Upsample mode 'cubic'"):
        Upsample(d, 3, mode="cubic")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kernel_size >= stride"):
        ConvTranspose2d(d, 3, 4, 2, 3)
    with pytest.raises(ValueError, match="Upsample expects"):
        Upsample(d, 3)(torch.zeros(1, 3, 7, 12))
    with pytest.raises(ValueError, match="needs out_grid"):
        PatchRecovery(local_domain(2, 3), 8, 2, 4)
    with pytest.raises(ValueError, match="has 3x4 tokens, but domain_tokens has 2x3"):
        PatchRecovery(local_domain(2, 3), 8, 2, 4, out_grid=(12, 16))
    rec = PatchRecovery(local_domain(3, 4), 8, 2, 4, out_grid=(12, 16))
    with pytest.raises(ValueError, match=r"token tile \(B, 3, 4, 8\)"):
        rec(torch.zeros(1, 8, 3, 4))


def test_autocast_and_checkpoint_serial():
    d = local_domain(9, 14)
    layers = [
        Conv2d(d, 3, 4, 3),
        Downsample(d, 3, 4, mode="avgpool"),
        Upsample(d, 3, 2, mode="bilinear", lat_mode="pole"),
        Upsample(d, 3, 2, mode="transposed"),
        PatchEmbed(d, 3, 8, 3, 2),
    ]
    x = torch.randn(2, 3, 9, 14, requires_grad=True)
    for layer in layers:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = layer(x)
        y.float().sum().backward()
        assert y.dtype in (torch.bfloat16, torch.float32)
        ref = layer(x)
        assert (y.float() - ref).abs().max() <= 0.05 * ref.abs().max()
        z = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
        assert torch.equal(z, ref)


def _grads(fn, x, params):
    x = x.detach().requires_grad_()
    y = fn(x)
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(5))
    grads = torch.autograd.grad(y, [x, *params], gy)
    return y, grads


@pytest.mark.parametrize("lat_mode", ["zeros", "pole"])
def test_one_rank_is_the_plain_op(lat_mode, monkeypatch):
    """On one rank the layers are torch's own kernels on the padded input: outputs and weight
    gradients bit-identical to the plain-torch twin holding the same weights, input gradients
    equal up to the order in which a cell's halo copies are added (corners across the pole)."""
    import torch.nn.functional as F

    from jigsaw_earth.distributed import conv_ring
    from jigsaw_earth.distributed.halo import Halo, pad_reference

    x = torch.randn(2, 4, 8, 12)
    conv = Conv2d(local_domain(8, 12), 4, 6, 3, lat_mode=lat_mode)
    w, b = conv.weight, conv.bias
    twin = lambda t: F.conv2d(pad_reference(t, Halo.uniform(1, lat_mode)), w, b)  # noqa: E731
    (ya, ga), (yb, gb) = _grads(conv, x, [w, b]), _grads(twin, x, [w, b])
    assert torch.equal(ya, yb) and all(torch.equal(p, q) for p, q in zip(ga[1:], gb[1:]))
    torch.testing.assert_close(ga[0], gb[0], rtol=0, atol=1e-6)

    # the patch embedding is GEMMs on the patch rows (conv_ring: faster than oneDNN's convolution
    # there): the plain convolution's values up to float32 rounding, the GEMM form's exactly
    embed = PatchEmbed(local_domain(8, 12), 4, 5, 4, lat_mode=lat_mode)
    w, b = embed.weight, embed.bias
    twin = lambda t: F.conv2d(t, w.T.reshape(5, 4, 4, 4), b, 4).permute(0, 2, 3, 1)  # noqa: E731
    (ya, ga), (yb, gb) = _grads(embed, x, [w, b]), _grads(twin, x, [w, b])
    torch.testing.assert_close(ya, yb, rtol=1e-5, atol=1e-5)
    for p, q in zip(ga, gb):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-5)

    def gemm(t):
        rows = t.view(2, 4, 2, 4, 3, 4).permute(0, 2, 4, 1, 3, 5).reshape(12, 64)
        return torch.addmm(b, rows, w).view(2, 2, 3, 5)

    (yc, gc) = _grads(gemm, x, [w, b])
    assert torch.equal(ya, yc) and all(torch.equal(p, q) for p, q in zip(ga, gc))
    # on a GPU (no GEMM form: device.patch_conv_as_gemm) it is the plain convolution, bit for bit
    monkeypatch.setattr(conv_ring, "patch_conv_as_gemm", lambda device: False)
    (yd, gd) = _grads(embed, x, [w, b])
    assert torch.equal(yd, yb) and all(torch.equal(p, q) for p, q in zip(gd, gb))

    up = Upsample(local_domain(8, 12), 4, 3, "transposed", lat_mode=lat_mode)
    w, b = up.conv.weight, up.conv.bias
    twin = lambda t: F.conv_transpose2d(t, w, b, 2)  # noqa: E731
    (ya, ga), (yb, gb) = _grads(up, x, [w, b]), _grads(twin, x, [w, b])
    assert torch.equal(ya, yb) and all(torch.equal(p, q) for p, q in zip(ga, gb))


def test_one_rank_window_inside_the_tile_is_a_view():
    from jigsaw_earth.distributed.halo import gather_windows, scatter_add_windows

    d = local_domain(8, 12)
    x = torch.randn(2, 3, 8, 12)
    win = gather_windows(x, d.grid, ((1, 7, 2, 12),), d.axis)
    assert win.data_ptr() == x[..., 1:, 2:].data_ptr() and win.shape == (2, 3, 6, 10)
    assert scatter_add_windows(x, d.grid, ((0, 8, 0, 12),), d.axis) is x
