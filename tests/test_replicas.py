"""Weights gathered once for a forecast (``layers/replicas.py``): the same forward as the sharded one
and the serial one, with fewer messages, and no effect while gradients are on.

WeatherMixer (its tiny preset, and the paper's arrangement: concat and linear residual) on a 17 × 32
grid over 2×2 (uneven rows) and 1×2 / 2×1 meshes, forward without gradients: serial (the whole grid
on each rank, cut to its tile), sharded, and sharded inside ``replicated_weights``.
"""

from __future__ import annotations

import torch
from jigsaw_earth.models import build_model

from jigsaw_earth.distributed.mesh import MeshShape
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.layers import init_model, local_domain
from jigsaw_earth.layers.replicas import replica_bytes, replicated_weights
from jigsaw_earth.validation.checks_models import PAPER_TINY

GRID, N_STATE, N_STATIC, N_TIME = (17, 32), 3, 2, 4
CASES = {"tiny": {}, "paper": PAPER_TINY}


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(4321)
    return (
        torch.randn(2, N_STATE, *GRID, generator=gen),
        torch.randn(N_STATIC, *GRID, generator=gen),
        torch.randn(2, N_TIME, generator=gen),
    )


def _worker(mesh) -> dict:
    from jigsaw_earth.distributed.comm import ledger
    from jigsaw_earth.layers.base import Domain

    domain = Domain.create(mesh, *GRID)
    whole = _inputs()
    state, static, time = (domain.grid.scatter(t, domain.index) if t.dim() > 2 else t for t in whole)
    out = {}
    for case, overrides in CASES.items():
        whole_domain = local_domain(*GRID)
        serial = init_model(
            build_model("weathermixer", whole_domain, N_STATE, N_STATIC, N_TIME, "tiny", **overrides), 3
        )
        model = init_model(
            build_model("weathermixer", domain, N_STATE, N_STATIC, N_TIME, "tiny", **overrides), seed=3
        )
        model.eval()
        with torch.no_grad():
            want = domain.grid.scatter(serial(*whole), domain.index)
            ledger.reset()
            sharded = model(state, static, time)
            calls = sum(s.calls for s in ledger.sites.values())
            with replicated_weights(model) as layers:
                ledger.reset()
                replicated = model(state, static, time)
                calls_replicated = sum(s.calls for s in ledger.sites.values())
        ledger.reset()
        y0 = model(state, static, time)  # with autograd: the sharded path, inside the context or not
        calls_train = sum(s.calls for s in ledger.sites.values())
        with replicated_weights(model):
            ledger.reset()
            y = model(state, static, time)
            calls_grad = sum(s.calls for s in ledger.sites.values())
            y.square().sum().backward()
        out[case] = {
            "sharded": (sharded - want).abs().max().item() / want.abs().max().item(),
            "replicated": (replicated - want).abs().max().item() / want.abs().max().item(),
            "layers": layers,
            "calls": [calls, calls_replicated],
            "grad_same": torch.equal(y.detach(), y0.detach()),
            "calls_grad": [calls_train, calls_grad],
            "bytes": replica_bytes(model),
        }
    return out


def test_replicated_weights_forecast_as_the_sharded_model_with_fewer_messages() -> None:
    for shape in (MeshShape(1, 2, 2), MeshShape(1, 1, 2), MeshShape(1, 2, 1)):
        for rank in spawn(shape, _worker):
            for case, got in rank.items():
                # as close to the serial model as the sharded forward, or within float32's summation
                # noise for these models (the paper's linear residual reaches ~1e-5 of the largest value
                # on either path, at a level that depends on the CPU's kernels)
                assert got["replicated"] <= max(2 * got["sharded"], 1e-5) < 1e-4, (shape, case, got)
                assert got["layers"] > 0 and got["bytes"] > 0, (shape, case, got)
                sharded, replicated = got["calls"]
                assert replicated < sharded, (shape, case, got)
                train, inside = got["calls_grad"]
                assert got["grad_same"] and train == inside, (shape, case, got)


def test_one_rank_holds_nothing_to_replicate() -> None:
    model = init_model(
        build_model("weathermixer", local_domain(*GRID), N_STATE, N_STATIC, N_TIME, "tiny"), seed=3
    )
    assert replica_bytes(model) == 0
    with replicated_weights(model) as layers:
        assert layers == 0
