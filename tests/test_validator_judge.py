"""The validator's judge (``validation.registry``): noise passes, a wrong term fails.

In-process: the judge on sums whose true value is ~0 (summation-order noise only) and on exact
results (the floor). Spawned on the 2×3 mesh: the validator's own checks for a set of ops
chosen for CI time (the 6-rank 2-D mesh CI keeps), and ``check_module`` on a layer with an
injected bug — a 1e-3 perturbation of one weight-gradient element on one rank, a dropped halo
cell — which must fail, beside the same layers without the bug, which must pass.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from jigsaw_earth.distributed.halo import Halo, halo_exchange
from jigsaw_earth.distributed.mesh import DomainMesh, parse_mesh
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.layers.base import Domain
from jigsaw_earth.layers.linear import Linear
from jigsaw_earth.validation.layer_harness import check_module
from jigsaw_earth.validation.registry import Diff, compare, judge, run_checks

from .conftest import assert_records_pass

SIX_RANKS = "2x3"
# the 6-rank ops CI validates: the distributed matmul (both forms and strategies, the dX-free
# backward, bf16), the collectives, the norms' merged statistics, and Linear / token mixing
SIX_RANK_OPS = ("matmul", "collectives", "group_norm", "instance_norm", "linear", "token_mixing")


def _cancelling_terms(n: int, seed: int) -> torch.Tensor:
    """``n`` terms of size ~1 whose exact sum is ~1e-3 (a gradient that is ~0)."""
    a = torch.randn(n // 2, generator=torch.Generator().manual_seed(seed))
    return torch.cat([a, -a.roll(1) + 1e-3 / n])


def _blocked_sum(t: torch.Tensor, blocks: int) -> torch.Tensor:
    """A sum in another order: per-block sums, then their sum (as ranks would)."""
    return torch.stack([c.sum() for c in t.chunk(blocks)]).sum()


@pytest.mark.parametrize("seed", range(5))
def test_summation_noise_of_a_cancelling_sum_passes_and_a_wrong_term_fails(seed: int) -> None:
    t = _cancelling_terms(6000, seed)
    exact = t.double().sum()
    serial, sharded = t.sum(), _blocked_sum(t, 6)
    d = compare(sharded.reshape(1), exact.reshape(1), serial.reshape(1), terms=t.abs().max())
    assert judge(d) <= 1.0
    # the old judge, max|diff| / max|reference| against fp32: noise reads as a large error
    assert (sharded - serial).abs() / serial.abs().clamp_min(1e-30) > 1e-5 or sharded == serial
    wrong = sharded + 1e-3 * t.abs().max()
    assert judge(compare(wrong.reshape(1), exact.reshape(1), serial.reshape(1), t.abs().max())) > 1.0


def test_floor_for_exact_results() -> None:
    x = torch.randn(50, generator=torch.Generator().manual_seed(0))
    assert judge(compare(x, x.double(), x)) == 0.0
    zero = torch.zeros(3)
    assert judge(compare(zero, zero.double(), zero)) == 0.0
    one_ulp = x + x.abs().max() * torch.finfo(torch.float32).eps * (torch.arange(50) == 7)
    assert judge(compare(one_ulp, x.double(), x)) <= 1.0
    assert judge(compare(x * (1 + 1e-4), x.double(), x)) > 1.0
    assert judge(compare(None, x.double(), x)) == float("inf")
    assert judge(compare(None, None, None)) == 0.0


def test_reduced_precision_bound() -> None:
    d = Diff(sharded=2e-3, serial=0.0, magnitude=1.0, terms=1.0)
    assert judge(d, tolerance=3e-2) < 1.0 < judge(d)


# ------------------------------------------------------------------------- 2x3, spawned
class _BoxSum(nn.Module):
    """3×3 box sum of a field tile after a halo exchange (zeros beyond the poles, periodic
    longitude). ``drop``: rank 1 loses one received halo cell (the bug under test)."""

    jigsaw_layer = False
    halo = Halo((1, 1), (1, 1), "zeros")

    def __init__(self, domain: Domain, drop: bool = False):
        super().__init__()
        self.domain, self.drop = domain, drop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        padded = halo_exchange(x, self.domain.grid, self.halo, self.domain.axis)
        if self.drop and self.domain.index == 1:
            keep = torch.ones_like(padded)
            keep[..., 1, 0] = 0.0  # a west-halo cell from the periodic neighbour
            padded = padded * keep
        return F.avg_pool2d(padded, 3, stride=1) * 9.0


def _linear(domain: Domain, bug: bool) -> Linear:
    m = Linear(domain, 12, 20, True, "weights")
    if bug and domain.size > 1 and domain.index == 1:

        def perturb(g: torch.Tensor) -> torch.Tensor:
            bump = torch.zeros_like(g)
            bump[0, 0] = 1e-3 * g.abs().max()
            return g + bump

        m.weight.register_hook(perturb)
    return m


def _bug_cases(mesh: DomainMesh) -> list[dict]:
    grid = (8, 12)
    x_tokens = torch.randn(2, *grid, 12, generator=torch.Generator().manual_seed(1))
    x_field = torch.randn(2, 3, *grid, generator=torch.Generator().manual_seed(2))
    linear = dict(layout="tokens", reference=lambda m, t: t @ m.weight + m.bias)
    cases = [  # (op with the bug, op without, shape, build, input, check_module's options)
        ("bug.linear_grad", "clean.linear", "8x12 12->20", _linear, x_tokens, linear),
        ("bug.halo_cell", "clean.box_sum", "8x12 c3", _BoxSum, x_field, {}),
    ]
    out = []
    for bug in (False, True):
        for op_bug, op, shape, build, x, kw in cases:

            def layer(d: Domain, build=build, bug=bug) -> nn.Module:
                return build(d, bug)

            out.append(check_module(mesh, op_bug if bug else op, shape, layer, x, grid, **kw).as_dict())
    return out


def _six_rank_run(mesh: DomainMesh) -> dict[str, list[dict]]:
    return {"validator": run_checks(mesh, list(SIX_RANK_OPS)), "bugs": _bug_cases(mesh)}


@functools.cache
def _six_rank_records() -> dict[str, list[dict]]:
    """One spawn of the 2×3 mesh for both tests below."""
    return spawn(parse_mesh(SIX_RANKS), _six_rank_run)[0]


def test_injected_bugs_fail_and_clean_layers_pass_on_2x3() -> None:
    verdicts = {r["op"]: r for r in _six_rank_records()["bugs"]}
    assert verdicts["clean.linear"]["passed"] and verdicts["clean.box_sum"]["passed"]
    bug = verdicts["bug.linear_grad"]
    assert not bug["passed"] and bug["judge_backward"] > 10, bug
    assert bug["extra"]["worst_backward"] == "weight"
    assert bug["judge_forward"] <= 1.0  # only the gradient is wrong
    assert not verdicts["bug.halo_cell"]["passed"]


def test_six_rank_mesh_validates() -> None:
    records = tuple(_six_rank_records()["validator"])
    ops = {r["op"].split(".")[0] for r in records}
    assert {"matmul_channels", "matmul_tokens", "group_norm", "linear"} <= ops, ops
    assert_records_pass(records)
