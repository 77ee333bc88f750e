"""Validator checks for ensembles: the members' gather over the ensemble axis, the ensemble CRPS
loss (value and input gradients) with members over the ensemble axis and the field over lat × lon,
and the gradient sum over the replicas (data × ensemble).

Every rank builds the same global members ``(M, B, C, H, W)`` from a fixed seed; rank
``(e, tile)`` holds members ``[e·m, (e+1)·m)`` of its tile. The serial reference is the loss of
all members on the whole grid (``training.crps.ensemble_crps``, float32 and float64), so the
sharded local terms summed over every rank must give its value and their input gradients its
gradient. Expected bytes are closed-form: each rank receives the other ``E − 1`` ranks' members of
its tile once per loss.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..distributed.comm import all_reduce_, ledger, ring_bytes
from ..distributed.grads import reduce_gradients
from ..distributed.mesh import DomainMesh
from ..distributed.tiles import TileGrid
from ..training.crps import ensemble_crps, gather_members
from .core_checks import serial_pair
from .registry import Record, compare, measure, register

MEMBERS_PER_RANK = (1, 2)
GRIDS = [(8, 12), (7, 10)]
LOSSES = [("crps", 0.0, 0.0), ("fair_crps", 1.0, 0.0), ("almost_fair_crps", 0.95, 0.5)]
B, C = 2, 3


def mesh_name(mesh: DomainMesh) -> str:
    """``e2/2x3``: ensemble groups / lat x lon (``2x3`` without an ensemble axis, as the other ops)."""
    domain = f"{mesh.shape.lat}x{mesh.shape.lon}"
    return domain if mesh.shape.ensemble == 1 else f"e{mesh.shape.ensemble}/{domain}"


def _members(n_lat: int, n_lon: int, n: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    pred = torch.randn(n, B, C, n_lat, n_lon, generator=gen)
    target = torch.randn(B, C, n_lat, n_lon, generator=gen)
    lat_w = torch.rand(n_lat, generator=gen) + 0.5
    ch_w = torch.tensor([1.0, 0.5, 2.0])
    return pred, target, lat_w, ch_w


def _gather_bytes(mesh: DomainMesh, m: int, n_lat: int, n_lon: int) -> int:
    """Every rank receives (E − 1) · m members of its tile: summed over ranks, float32."""
    e = mesh.shape.ensemble
    return e * (e - 1) * m * B * C * n_lat * n_lon * 4


def _cases(mesh: DomainMesh) -> Iterator[tuple[int, int, int, TileGrid]]:
    for n_lat, n_lon in GRIDS:
        if n_lat < mesh.shape.lat or n_lon < mesh.shape.lon:
            continue
        for m in MEMBERS_PER_RANK:
            yield n_lat, n_lon, m, TileGrid(n_lat, n_lon, mesh.shape.lat, mesh.shape.lon)


@register("ensemble_gather")
def check_gather(mesh: DomainMesh) -> Iterator[Record]:
    """Every rank's members of its tile, gathered over the ensemble axis in member order."""
    for n_lat, n_lon, m, grid in _cases(mesh):
        n = m * mesh.shape.ensemble
        pred, *_ = _members(n_lat, n_lon, n, n_lat * n_lon + m)
        ls, lo = grid.tile_of(mesh.domain.index).slices
        mine = pred[mesh.ensemble_index * m : (mesh.ensemble_index + 1) * m][..., ls, lo]
        ledger.reset()
        got = gather_members(mine, mesh.ensemble)
        want = pred[..., ls, lo]
        rec = Record(
            "ensemble_gather",
            mesh_name(mesh),
            f"{n_lat}x{n_lon} M={n} m={m}",
            expected_bytes=_gather_bytes(mesh, m, n_lat, n_lon),
        )
        yield measure(rec, [compare(got, want.double(), want)], [], ledger.bytes_sent)


@register("ensemble_crps")
def check_crps(mesh: DomainMesh) -> Iterator[Record]:
    """The loss's local terms summed over every rank, and their input gradients, against the
    serial loss of all members on the whole grid."""
    for n_lat, n_lon, m, grid in _cases(mesh):
        n = m * mesh.shape.ensemble
        pred, target, lat_w, ch_w = _members(n_lat, n_lon, n, 7 * n_lat + n_lon + m)
        ls, lo = grid.tile_of(mesh.domain.index).slices
        first = mesh.ensemble_index * m
        for kind, alpha, mse_weight in LOSSES:

            def serial(x, alpha=alpha, mse_weight=mse_weight, target=target, lat_w=lat_w, ch_w=ch_w):
                return [
                    ensemble_crps(
                        x, target.to(x.dtype), lat_w.to(x.dtype), ch_w.to(x.dtype), alpha=alpha,
                        mse_weight=mse_weight,
                    )
                ]  # fmt: skip

            (o32,), (g32,), (o64,), (g64,) = serial_pair(serial, [pred], [torch.ones(())])
            x = pred[first : first + m][..., ls, lo].clone().requires_grad_(True)
            ledger.reset()
            local = ensemble_crps(
                x,
                target[..., ls, lo],
                lat_w[ls],
                ch_w,
                alpha=alpha,
                members=mesh.ensemble,
                mse_weight=mse_weight,
            )
            sent = ledger.bytes_sent
            local.backward()
            total = all_reduce_(local.detach().clone(), mesh.world, op="validate.loss")
            block = (slice(first, first + m), Ellipsis, ls, lo)
            rec = Record(
                "ensemble_crps",
                mesh_name(mesh),
                f"{n_lat}x{n_lon} M={n} m={m} {kind} a={alpha} mse={mse_weight}",
                expected_bytes=_gather_bytes(mesh, m, n_lat, n_lon),
            )
            yield measure(
                rec, [compare(total, o64, o32)], [compare(x.grad, g64[block], g32[block])], sent, ["members"]
            )


@register("ensemble_grad_sum")
def check_grad_sum(mesh: DomainMesh) -> Iterator[Record]:
    """Weight gradients summed over the replicas (data × ensemble) in flat buckets."""
    reps = mesh.replicas
    for numel in (5, 1000):
        gen = torch.Generator().manual_seed(numel)
        grads = torch.randn(reps.size, numel, generator=gen)
        p = torch.nn.Parameter(torch.zeros(numel))
        p.grad = grads[reps.index].clone()
        ledger.reset()
        reduce_gradients([p], reps, op="grad.data", bucket_elems=64)
        want32, want64 = grads.sum(0), grads.double().sum(0)
        rec = Record(
            "ensemble_grad_sum",
            mesh_name(mesh),
            f"{numel} elements over {reps.size} replicas",
            expected_bytes=mesh.shape.world_size * ring_bytes("all_reduce", 4 * numel, reps.size),
        )
        yield measure(rec, [compare(p.grad, want64, want32)], [], ledger.bytes_sent)
