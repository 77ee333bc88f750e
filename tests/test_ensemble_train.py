"""Ensemble training is the same on every mesh: members batched in one group, on 1×1 and 2×2
groups, and spread over the ensemble axis (with 2-D lat × lon groups) give the same CRPS values,
input gradients, weight gradients and loss trajectory as one process.

One spawn per mesh runs every case: the CRPS loss on tiles and members split over ranks (value
and input gradients against the serial loss) and a short stochastic training run (fair CRPS,
4 members, noise channels, 2-step rollout: losses, grad norms, validation and the final weight
gradients block by block).
"""

from __future__ import annotations

import tempfile

import numpy as np
import pytest
import torch

from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.distributed.tiles import TileGrid
from jigsaw_earth.layers.base import spec_of
from jigsaw_earth.training import Trainer
from jigsaw_earth.training.crps import ensemble_crps
from jigsaw_earth.validation.registry import run_checks

from .conftest import assert_records_pass
from .train_helpers import PixelMLP, tiny_config, tiny_data

M, B, C, H, W = 4, 2, 3, 5, 7
NOISE, STEPS = 2, 6
FAST = {"serial": MeshShape(), "ens2x1x3": MeshShape(1, 1, 3, ensemble=2)}
SLOW = {
    "ens2": MeshShape(1, 1, 1, ensemble=2),
    "2x2": MeshShape(1, 2, 2),
    "ens4": MeshShape(1, 1, 1, ensemble=4),
    "ens2x2x3": MeshShape(1, 2, 3, ensemble=2),
}


def _case(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    pred = torch.randn(M, B, C, H, W, generator=g, dtype=torch.float64)
    target = torch.randn(B, C, H, W, generator=g, dtype=torch.float64)
    lat_w = torch.rand(H, generator=g, dtype=torch.float64) + 0.5
    return pred, target, lat_w, torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64)


def _crps_on_tiles(mesh: DomainMesh) -> list[dict]:
    """This rank's members (ensemble axis) of its tile (uneven: 5 × 7 over lat × lon)."""
    pred, target, lat_w, ch_w = _case()
    ls, lo = TileGrid(H, W, mesh.shape.lat, mesh.shape.lon).tile_of(mesh.domain.index).slices
    per = M // mesh.shape.ensemble
    first = mesh.ensemble_index * per
    out = []
    for alpha in (1.0, 0.95, 0.0):
        x = pred[first : first + per][..., ls, lo].clone().requires_grad_(True)
        local = ensemble_crps(
            x, target[..., ls, lo], lat_w[ls], ch_w, alpha=alpha, members=mesh.ensemble, mse_weight=0.2
        )
        local.backward()
        tile = [ls.start, ls.stop, lo.start, lo.stop]
        out.append(
            {"value": local.item(), "grad": x.grad.tolist(), "members": [first, first + per], "tile": tile}
        )
    return out


def _train(mesh: DomainMesh, run_dir: str) -> dict:
    cfg = tiny_config(
        run_dir,
        (mesh.shape.data, mesh.shape.lat, mesh.shape.lon, mesh.shape.ensemble),
        model={"noise_channels": NOISE},
        loss={"kind": "fair_crps", "mse_weight": 0.1},
        training={"steps": STEPS, "batch_size": 2, "members": M, "rollout_steps": 2},
        optim={"lr": 3e-3, "warmup_steps": 1, "grad_clip": 0.5},
        validation={"lead_hours": [6, 12], "max_samples": 2},
    )
    data = tiny_data(cfg, mesh)
    model = PixelMLP(mesh_domain(mesh, data), len(data.channels), data.n_static + NOISE, 4)
    trainer = Trainer(cfg, mesh, data=data, model=model)
    summary = trainer.fit()
    grads = [
        {"name": n, "offsets": list(spec_of(p).offsets), "grad": p.grad.double().reshape(-1).tolist(),
         "shape": list(p.grad.shape), "value": p.detach().double().reshape(-1).tolist()}
        for n, p in trainer.model.named_parameters()
    ]  # fmt: skip
    return {
        "loss": [h["loss"] for h in trainer.history],
        "grad_norm": [h["grad_norm"] for h in trainer.history],
        "val": {k: v for k, v in summary["validation"].items() if k.endswith("/model")},
        "grads": grads,
    }


def mesh_domain(mesh: DomainMesh, data):
    from jigsaw_earth.layers import Domain

    return Domain.create(mesh, data.grid.n_lat, data.grid.n_lon)


def _everything(mesh: DomainMesh, base: str) -> dict:
    return {
        "crps": _crps_on_tiles(mesh),
        "train": _train(mesh, f"{base}/{mesh.shape}"),
        "validator": run_checks(mesh, ["ensemble"]),
    }


def _run(meshes: dict[str, MeshShape], base: str | None = None) -> dict:
    if base is not None:
        return {name: spawn(shape, _everything, base) for name, shape in meshes.items()}
    with tempfile.TemporaryDirectory(prefix="jigsaw-ens-") as tmp:
        return _run(meshes, tmp)


@pytest.fixture(scope="module")
def fast(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("ens")
    return {"base": str(base), **_run(FAST, str(base))}


def _rel(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12)))


def _check_crps(ranks: list[dict]) -> None:
    pred, target, lat_w, ch_w = _case()
    for i, alpha in enumerate((1.0, 0.95, 0.0)):
        full = pred.clone().requires_grad_(True)
        serial = ensemble_crps(full, target, lat_w, ch_w, alpha=alpha, mse_weight=0.2)
        serial.backward()
        assert sum(r["crps"][i]["value"] for r in ranks) == pytest.approx(serial.item(), rel=1e-10)
        for r in ranks:
            got = r["crps"][i]
            (m0, m1), (a0, a1, b0, b1) = got["members"], got["tile"]
            np.testing.assert_allclose(
                got["grad"], full.grad[m0:m1, ..., a0:a1, b0:b1].numpy(), rtol=1e-9, atol=1e-12
            )


def _check_train(ranks: list[dict], ref: dict) -> None:
    # the serial run's weight gradients, as whole tensors
    whole = {g["name"]: np.asarray(g["grad"]).reshape(g["shape"]) for g in ref["grads"]}
    for rank, r in enumerate(ranks):
        got = r["train"]
        assert len(got["loss"]) == STEPS
        assert _rel(got["loss"], ref["loss"]) < 1e-4, (rank, got["loss"], ref["loss"])
        assert _rel(got["grad_norm"], ref["grad_norm"]) < 1e-4, rank
        for key, value in ref["val"].items():
            assert abs(got["val"][key] - value) <= 1e-4 * abs(value), key
        for g in got["grads"]:
            block = tuple(slice(o, o + n) for o, n in zip(g["offsets"], g["shape"]))
            want = whole[g["name"]][block]
            np.testing.assert_allclose(np.asarray(g["grad"]).reshape(g["shape"]), want, rtol=2e-3, atol=1e-6)


@pytest.mark.parametrize("name", list(FAST))
def test_validator_entries_pass(fast: dict, name: str) -> None:
    records = fast[name][0]["validator"]
    assert {r["op"] for r in records} == {"ensemble_gather", "ensemble_crps", "ensemble_grad_sum"}
    assert_records_pass(tuple(records))


def test_serial_ensemble_training_learns(fast: dict) -> None:
    ref = fast["serial"][0]["train"]
    assert all(np.isfinite(ref["loss"])) and ref["loss"][-1] < ref["loss"][0]
    _check_crps(fast["serial"])


@pytest.mark.parametrize("name", [n for n in FAST if n != "serial"])
def test_same_on_meshes_with_an_ensemble_axis(fast: dict, name: str) -> None:
    _check_crps(fast[name])
    _check_train(fast[name], fast["serial"][0]["train"])


def test_checkpoint_of_an_ensemble_mesh_loads_on_one_process(fast: dict) -> None:
    """Members share the weights: the 2 x 1x3 run's checkpoint (written by ensemble group 0) loads
    on one rank, every block equal to what the ranks held."""
    from jigsaw_earth.checkpoint import latest_checkpoint, load_checkpoint

    mesh = DomainMesh(MeshShape())
    cfg = tiny_config(fast["base"], (1, 1, 1))
    data = tiny_data(cfg, mesh)
    model = PixelMLP(mesh_domain(mesh, data), len(data.channels), data.n_static + NOISE, 4)
    load_checkpoint(latest_checkpoint(f"{fast['base']}/{FAST['ens2x1x3']}"), model, None, mesh)
    whole = dict(model.named_parameters())
    for r in fast["ens2x1x3"]:
        for g in r["train"]["grads"]:
            block = tuple(slice(o, o + n) for o, n in zip(g["offsets"], g["shape"]))
            held = np.asarray(g["value"]).reshape(g["shape"])
            np.testing.assert_array_equal(whole[g["name"]].detach().double().numpy()[block], held)


@pytest.mark.slow
def test_same_on_2x2_groups_and_wider_ensembles(fast: dict) -> None:
    runs = _run(SLOW)
    for name in SLOW:
        _check_crps(runs[name])
        _check_train(runs[name], fast["serial"][0]["train"])


def test_crps_with_tendency_scaling_counts_each_channels_tendency_equally(tmp_path) -> None:
    """With one member CRPS is the absolute error; under tendency scaling it is measured in units of
    each channel's tendency std (weights variable x level), as MSE is in squared units."""
    from jigsaw_earth.layers import Domain

    cfg = tiny_config(str(tmp_path), (1, 1, 1), loss={"kind": "crps"}, training={"batch_size": 2})
    mesh = DomainMesh(MeshShape())
    data = tiny_data(cfg, mesh)
    model = PixelMLP(Domain.create(mesh, data.grid.n_lat, data.grid.n_lon), 3, data.n_static, 4)
    trainer = Trainer(cfg, mesh, data=data, model=model)
    batch = data.train_batch(0)
    with torch.no_grad():
        got = trainer._loss_local(batch, 1)
        pred = trainer.forward(batch.inputs, batch.static, data.step_time_features(batch, 0))
        err = (pred - batch.targets[:, 0]).abs() / data.tendency_std.view(1, -1, 1, 1)
        want = (err * data.lat_weights.view(1, 1, -1, 1)).sum() / trainer.loss.count
    assert float(got) == pytest.approx(float(want), rel=1e-5)
