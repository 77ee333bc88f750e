"""Dense layers (MLP, norms, token mixing, dropout): validator checks on every mesh, unit tests.

The validator part spawns each mesh once (module scope) and asserts every record of every op;
the unit tests run in-process (dropout masks and parameter init need no communication, so the
tiles of a mesh are checked one rank at a time against the serial module).
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape, parse_mesh
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.layers import (
    MLP,
    Domain,
    Dropout,
    GroupNorm,
    InstanceNorm,
    LayerNorm,
    TokenMixing,
    init_model,
    local_domain,
    set_dropout_step,
)
from jigsaw_earth.layers.base import spec_of
from jigsaw_earth.layers.dropout import dropout_mask
from jigsaw_earth.validation.layer_harness import scatter_tile
from jigsaw_earth.validation.registry import run_checks

from .conftest import assert_records_pass, slow_unless

OPS = ("mlp", "layer_norm", "group_norm", "instance_norm", "token_mixing", "dropout")
MESHES = slow_unless(["1x2", "2x1", "2x2", "1x4", "3x1", "1x3"], ("2x2", "1x3"))


@functools.cache
def _records(mesh: str) -> tuple[dict, ...]:
    return tuple(spawn(parse_mesh(mesh), run_checks, list(OPS))[0])


@pytest.fixture(scope="module")
def records():
    return _records


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("mesh", MESHES)
def test_validator(records, mesh: str, op: str) -> None:
    mine = [r for r in records(mesh) if r["op"].split(".")[0] == op]
    assert mine, f"no {op} records on mesh {mesh}"
    assert_records_pass(mine)
    assert all(r["comm_bytes"] > 0 for r in mine if r["expected_bytes"]), "communication not measured"


# ------------------------------------------------------------------------ dropout, in-process
def _rank_domains(shape: tuple[int, int], grid: tuple[int, int]) -> list[Domain]:
    """The domain of every rank of a ``lat × lon`` mesh (no process group: geometry only)."""
    mesh_shape = MeshShape(1, *shape)
    return [Domain.create(DomainMesh(mesh_shape, rank=k), *grid) for k in range(mesh_shape.world_size)]


@pytest.mark.parametrize("layout", ["tokens", "field"])
@pytest.mark.parametrize("shape", [(2, 2), (3, 1), (1, 4)])
def test_dropout_mask_is_mesh_invariant(shape: tuple[int, int], layout: str) -> None:
    grid = (7, 10)
    full = init_model(Dropout(local_domain(*grid), 0.4, layout), seed=3)
    full.step = 5
    x = torch.randn((2, *grid, 3) if layout == "tokens" else (2, 3, *grid))
    want = full(x)
    for d in _rank_domains(shape, grid):
        m = init_model(Dropout(d, 0.4, layout), seed=3)
        m.step = 5
        k = d.index
        got = m(scatter_tile(x, d.grid, k, layout))
        assert torch.equal(got, scatter_tile(want, d.grid, k, layout)), f"rank {k} of {shape}"


def test_dropout_keep_rate_and_scale() -> None:
    p = 0.3
    m = init_model(Dropout(local_domain(32, 64), p, "tokens"), seed=0)
    x = torch.rand(4, 32, 64, 16) + 1.0
    y = m(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.01
    assert torch.allclose(y[kept], x[kept] / (1 - p))
    m.eval()
    assert torch.equal(m(x), x)


def test_dropout_mask_depends_on_step_seed_key_and_not_layout() -> None:
    d = local_domain(8, 12)
    x = torch.ones(2, 8, 12, 4)
    base = init_model(Dropout(d, 0.5), seed=1)(x)
    other_step = init_model(Dropout(d, 0.5), seed=1)
    set_dropout_step(other_step, 1)
    assert not torch.equal(base, other_step(x))
    assert not torch.equal(base, init_model(Dropout(d, 0.5), seed=2)(x))
    keyed = Dropout(d, 0.5)
    keyed.reset_parameters(seed=1, key="another.layer")
    assert not torch.equal(base, keyed(x))
    field = init_model(Dropout(d, 0.5, "field"), seed=1)(x.permute(0, 3, 1, 2))
    assert torch.equal(field.permute(0, 2, 3, 1), base)  # same element, same decision
    assert torch.equal(base, init_model(Dropout(d, 0.5), seed=1)(x))  # no hidden counter


@pytest.mark.parametrize(
    "seed,key,step", [(0, "dropout", 0), (7, "blocks.3.mlp.drop", 12345), (2**40, "x", 3)]
)
def test_dropout_module_mask_equals_uniform_at(seed: int, key: str, step: int) -> None:
    d = local_domain(5, 9)
    m = Dropout(d, 0.37, "field")
    m.reset_parameters(seed, key)
    m.step, m.batch_offset = step, 4
    x = torch.randn(3, 2, 5, 9)
    want = dropout_mask(d, x.shape, "field", 0.37, seed, f"{key}/step{step}", batch_offset=4)
    assert torch.equal(m.mask(x), want)


def test_dropout_recomputed_under_checkpoint() -> None:
    m = init_model(MLP(local_domain(6, 8), 4, 12, dropout=0.5), seed=0)
    x = torch.randn(2, 6, 8, 4)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1 = m(x1)
    y1.square().sum().backward()
    y2 = checkpoint(m, x2, use_reentrant=False)
    y2.square().sum().backward()
    assert torch.equal(y1, y2)
    assert torch.allclose(x1.grad, x2.grad)


# ---------------------------------------------------------------------- init mesh invariance
BUILDERS = {
    "mlp": lambda d: MLP(d, 5, 9, 3),
    "layer_norm": lambda d: LayerNorm(d, 10),
    "group_norm": lambda d: GroupNorm(d, 2, 6),
    "token_mixing": lambda d: TokenMixing(d, 7),
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_init_is_mesh_invariant(name: str) -> None:
    grid = (7, 10)
    full = dict(init_model(BUILDERS[name](local_domain(*grid)), seed=4).named_parameters())
    for d in _rank_domains((2, 2), grid):
        for pname, p in init_model(BUILDERS[name](d), seed=4).named_parameters():
            assert torch.equal(p, full[pname][spec_of(p).index(p.shape)]), f"{name}.{pname} rank {d.index}"


# ------------------------------------------------------------------------- autocast, 1 rank
@pytest.mark.parametrize(
    "name,build,shape",
    [
        ("mlp", lambda d: MLP(d, 6, 10, 5), (2, 8, 12, 6)),
        ("layer_norm", lambda d: LayerNorm(d, 6), (2, 8, 12, 6)),
        ("group_norm", lambda d: GroupNorm(d, 2, 6), (2, 6, 8, 12)),
        ("instance_norm", lambda d: InstanceNorm(d, 6, affine=True), (2, 6, 8, 12)),
        ("token_mixing", lambda d: TokenMixing(d, 10), (2, 8, 12, 3)),
    ],
)
def test_bf16_autocast(name: str, build, shape: tuple[int, ...]) -> None:
    m = init_model(build(local_domain(8, 12)), seed=0)
    x = torch.randn(shape)
    want = m(x)
    xa = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = m(xa)
    got.float().square().sum().backward()
    assert xa.grad is not None and torch.isfinite(xa.grad).all()
    assert (got.float() - want).abs().max() <= 0.05 * want.abs().max(), name
    if "norm" in name:  # statistics in float32, as torch's norms under autocast
        assert got.dtype == torch.float32


# ------------------------------------------------------------------------------ bad inputs
def test_bad_inputs() -> None:
    d = local_domain(8, 12)
    with pytest.raises(ValueError, match="expects a token tile"):
        MLP(d, 6, 10)(torch.randn(2, 8, 12, 5))
    with pytest.raises(ValueError, match="activation 'swishh'"):
        MLP(d, 6, 10, activation="swishh")
    with pytest.raises(ValueError, match="expects 6 channels"):
        LayerNorm(d, 6)(torch.randn(2, 8, 12, 4))
    with pytest.raises(ValueError, match="cannot be split into 4 groups"):
        GroupNorm(d, 4, 6)
    with pytest.raises(ValueError, match=r"field tile \(B, 6, 8, 12\)"):
        GroupNorm(d, 2, 6)(torch.randn(2, 6, 8, 11))
    with pytest.raises(ValueError, match=r"token tile \(B, 8, 12, C\)"):
        TokenMixing(d, 4)(torch.randn(2, 12, 8, 3))
    with pytest.raises(ValueError, match="hidden_tokens"):
        TokenMixing(d, 0)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        Dropout(d, 1.5)
    with pytest.raises(ValueError, match="layout 'channels'"):
        Dropout(d, 0.1, "channels")
    with pytest.raises(ValueError, match="4-D tile"):
        Dropout(d, 0.1)(torch.randn(8, 12, 3))
    with pytest.raises(ValueError, match="this rank's tile"):
        Dropout(d, 0.1)(torch.randn(2, 8, 10, 3))
