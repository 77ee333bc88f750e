"""The device guard on many ranks: each rank on its own fake accelerator (``fakegpu:<local rank>``),
every ``torch.distributed`` call held to NCCL's rules (``fakegpu/nccl.py``), and ranks that share a
device staging their messages through host memory (``distributed/transport.py``).

The ranks of a spawn or of ``python -m tests.fakegpu COMMAND`` get the fake through
``JIGSAW_DEVICE_PLUGIN``. ``selftest --nproc 4`` runs the three models (every kind of exchange) on a
2 × 2 mesh with uneven tiles against the CPU, and each rank reports its calls: no CPU tensor reaches
NCCL. The three bug classes a CPU test cannot see are put back one at a time (monkeypatched in the
ranks) and the guard names the call and the rank of each.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from jigsaw_earth.device import PLUGIN_ENV
from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.distributed.spawn import spawn

from .test_device_guard import ENV

FAKE = "tests.fakegpu"  # the plugin, by module name (the ranks inherit this process's sys.path)


def _selftest(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """``python -m tests.fakegpu selftest --device fakegpu ARGS`` with every rank reporting its
    calls; the run and the reports of the ranks that made ``torch.distributed`` calls."""
    reports = tmp_path / "reports"
    reports.mkdir()
    run = subprocess.run(
        [sys.executable, "-m", FAKE, "selftest", "--device", "fakegpu", *args, "--workdir", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=1200,
        env={**ENV, "FAKEGPU_REPORT": str(reports), "FAKENCCL_RECORD": "1", **env},
    )  # fmt: skip
    ranks = [json.loads(p.read_text()) for p in sorted(reports.glob("rank-*.json"))]
    return run, [r for r in ranks if r["calls"]]


@pytest.mark.slow
def test_four_fake_gpus_train_and_forecast_as_the_cpu(tmp_path: Path) -> None:
    """The WeatherMixer, a UNet and a local-attention ViT on a 2 × 2 mesh of fake GPUs (uneven tiles:
    7 / 6 rows): training with validation and checkpoints, a resume on the CPU, predict --score, all
    equal to one CPU process; every rank on its own device with NCCL, and not one CPU tensor handed
    to NCCL (counted over every call of every rank)."""
    run, ranks = _selftest(tmp_path, "--nproc", "4")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-6000:]
    assert "PASS: fakegpu (mesh 2x2, 4 processes)" in run.stdout
    rows = [line for line in run.stdout.splitlines() if line.endswith(("PASS", "FAIL"))]
    assert len(rows) == 15 and all(r.endswith("PASS") for r in rows), run.stdout
    for rank in range(4):
        assert f"rank {rank}: fakegpu:{rank}: fakenccl, device to device" in run.stdout, run.stdout
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3], ranks
    handed = [h for r in ranks for h in r["cpu_handoffs"]]
    assert not handed, "CPU tensors handed to NCCL:\n" + "\n".join(handed)
    for r in ranks:  # the count covers every kind of call the run makes (a gloo group's, the
        # background checkpoint's, carries host tensors only: the guard refuses device ones there)
        kinds = {k.split()[1] for k in r["calls"] if k.startswith("fakenccl ")}
        assert {"allreduce_", "send", "recv_", "allgather_", "broadcast_", "barrier"} <= kinds, r["calls"]


@pytest.mark.slow
def test_ranks_sharing_one_fake_gpu_stage_their_messages(tmp_path: Path) -> None:
    """Two ranks on a host with one device: both on fakegpu:0, no NCCL group (it would refuse them),
    every message through pinned host memory (shared-memory rings and gloo); the same numbers."""
    run, ranks = _selftest(tmp_path, "--nproc", "2", "--models", "unet", FAKEGPU_COUNT="1")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-6000:]
    for rank in (0, 1):
        line = f"rank {rank}: fakegpu:0 (shared by 2 ranks): staged through pinned host memory, shared-memory"
        assert line in run.stdout, run.stdout
    assert all(r.endswith("PASS") for r in run.stdout.splitlines() if r.startswith("unet:")), run.stdout
    assert ranks and all(k.startswith("gloo ") for r in ranks for k in r["calls"]), ranks


def _patched(module: Any, name: str, value: Any) -> contextlib.AbstractContextManager:
    @contextlib.contextmanager
    def patch() -> Iterator[None]:
        before = getattr(module, name)
        setattr(module, name, value)
        try:
            yield
        finally:
            setattr(module, name, before)

    return patch()


def _error(fn: Callable[[], Any]) -> str:
    try:
        fn()
    except RuntimeError as err:
        return f"{type(err).__name__}: {str(err).splitlines()[0]}"
    return "no error"


def _bugs_put_back(mesh: DomainMesh, root: str) -> dict[str, Any]:
    """On a 1 × 2 mesh of fake GPUs: host reads per training step of a UNet, then each bug class
    put back in turn and the guard's error on this rank."""
    import jigsaw_earth.distributed.halo as halo_module
    import jigsaw_earth.layers.norm as norm
    from jigsaw_earth.config import parse_config
    from jigsaw_earth.distributed import comm
    from jigsaw_earth.distributed.halo import Halo, halo_exchange
    from jigsaw_earth.layers.base import Domain
    from jigsaw_earth.mesh_setup import setup_mesh
    from jigsaw_earth.selftest import tiny_config
    from jigsaw_earth.training.loop import Trainer

    fake = sys.modules[FAKE]  # the plugin this rank activated
    cfg = parse_config(tiny_config(Path(root), "steps", "fakegpu", 2, "unet"))
    trainer = Trainer(cfg, setup_mesh(cfg))
    reads = []
    for step in (1, 2, 3, 4):
        before = len(fake.active().host_reads)
        trainer.train_step(step)
        reads.append(len(fake.active().host_reads) - before)
    places = fake.active().host_reads[-reads[-1] :] if reads[-1] else []
    out: dict[str, Any] = {"reads": reads, "places": places}

    def cpu_all_reduce(t: torch.Tensor, axis: Any, **kw: Any) -> torch.Tensor:
        return comm.all_reduce_(t.cpu(), axis, **kw)

    with _patched(norm, "all_reduce_", cpu_all_reduce):  # GroupNorm's statistics, on the host
        out["cpu tensor into an all-reduce"] = _error(lambda: trainer.train_step(5))

    grid, axis = Domain.create(mesh, 13, 28).grid, mesh.domain
    x = torch.randn(2, 3, *grid.tile(0, mesh.lon_index).shape, device=mesh.device)
    halo = Halo.uniform(1, "zeros")

    def on_device_0(axis: Any, sends: Any, recvs: Any, **kw: Any) -> Any:
        return comm.exchange(axis, sends, recvs, **{**kw, "device": torch.device(kw["device"].type, 0)})

    with _patched(halo_module, "exchange", on_device_0):  # the receive buffers on device 0
        out["halo buffer on device 0"] = failed = _error(lambda: halo_exchange(x, grid, halo, axis))
    if failed != "no error":
        halo_exchange(x, grid, halo, axis)  # the peer's messages, so it finishes too

    def reading(axis: Any, sends: Any, recvs: Any, **kw: Any) -> Any:
        float(sends[0][1].sum())  # an `if` on a device value, a .item(): the host waits for the device
        return comm.exchange(axis, sends, recvs, **kw)

    with _patched(halo_module, "exchange", reading):  # in a training step: inside the conv's exchange
        out["host read inside the halo exchange"] = _error(lambda: trainer.train_step(6))
    dist.barrier()
    return out


def test_the_guard_fails_on_each_bug_put_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU tensor into an all-reduce (GroupNorm's statistics), a halo buffer on device 0 for rank
    1, a host read inside the halo exchange: each refused, naming the call, the rank and the place;
    and a training step reads the host once per rank (loss and gradient norm together)."""
    from jigsaw_earth.selftest import tiny_store

    tiny_store(tmp_path / "data.zarr")
    monkeypatch.setenv(PLUGIN_ENV, FAKE)
    ranks = spawn(MeshShape(1, 1, 2), _bugs_put_back, str(tmp_path), device="fakegpu", timeout_s=600)
    for rank, got in enumerate(ranks):
        assert got["reads"][1:] == [1, 1, 1], (rank, got["reads"], got["places"])
        cpu = got["cpu tensor into an all-reduce"]
        assert cpu.startswith(f"NcclRule: rank {rank}: allreduce_ got a CPU tensor"), cpu
        assert "jigsaw_earth/layers/norm.py" in cpu and "site 'GroupNorm'" in cpu, cpu
        host = got["host read inside the halo exchange"]
        assert host.startswith(f"HostRead: rank {rank}: aten._local_scalar_dense"), host
        assert "inside the communication site" in host, host
    wrong = ranks[1]["halo buffer on device 0"]
    assert wrong.startswith("NcclRule: rank 1: recv_ got a tensor on fakegpu:0"), wrong
    assert "but this rank's device is fakegpu:1" in wrong, wrong
    assert "jigsaw_earth/distributed/halo.py" in wrong, wrong
    assert ranks[0]["halo buffer on device 0"] == "no error"  # device 0 is rank 0's own


def _nccl_rules(mesh: DomainMesh) -> dict[str, str]:
    """NCCL's rules on groups made here (the world group is gloo): each case refused on every rank."""
    module = torch.get_device_module("fakegpu")
    rank = dist.get_rank()
    out = {"group before set_device": _error(lambda: dist.new_group([0, 1], backend="fakenccl"))}
    module.set_device(0)
    out["two ranks on one device"] = _error(lambda: dist.new_group([0, 1], backend="fakenccl"))
    module.set_device(rank)
    group = dist.new_group([0, 1], backend="fakenccl")
    mine = torch.ones(3, device="fakegpu")
    out["cpu tensor"] = _error(lambda: dist.all_reduce(torch.ones(3), group=group))
    other = mine.to(f"fakegpu:{1 - rank}")
    out["another rank's device"] = _error(lambda: dist.all_reduce(other, group=group))
    uneven = torch.ones(3 + rank, device="fakegpu")
    out["sizes differ"] = _error(lambda: dist.all_reduce(uneven, group=group))
    out["all-gather output"] = _error(
        lambda: dist.all_gather_single(torch.empty(5, device="fakegpu"), mine, group=group)
    )
    gathered: list = [None, None]
    dist.all_gather_object(gathered, rank, group=group)  # on the current device: allowed
    dist.all_reduce(mine, group=group)
    out["allowed"] = f"{gathered} {mine.cpu().tolist()}"
    return out


def test_the_guard_refuses_what_nccl_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLUGIN_ENV, FAKE)
    for rank, got in enumerate(spawn(MeshShape(1, 1, 2), _nccl_rules, device="cpu", timeout_s=300)):
        assert "created before set_device" in got["group before set_device"], got
        duplicate = got["two ranks on one device"]
        assert "(Duplicate GPU detected): ranks 0 and 1 both on fakegpu:0" in duplicate, got
        assert f"rank {rank}: allreduce_ got a CPU tensor" in got["cpu tensor"], got
        assert f"this rank's device is fakegpu:{rank}" in got["another rank's device"], got
        assert "entered different collectives" in got["sizes differ"], got
        assert "the group times the shard" in got["all-gather output"], got
        assert got["allowed"] == "[0, 1] [2.0, 2.0, 2.0]", got


def test_the_transport_of_a_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """One rank per GPU keeps NCCL; more ranks on a host than its GPUs (or ``host`` asked) stage
    through host memory over gloo; NCCL asked for ranks that share a GPU is refused with the fix."""
    from jigsaw_earth.distributed import transport

    monkeypatch.setattr(transport, "device_count", lambda kind: 2)
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    choose = transport.choose_transport
    assert choose("auto", gpu, None, 2) == transport.Transport("nccl", False, False, 1)
    assert choose("backend", gpu, None, 2) == transport.Transport("nccl", False, False, 1)
    assert choose("auto", gpu, None, 4) == transport.Transport("gloo", True, True, 2)
    assert choose("host", gpu, None, 2) == transport.Transport("gloo", True, True, 1)
    assert choose("backend", gpu, None, 3) == transport.Transport("gloo", True, False, 2)
    assert choose("auto", cpu, None, 4) == transport.Transport("gloo", False, True, 1)
    assert choose("backend", cpu, None, 4) == transport.Transport("gloo", False, False, 1)
    assert choose("auto", gpu, None, 2).bound_device(gpu) == gpu
    assert choose("auto", gpu, None, 4).bound_device(gpu) is None
    with pytest.raises(ValueError, match=r"4 ranks on this host share its 2 cuda device.*backend=auto"):
        choose("auto", gpu, "nccl", 4)
    with pytest.raises(ValueError, match="transport=host stages messages through host memory"):
        choose("host", gpu, "nccl", 2)
    with pytest.raises(ValueError, match=r"distributed\.transport='nvlink': use auto"):
        choose("nvlink", gpu, None, 2)
