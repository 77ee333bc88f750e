"""Distributed core: mesh, tiles, collectives, halo exchange, distributed matmul."""

from __future__ import annotations

import pytest
import torch

from jigsaw_earth.distributed.halo import Halo, pad_reference
from jigsaw_earth.distributed.matmul import (
    channel_bytes,
    channel_strategy,
    matmul_channels,
    token_strategy,
)
from jigsaw_earth.distributed.mesh import (
    MeshShape,
    _expand_nodelist,
    init_mesh,
    parse_mesh,
    slurm_environment,
)
from jigsaw_earth.distributed.tiles import TileGrid, split_sizes

from .conftest import CORE_MESHES, assert_records_pass, slow_unless

CORE_OPS = ("halo_exchange", "gather_windows", "scatter_add_windows", "matmul", "collectives")


MESHES = slow_unless(CORE_MESHES, ("2x2", "1x3"))


@pytest.mark.parametrize("mesh", MESHES)
def test_core_ops_match_serial(mesh: str, records_for) -> None:
    records = records_for(mesh, CORE_OPS)
    ops = {r["op"].split(".")[0] for r in records}
    assert {"halo_exchange", "gather_windows", "matmul_channels", "matmul_tokens", "all_gather"} <= ops
    assert_records_pass(records)
    uneven = [r for r in records if r["shape"].startswith(("7x10", "13x18"))]
    assert uneven, "uneven grids must be part of the cases"


@pytest.mark.parametrize("mesh", [m for m in MESHES if m.values[0] != "1x1"])
def test_matmul_strategies_both_directions_on_every_mesh(mesh: str, records_for) -> None:
    names = {r["op"] for r in records_for(mesh, CORE_OPS)}
    for form in ("matmul_channels", "matmul_tokens", "matmul_pair_bf16"):
        for strategy in ("weights", "activations"):
            assert f"{form}.{strategy}" in names, (mesh, form, strategy)


# ------------------------------------------------------------------------------ tiles
@pytest.mark.parametrize(
    ("n", "k", "want"),
    [(721, 2, (361, 360)), (721, 3, (241, 240, 240)), (721, 4, (181, 180, 180, 180)), (8, 4, (2, 2, 2, 2))],
)
def test_split_sizes(n: int, k: int, want: tuple[int, ...]) -> None:
    assert split_sizes(n, k) == want


def test_tile_grid_offsets_owners_and_roundtrip() -> None:
    grid = TileGrid(721, 1440, 3, 4)
    tiles = grid.tiles()
    assert tiles[0].lat_start == 0 and tiles[-1].lat_stop == 721 and tiles[-1].lon_stop == 1440
    assert tiles[5].shape == (240, 360)  # lat index 1, lon index 1
    assert grid.lat_owner(240) == 0 and grid.lat_owner(241) == 1 and grid.lat_owner(720) == 2
    small = TileGrid(7, 10, 2, 3)
    field = torch.arange(70.0).reshape(7, 10)
    parts = [small.scatter(field, k) for k in range(small.n_tiles)]
    assert torch.equal(small.assemble(parts), field)


def test_tile_grid_too_small_names_the_fix() -> None:
    with pytest.raises(ValueError, match="latitude has 2 points but the mesh splits it over 3 ranks"):
        TileGrid(2, 8, 3, 1)


# ------------------------------------------------------------------------------- mesh
def test_parse_mesh() -> None:
    assert parse_mesh("2x3") == MeshShape(1, 2, 3)
    assert parse_mesh("2x1x4") == MeshShape(2, 1, 4)
    with pytest.raises(ValueError, match="LATxLON"):
        parse_mesh("2-2")
    with pytest.raises(ValueError, match="'lat' must be a positive integer"):
        MeshShape(1, 0, 2)


def test_mesh_world_size_error_names_every_factor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError) as err:
        init_mesh(MeshShape(2, 3, 1))
    msg = str(err.value)
    for part in ("data=2", "lat=3", "lon=1", "= 6 ranks", "world size 4"):
        assert part in msg


def test_single_process_needs_no_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    mesh = init_mesh()
    assert mesh.shape == MeshShape() and not torch.distributed.is_initialized()
    assert mesh.domain.size == 1 and mesh.domain.group is None


def test_slurm_environment() -> None:
    env = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_NODELIST": "gpu[003-004,010]",
        "SLURM_JOB_ID": "4242",
    }
    got = slurm_environment(env)
    assert got == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "gpu003",
        "MASTER_PORT": str(20000 + 4242),
    }
    assert slurm_environment({**env, "RANK": "0"}) == {}  # torchrun inside an allocation wins
    assert _expand_nodelist("a[1-3],b7") == ["a1", "a2", "a3", "b7"]


# --------------------------------------------------------------------- halo semantics
def test_pole_padding_is_the_row_inside_at_the_opposite_longitude() -> None:
    x = torch.arange(4 * 6.0).reshape(4, 6)
    y = pad_reference(x, Halo((2, 1), (1, 1), "pole"))
    # padded row 1 = one row beyond the north pole = row 0 at lon + 180° (shift of 3 columns)
    assert torch.equal(y[1, 1:-1], x[0].roll(3))
    assert torch.equal(y[0, 1:-1], x[1].roll(3))
    assert torch.equal(y[-1, 1:-1], x[3].roll(3))
    assert torch.equal(y[2:-1, 0], x[:, -1]) and torch.equal(y[2:-1, -1], x[:, 0])  # periodic


def test_halo_mode_errors() -> None:
    with pytest.raises(ValueError, match="even number of columns"):
        pad_reference(torch.zeros(4, 5), Halo((1, 1), (0, 0), "pole"))
    with pytest.raises(ValueError, match="lat_mode 'wrap'"):
        pad_reference(torch.zeros(4, 6), Halo((1, 1), (0, 0), "wrap"))  # type: ignore[arg-type]


# -------------------------------------------------------------------- matmul model
def test_matmul_cost_model_and_choice() -> None:
    counts, cin, outs = (100, 100, 100, 100), 8, (2, 2, 2, 2)
    w_fwd, w_bwd = channel_bytes("weights", counts, cin, outs, bias=True)
    assert (w_fwd, w_bwd) == (3 * 9 * 8 * 4, 2 * 3 * 9 * 8 * 4)
    a_fwd, _ = channel_bytes("activations", counts, cin, outs, bias=True)
    assert a_fwd == (3 * 400 * 8 + 4 * 300 * 2) * 4
    assert channel_strategy("auto", counts, cin, outs, True) == "weights"  # many tokens, small weights
    assert channel_strategy("activations", counts, cin, outs, True) == "activations"  # kept as given
    # few output tokens: moving A is cheaper
    assert token_strategy("auto", (4, 4), (1, 1), 64, training=False) == "weights"
    with pytest.raises(ValueError, match="strategy 'ring'"):
        matmul_channels(torch.zeros(2, 3), torch.zeros(3, 4), None, init_mesh().domain, (4,), (2,), "ring")  # type: ignore[arg-type]


def test_processes_started_like_srun_form_a_group() -> None:
    """Two processes that have only SLURM_* variables (as srun gives them) build a 1x2 mesh."""
    import os
    import subprocess
    import sys

    from jigsaw_earth.distributed.spawn import free_port

    code = (
        "import torch, torch.distributed as dist\n"
        "from jigsaw_earth.distributed.mesh import MeshShape, init_mesh\n"
        "mesh = init_mesh(MeshShape(1, 1, 2), backend='gloo', timeout_s=60)\n"
        "t = torch.tensor([float(mesh.rank + 1)])\n"
        "dist.all_reduce(t, group=mesh.domain.group)\n"
        "print(mesh.rank, mesh.coord, int(t.item()))\n"
        "dist.barrier()\n"  # both ranks done before teardown (a peer's early teardown once aborted gloo)
        "dist.destroy_process_group()\n"
    )
    base = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")
    }
    base.update(
        SLURM_NTASKS="2", SLURM_JOB_NODELIST="localhost", SLURM_JOB_ID="7", MASTER_PORT=str(free_port())
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env={**base, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-500:] for _, err in outs]
    assert sorted(out.strip() for out, _ in outs) == ["0 (0, 0, 0) 3", "1 (0, 0, 1) 3"]
