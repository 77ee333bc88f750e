"""Shared pytest fixtures: one spawned process group per mesh, reused by every test module."""

from __future__ import annotations

import functools
import signal

import pytest

from jigsaw_earth.distributed.mesh import MeshShape, parse_mesh
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.validation.registry import run_checks

CORE_MESHES = ["1x1", "1x2", "2x1", "2x2", "1x4", "3x1", "1x3"]


def slow_unless(values: list, default: tuple) -> list:
    """``values`` as test parameters, those not in ``default`` marked slow: the default run keeps a
    representative set (an even 2-D mesh and an uneven one), ``-m slow`` the rest."""
    return [pytest.param(v, marks=[] if v in default else [pytest.mark.slow]) for v in values]


@functools.cache
def validator_records(mesh: str, ops: tuple[str, ...]) -> tuple[dict, ...]:
    """Run the validator's checks for ``ops`` on ``mesh`` once per test session."""
    shape: MeshShape = parse_mesh(mesh)
    return tuple(spawn(shape, run_checks, list(ops))[0])


def assert_records_pass(records: tuple[dict, ...]) -> None:
    assert records, "the validator returned no records"
    failed = [
        f"{r['op']} {r['mesh']} {r['shape']}: err fwd {r['error_forward']:.2e} bwd {r['error_backward']:.2e}"
        f" (serial {r['serial_error_forward']:.2e} / {r['serial_error_backward']:.2e}, judge"
        f" {r['judge_forward']:.2f} / {r['judge_backward']:.2f}, tol {r['tolerance']})"
        f" bytes {r['comm_bytes']} expected {r['expected_bytes']} extra {r['extra']}"
        for r in records
        if not r["passed"]
    ]
    assert not failed, "\n".join(failed)


@pytest.fixture(scope="session")
def records_for():
    return validator_records


@pytest.fixture
def quiet_signals():
    """A signal arriving after predict has returned must not end pytest."""
    saved = {s: signal.signal(s, lambda *a: None) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)
