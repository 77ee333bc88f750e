"""Noise channels of stochastic models: a pure function of (seed, member, sample, step, channel, lat, lon)."""

from __future__ import annotations

import tempfile

import numpy as np
import pytest
import torch
from jigsaw_earth.models import build_model
from jigsaw_earth.models.noise import forecast_sample_index, member_noise, train_sample_index
from jigsaw_earth.models.run import model_step

from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.distributed.tiles import Tile, TileGrid
from jigsaw_earth.layers import Domain
from jigsaw_earth.training import Trainer

from .train_helpers import PixelMLP, tiny_config, tiny_data

N_LAT, N_LON, K = 7, 10, 3


def _noise(tile: Tile, samples, member: int = 0, step: int = 0, seed: int = 5) -> torch.Tensor:
    b = 3 if isinstance(samples, int) else len(samples)
    return member_noise(
        (b, K, *tile.shape),
        seed=seed,
        member=member,
        sample_index=samples,
        step=step,
        tile=tile,
        grid=(N_LAT, N_LON),
    )


@pytest.mark.parametrize("mesh", [(2, 3), (3, 2), (1, 4)])
def test_tiles_of_any_mesh_assemble_the_global_noise(mesh):
    """Uneven tiles (7 rows over 2 or 3, 10 columns over 3 or 4) cut the one-rank field exactly."""
    whole = _noise(Tile(0, N_LAT, 0, N_LON), 11)
    grid = TileGrid(N_LAT, N_LON, *mesh)
    for tile in grid.tiles():
        torch.testing.assert_close(
            _noise(tile, 11),
            whole[..., tile.lat_start : tile.lat_stop, tile.lon_start : tile.lon_stop],
            rtol=0,
            atol=0,
        )


def test_a_sample_is_the_same_in_any_batch():
    whole = _noise(Tile(0, N_LAT, 0, N_LON), 4)  # samples 4, 5, 6
    torch.testing.assert_close(_noise(Tile(0, N_LAT, 0, N_LON), torch.tensor([6, 4])), whole[[2, 0]])


def test_streams_differ_and_are_standard_normal():
    tile = Tile(0, N_LAT, 0, N_LON)
    base = _noise(tile, 0)
    for other in (
        _noise(tile, 0, member=1),
        _noise(tile, 0, step=1),
        _noise(tile, 0, seed=6),
        _noise(tile, 3),
    ):
        assert not torch.equal(other, base)
        assert abs(float(torch.corrcoef(torch.stack([other.flatten(), base.flatten()]))[0, 1])) < 0.2
    assert not torch.equal(base[:, 0], base[:, 1])  # channels differ too
    big = member_noise(
        (64, 4, N_LAT, N_LON), seed=1, member=2, sample_index=0, step=3, tile=tile, grid=(N_LAT, N_LON)
    )
    assert big.dtype == torch.float32
    assert abs(float(big.mean())) < 0.03 and abs(float(big.std()) - 1) < 0.03


def test_sample_indices_of_training_and_forecasts():
    assert train_sample_index(3, 8, [4, 5]).tolist() == [20, 21]
    times = np.array(["1970-01-02T06", "2020-01-01T00"], dtype="datetime64[h]")
    assert forecast_sample_index(times).tolist() == [30, 438288]
    with pytest.raises(ValueError, match="1-based"):
        train_sample_index(0, 8, [0])


def test_bad_shapes_are_named():
    tile = Tile(0, 4, 0, 5)
    with pytest.raises(ValueError, match="this rank's 4x5 tile"):
        member_noise((2, K, 4, 6), seed=0, member=0, sample_index=0, step=0, tile=tile, grid=(8, 10))
    with pytest.raises(ValueError, match="one per sample"):
        member_noise(
            (2, K, 4, 5), seed=0, member=0, sample_index=torch.arange(3), step=0, tile=tile, grid=(8, 10)
        )
    with pytest.raises(ValueError, match="member=-1"):
        member_noise((2, K, 4, 5), seed=0, member=-1, sample_index=0, step=0, tile=tile, grid=(8, 10))


def test_model_step_gives_a_built_in_model_its_noise_channels():
    """weathermixer built with n_static + K static channels: the noise changes the step, the same
    noise repeats it, and a batch of two samples equals the two one-sample steps."""
    domain = Domain.create(DomainMesh(MeshShape()), 8, 16)
    torch.manual_seed(0)
    model = build_model("weathermixer", domain, 3, 2 + K, 4, "tiny")
    state, static, tf = torch.randn(2, 3, 8, 16), torch.randn(2, 8, 16), torch.randn(2, 4)
    tile = domain.tile
    eps = member_noise((2, K, 8, 16), seed=0, member=0, sample_index=0, step=0, tile=tile, grid=(8, 16))
    other = member_noise((2, K, 8, 16), seed=0, member=1, sample_index=0, step=0, tile=tile, grid=(8, 16))
    with torch.no_grad():
        a = model_step(model, state, static, tf, bf16=False, tendency=None, noise=eps)
        b = model_step(model, state, static, tf, bf16=False, tendency=None, noise=other)
        one = model_step(model, state[1:], static, tf[1:], bf16=False, tendency=None, noise=eps[1:])
    assert a.shape == state.shape and not torch.allclose(a, b)
    torch.testing.assert_close(one, a[1:], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="one field per sample"):
        model_step(model, state, static, tf, bf16=False, tendency=None, noise=eps[:1])
    with pytest.raises(ValueError, match="static must be"):
        model_step(model, state, static, tf, bf16=False, tendency=None)  # K channels missing


def test_trainer_feeds_noise_in_training_and_validation():
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = tiny_config(
            run_dir, (1, 1, 1), training={"steps": 3, "batch_size": 4}, model={"noise_channels": 2}
        )
        mesh = DomainMesh(MeshShape())
        data = tiny_data(cfg, mesh)
        model = PixelMLP(Domain.create(mesh, data.grid.n_lat, data.grid.n_lon), 3, data.n_static + 2, 4)
        trainer = Trainer(cfg, mesh, data=data, model=model)
        summary = trainer.fit()
        assert np.isfinite(summary["final_loss"]) and np.isfinite(summary["validation"]["z500@6h/model"])
        batch = data.train_batch(1)
        got = trainer.noise(batch, train_sample_index(2, 4, range(4)), range(1), 1)
        want = member_noise(
            (4, 2, data.grid.n_lat, data.grid.n_lon),
            seed=cfg.run.seed,
            member=0,
            sample_index=4,
            step=1,
            tile=batch.tile,
            grid=(data.grid.n_lat, data.grid.n_lon),
        )
        torch.testing.assert_close(got, want, rtol=0, atol=0)
