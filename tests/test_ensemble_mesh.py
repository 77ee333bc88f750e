"""The ensemble axis of the mesh: rank order, axes and groups of ``data × ensemble × lat × lon``."""

from __future__ import annotations

import pytest

from jigsaw_earth.config.schema import MeshConfig
from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape, init_mesh, parse_mesh


def test_parse_mesh_reads_the_ensemble_form_and_keeps_the_others() -> None:
    assert parse_mesh("1x2x1x3") == MeshShape(1, 1, 3, ensemble=2)
    assert parse_mesh("2x3") == MeshShape(1, 2, 3) and parse_mesh("2x1x4") == MeshShape(2, 1, 4)
    assert str(MeshShape(1, 1, 3, 2)) == "1x2x1x3" and str(MeshShape(2, 1, 4)) == "2x1x4"
    assert parse_mesh(str(MeshShape(3, 2, 1, 2))) == MeshShape(3, 2, 1, 2)
    with pytest.raises(ValueError, match="DATAxENSEMBLExLATxLON"):
        parse_mesh("1x2x3x4x5")
    with pytest.raises(ValueError, match="'ensemble' must be a positive integer"):
        MeshShape(1, 1, 1, 0)


def test_axes_of_every_rank_partition_the_world() -> None:
    """data=2 × ensemble=2 × lat=2 × lon=3: each axis's rank lists tile the world consistently."""
    shape = MeshShape(2, 2, 3, ensemble=2)
    assert shape.world_size == 24 and shape.replicas == 4
    meshes = [DomainMesh(shape, r) for r in range(24)]
    for m in meshes:
        d, i, j = m.coord
        e = m.ensemble_index
        assert m.rank == m.global_rank(d, i, j, e) == ((d * 2 + e) * 2 + i) * 3 + j
        for name in ("data", "ensemble", "replicas", "lat", "lon", "domain"):
            axis = m.axis(name)
            assert axis.ranks[axis.index] == m.rank
            for peer in axis.ranks:  # every member of the axis sees the same list
                assert meshes[peer].axis(name).ranks == axis.ranks
        assert {meshes[r].ensemble_index for r in m.ensemble.ranks} == {0, 1}
        assert {meshes[r].coord[1:] for r in m.replicas.ranks} == {(i, j)}  # same block of weights
        assert {meshes[r].ensemble_index for r in m.domain.ranks} == {e}  # a member's own domain
    assert MeshConfig(data=2, ensemble=2, lat=2, lon=3).shape == shape


def test_world_size_error_names_the_ensemble_factor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError) as err:
        init_mesh(MeshShape(1, 1, 3, ensemble=2))
    for part in ("data=1 × ensemble=2 × lat=1 × lon=3", "= 6 ranks", "world size 4"):
        assert part in str(err.value)


def test_config_checks_members_against_the_ensemble_axis_and_the_noise() -> None:
    from .train_helpers import tiny_config

    ok = tiny_config(
        "r", (1, 1, 2, 2), training={"members": 4}, model={"noise_channels": 1}, loss={"kind": "fair_crps"}
    )
    assert ok.mesh.shape == MeshShape(1, 1, 2, ensemble=2) and ok.loss.kind == "fair_crps"
    ok.check(world_size=4)
    with pytest.raises(ValueError, match="data=1 × ensemble=2 × lat=1 × lon=2 = 4 ranks"):
        ok.check(world_size=2)
    with pytest.raises(ValueError, match=r"training.members=3 must split evenly over mesh.ensemble=2"):
        tiny_config("r", (1, 1, 1, 2), training={"members": 3}, model={"noise_channels": 1}).check()
    with pytest.raises(ValueError, match=r"model\.noise_channels=0 gives identical members"):
        tiny_config("r", (1, 1, 1), training={"members": 2}).check()
    with pytest.raises(ValueError, match="alpha"):
        tiny_config("r", (1, 1, 1), loss={"kind": "almost_fair_crps", "alpha": 1.5})
