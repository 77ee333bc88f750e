"""The shared-memory transport between CPU ranks of one host: every byte arrives, in order per
(peer, tag), with messages larger than the ring, receives posted in another tag order than the
sends, any dtype, empty tensors skipped; and it is what the distributed core uses on CPU."""

from __future__ import annotations

import glob
import os

import pytest
import torch

from jigsaw_earth.distributed import comm, shm
from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.distributed.spawn import spawn

DTYPES = (torch.float32, torch.bfloat16, torch.int64)


def _payload(src: int, dst: int, tag: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    """What rank ``src`` sends ``dst`` as its ``k``-th message with ``tag`` (sizes 0 to 3 MiB)."""
    n = (0, 7, 1000, 3 * (1 << 20) // 4 + 5)[k % 4]
    g = torch.Generator().manual_seed(1000 * src + 100 * dst + 10 * tag + k)
    return (torch.randn(n, generator=g) * 100).to(dtype)


def _exchange_everything(mesh: DomainMesh) -> dict:
    """Small rings (1 MiB: a 3 MiB message streams through), every pair, three tags, four messages
    each; receives posted tag 2 first, then 1, then 0, against sends posted 0, 1, 2."""
    assert mesh.wire.rings is not None, "CPU ranks of one host use the shared-memory transport"
    shm.RING_BYTES = 1 << 20
    mesh.wire.rings = shm.connect(60.0)
    torch.distributed.barrier()
    left_behind = glob.glob("/dev/shm/jigsaw-*")
    rank, world = mesh.rank, mesh.shape.world_size
    axis = mesh.axis("lon")
    peers = [p for p in range(world) if p != rank]
    checked = 0
    for dtype in DTYPES:
        posted = []
        for tag in (0, 1, 2):
            for k in range(4):
                sends = [(p, _payload(rank, p, tag, k, dtype)) for p in peers]
                posted.append(
                    comm.exchange(axis, sends, [], op="test.send", dtype=dtype, device=mesh.device, tag=tag)
                )
        for tag in (2, 1, 0):
            for k in range(4):
                recvs = [(p, _payload(p, rank, tag, k, dtype).shape) for p in peers]
                got = comm.exchange(
                    axis, [], recvs, op="test.recv", dtype=dtype, device=mesh.device, tag=tag
                ).wait()
                for p, t in zip(peers, got):
                    assert torch.equal(t, _payload(p, rank, tag, k, dtype)), (p, tag, k, dtype)
                    checked += 1
        for pending in posted:
            pending.wait()
    return {"checked": checked, "left_behind": left_behind, "pid": os.getpid()}


@pytest.mark.parametrize("lon", [2, 3])
def test_every_message_arrives_in_order_per_peer_and_tag(lon: int) -> None:
    results = spawn(MeshShape(1, 1, lon), _exchange_everything)
    for r in results:
        assert r["checked"] == len(DTYPES) * 3 * 4 * (lon - 1)
        assert not r["left_behind"], "ring files are unlinked once every rank has mapped them"


def _sizes_disagree(mesh: DomainMesh) -> str:
    axis = mesh.axis("lon")
    peer = axis.peer(1)
    send = comm.exchange(
        axis, [(peer, torch.zeros(8 + mesh.rank))], [], op="t", dtype=torch.float32, device=mesh.device
    )
    try:
        comm.exchange(axis, [], [(peer, (8,))], op="t", dtype=torch.float32, device=mesh.device).wait()
    except RuntimeError as err:
        return str(err)
    finally:
        del send
    return ""


def test_a_size_mismatch_is_a_clear_error() -> None:
    errors = spawn(MeshShape(1, 1, 2), _sizes_disagree)
    assert errors[1] == "", errors  # rank 0 expects 8 values from rank 1, which sends 9
    assert "rank 1 sent 36 bytes with tag 0 where this rank posted a receive of 32" in errors[0], errors
