"""Parameters replicated over the domain: the same trajectory on 1 and N ranks, or refused by name.

A model with a ``sharded_parameter(shape, None)`` gain, a plain ``nn.Linear`` over channels and a
bare ``nn.Parameter`` bias (all three held whole by every domain rank) trains 12 steps on 1 rank,
on a 2 × 2 mesh and on 2 data replicas × 2 domain ranks: losses, grad norms and the final values of
the replicated parameters must agree, and every rank must hold the same copy. The 2 × 2 run's
step-6 checkpoint resumes on 1 rank with the 2 × 2 run's steps 7…12.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from jigsaw_earth.distributed.comm import ledger
from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.layers import Domain
from jigsaw_earth.layers.base import fill_uniform_, sharded_parameter
from jigsaw_earth.training import Trainer

from .train_helpers import PixelMLP, tiny_config, tiny_data

MESHES = {"1x2x2": (1, 2, 2), "2x1x2": (2, 1, 2)}
STEPS = 12


class Gain(nn.Module):
    """A per-channel gain replicated on every rank (``sharded_parameter(shape, None)``)."""

    jigsaw_layer = True

    def __init__(self, channels: int):
        super().__init__()
        self.weight = sharded_parameter((channels,), None)

    def reset_parameters(self, seed: int, key: str) -> None:
        fill_uniform_(self.weight, seed, f"{key}.weight", 0.9, 1.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight.view(1, -1, 1, 1)


class ReplicatedNet(PixelMLP):
    """``PixelMLP`` followed by a replicated gain, a plain channel ``nn.Linear`` and a bare bias."""

    def __init__(self, domain: Domain, n_state: int, n_static: int, n_time: int, random_bias: bool = False):
        super().__init__(domain, n_state, n_static, n_time)
        self.gain = Gain(n_state)
        self.mix = nn.Linear(n_state, n_state)
        bias = torch.randn(n_state) if random_bias else torch.zeros(n_state)
        self.bias = nn.Parameter(bias)

    def forward(self, state: torch.Tensor, static: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        y = self.gain(super().forward(state, static, time))
        mixed = self.mix(y.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return y + 0.1 * mixed + self.bias.view(1, -1, 1, 1)


REPLICATED = ("gain.weight", "mix.weight", "mix.bias", "bias")


def _train(mesh: DomainMesh, run_dir: str, resume: str) -> dict:
    shape = (mesh.shape.data, mesh.shape.lat, mesh.shape.lon)
    sections = {"training": {"steps": STEPS}, "checkpoint": {"every": 6, "resume": resume, "keep": 3}}
    cfg = tiny_config(run_dir, shape, **sections)
    data = tiny_data(cfg, mesh)
    domain = Domain.create(mesh, data.grid.n_lat, data.grid.n_lon)
    trainer = Trainer(cfg, mesh, data=data, model=ReplicatedNet(domain, len(data.channels), data.n_static, 4))
    start = trainer.step
    ledger.reset()
    trainer.fit()
    params = dict(trainer.model.named_parameters())
    return {
        "start": start,
        "loss": [h["loss"] for h in trainer.history],
        "grad_norm": [h["grad_norm"] for h in trainer.history],
        "replicated": {n: params[n].detach().reshape(-1).tolist() for n in REPLICATED},
        "ledger": ledger.summary(),
    }


def _refused(mesh: DomainMesh, run_dir: str) -> str:
    """A bare parameter drawn from each rank's own generator differs between ranks: refused."""
    torch.manual_seed(mesh.rank)
    cfg = tiny_config(run_dir, (1, 1, 2))
    data = tiny_data(cfg, mesh)
    domain = Domain.create(mesh, data.grid.n_lat, data.grid.n_lon)
    try:
        Trainer(cfg, mesh, data=data, model=ReplicatedNet(domain, len(data.channels), 2, 4, random_bias=True))
    except ValueError as err:
        return str(err)
    return "accepted"


def _cases(mesh: DomainMesh, base: str) -> dict:
    name = f"{mesh.shape.data}x{mesh.shape.lat}x{mesh.shape.lon}"
    return {"fresh": _train(mesh, f"{base}/{name}", "never")}


@pytest.fixture(scope="module")
def runs() -> dict:
    with tempfile.TemporaryDirectory(prefix="jigsaw-replicated-") as base:
        results = {name: spawn(MeshShape(*shape), _cases, base) for name, shape in MESHES.items()}
        results["1x1x1"] = spawn(MeshShape(), _cases, base)
        ckpt = str(Path(base, "1x2x2", "checkpoints", "step_000000006"))
        results["resumed"] = spawn(MeshShape(), _train, f"{base}/resumed", ckpt)
        results["refused"] = spawn(MeshShape(1, 1, 2), _refused, f"{base}/refused")
        yield results


def _rel(a: list[float], b: list[float]) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12)))


@pytest.mark.parametrize("name", list(MESHES))
def test_replicated_parameters_follow_the_one_rank_trajectory(runs: dict, name: str) -> None:
    ref = runs["1x1x1"][0]["fresh"]
    assert ref["loss"][-1] < 0.8 * ref["loss"][0], ref["loss"]
    for rank, result in enumerate(runs[name]):
        got = result["fresh"]
        assert _rel(got["loss"], ref["loss"]) < 1e-4, (name, rank, got["loss"], ref["loss"])
        assert _rel(got["grad_norm"], ref["grad_norm"]) < 1e-4, (name, rank)
        for key, value in ref["replicated"].items():
            assert np.allclose(got["replicated"][key], value, rtol=1e-4, atol=1e-6), (name, rank, key)
            # every rank holds the very same copy (summed in the same order everywhere)
            assert got["replicated"][key] == runs[name][0]["fresh"]["replicated"][key], (name, rank, key)


def test_replicated_gradients_are_counted_in_the_ledger(runs: dict) -> None:
    sites = runs["1x2x2"][0]["fresh"]["ledger"]
    site = sites["gradients:grad.replicated"]
    assert site["calls"] == STEPS  # one bucket per step: all four replicated parameters together
    n = 3 + 3 * 3 + 3 + 3  # gain, mix.weight, mix.bias, bias (3 channels)
    assert site["bytes_sent"] == STEPS * 2 * (4 - 1) * n * 4 // 4
    assert "gradients:grad.data" not in sites  # one data replica: nothing to sum
    assert runs["2x1x2"][0]["fresh"]["ledger"]["gradients:grad.data"]["calls"] == STEPS


def test_loss_and_grad_norm_sums_are_counted_in_the_ledger(runs: dict) -> None:
    """The trainer's own all-reduces go through the core: a float64 scalar a step each."""
    for name, world, domain in (("1x2x2", 4, 4), ("2x1x2", 4, 2)):
        sites = runs[name][0]["fresh"]["ledger"]
        loss = [v for k, v in sites.items() if k.endswith(":loss.value")]
        norm = [v for k, v in sites.items() if k.endswith(":grad_norm")]
        assert [s["calls"] for s in loss] == [STEPS] and [s["calls"] for s in norm] == [STEPS], sorted(sites)
        assert loss[0]["bytes_sent"] == STEPS * 2 * (world - 1) * 8 // world
        assert norm[0]["bytes_sent"] == STEPS * 2 * (domain - 1) * 8 // domain


def test_replicated_parameters_resume_on_one_rank(runs: dict) -> None:
    ref = runs["1x2x2"][0]["fresh"]
    got = runs["resumed"][0]
    assert got["start"] == 6
    assert _rel(got["loss"], ref["loss"][6:]) < 1e-4, (got["loss"], ref["loss"][6:])


def test_differing_replicas_are_refused_by_name(runs: dict) -> None:
    for message in runs["refused"]:
        assert message.startswith("replicated parameter bias has different values on the domain ranks"), (
            message
        )
