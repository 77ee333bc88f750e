"""The domain mesh: named axes ``data × ensemble × lat × lon`` over the ranks of a job.

``ensemble`` (default 1) spreads the members of an ensemble over groups of ranks: each member
runs the same model (the same weights) on its own ``lat × lon`` domain group, so for weights,
gradients and checkpoints the ensemble axis is like the data axis (``replicas`` = data ×
ensemble); the ensemble loss reduces over it (``training/crps.py``).

A ``DomainMesh`` is the one object that knows how ranks are arranged. Layers receive it (or one
of its ``Axis`` objects) explicitly. With world size 1 and no launcher it needs no process group
at all, so the same model code runs in a notebook, under ``torchrun`` and under Slurm ``srun``.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ..argtypes import parse_ints
from ..device import resolve_device
from . import shm
from .axis import Axis
from .transport import Transport, Wire, choose_transport, describe_pairs, describe_ranks

__all__ = [
    "COLLECTIVE_FACTOR",
    "Axis",
    "DomainMesh",
    "MeshShape",
    "collective_timeout_s",
    "init_mesh",
    "parse_mesh",
    "rank_transport",
    "slurm_environment",
]

log = logging.getLogger(__name__)
AXES = ("data", "ensemble", "lat", "lon")


@dataclass(frozen=True)
class MeshShape:
    """Sizes of the mesh axes. The domain group is ``lat × lon``; rank order is row-major over
    ``data × ensemble × lat × lon`` (``ensemble`` last in the fields so ``MeshShape(d, lat, lon)``
    keeps its meaning)."""

    data: int = 1
    lat: int = 1
    lon: int = 1
    ensemble: int = 1

    def __post_init__(self) -> None:
        for name in AXES:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"mesh axis {name!r} must be a positive integer, got {value!r}")

    @property
    def world_size(self) -> int:
        return self.data * self.ensemble * self.lat * self.lon

    @property
    def replicas(self) -> int:
        """Groups holding the same weights: data × ensemble."""
        return self.data * self.ensemble

    @property
    def domain_size(self) -> int:
        return self.lat * self.lon

    def __str__(self) -> str:
        if self.ensemble == 1:
            return f"{self.data}x{self.lat}x{self.lon}"
        return f"{self.data}x{self.ensemble}x{self.lat}x{self.lon}"

    @classmethod
    def squarest(cls, nproc: int) -> MeshShape:
        """The squarest ``lat × lon`` mesh of ``nproc`` ranks, longitude the longer side (2×2 for 4)."""
        lat = max(k for k in range(1, int(nproc**0.5) + 1) if nproc % k == 0)
        return cls(1, lat, nproc // lat)

    def describe(self) -> str:
        """``data=2 × ensemble=2 × lat=1 × lon=2`` (the ensemble factor only when it is not 1)."""
        ens = f" × ensemble={self.ensemble}" if self.ensemble != 1 else ""
        return f"data={self.data}{ens} × lat={self.lat} × lon={self.lon}"


def parse_mesh(text: str) -> MeshShape:
    """Parse ``"2x2"`` (lat × lon), ``"2x2x2"`` (data × lat × lon) or ``"1x2x2x2"``
    (data × ensemble × lat × lon)."""
    try:
        sizes = parse_ints(text, "mesh", minimum=0)  # 0 reaches MeshShape, whose error names the axis
    except ValueError:
        sizes = ()
    if len(sizes) == 2:
        return MeshShape(1, sizes[0], sizes[1])
    if len(sizes) == 3:
        return MeshShape(*sizes)
    if len(sizes) == 4:
        return MeshShape(sizes[0], sizes[2], sizes[3], sizes[1])
    raise ValueError(
        f"cannot read mesh {text!r}: write LATxLON (e.g. 2x2), DATAxLATxLON (e.g. 2x2x2) or "
        f"DATAxENSEMBLExLATxLON (e.g. 1x2x1x2)"
    )


class DomainMesh:
    """Ranks arranged as ``data × ensemble × lat × lon``; rank order is row-major over that shape.

    ``coord`` is ``(data, lat, lon)``; ``ensemble_index`` the position on the ensemble axis.
    """

    def __init__(self, shape: MeshShape, rank: int = 0, device: torch.device | None = None):
        self.shape = shape
        self.rank = rank
        self.device = device or torch.device("cpu")
        self.transport = "single process"  # how this rank's messages travel (init_mesh says)
        self.wire = Wire()  # how they travel at run time: every axis of this mesh holds it
        self.hosts: list[str] = []  # each rank's host (init_mesh fills it in; [] for one process)
        group = rank // shape.domain_size  # data × ensemble position
        self.coord = (group // shape.ensemble, (rank // shape.lon) % shape.lat, rank % shape.lon)
        self.ensemble_index = group % shape.ensemble
        self.device_mesh: DeviceMesh | None = None
        d, i, j = self.coord
        e = self.ensemble_index
        self._axes = {
            "data": self._axis("data", [self.global_rank(k, i, j, e) for k in range(shape.data)], d),
            "ensemble": self._axis(
                "ensemble", [self.global_rank(d, i, j, k) for k in range(shape.ensemble)], e
            ),
            # ranks holding the same block of the weights: gradients are summed over them
            "replicas": self._axis(
                "replicas",
                [self.global_rank(a, i, j, b) for a in range(shape.data) for b in range(shape.ensemble)],
                d * shape.ensemble + e,
            ),
            "lat": self._axis("lat", [self.global_rank(d, k, j, e) for k in range(shape.lat)], i),
            "lon": self._axis("lon", [self.global_rank(d, i, k, e) for k in range(shape.lon)], j),
            "domain": self._axis(
                "domain",
                [self.global_rank(d, a, b, e) for a in range(shape.lat) for b in range(shape.lon)],
                i * shape.lon + j,
            ),
            # every rank: the loss value and other whole-job sums (torch's default group)
            "world": self._axis("world", list(range(shape.world_size)), rank),
        }

    def _axis(self, name: str, ranks: list[int], index: int, group: dist.ProcessGroup | None = None) -> Axis:
        return Axis(name, tuple(ranks), index, group, self.wire)

    def global_rank(self, data: int, lat: int, lon: int, ensemble: int = 0) -> int:
        return ((data * self.shape.ensemble + ensemble) * self.shape.lat + lat) * self.shape.lon + lon

    def axis(self, name: str) -> Axis:
        """``"data"``, ``"ensemble"``, ``"replicas"`` (data × ensemble, data-major), ``"lat"``,
        ``"lon"``, ``"domain"`` (lat × lon, lat-major) or ``"world"``."""
        try:
            return self._axes[name]
        except KeyError:
            raise ValueError(f"unknown mesh axis {name!r}; use one of {sorted(self._axes)}") from None

    @property
    def domain(self) -> Axis:
        return self._axes["domain"]

    @property
    def ensemble(self) -> Axis:
        return self._axes["ensemble"]

    @property
    def replicas(self) -> Axis:
        return self._axes["replicas"]

    @property
    def world(self) -> Axis:
        return self._axes["world"]

    @property
    def lat_index(self) -> int:
        return self.coord[1]

    @property
    def lon_index(self) -> int:
        return self.coord[2]

    @property
    def is_distributed(self) -> bool:
        return self.shape.world_size > 1

    def _build_groups(self) -> None:
        """Create process groups; every rank must call this in the same order."""
        shape = self.shape
        wire = self.wire.device_for(self.device)  # where tensors handed to the process group live
        self.device_mesh = init_device_mesh(
            wire.type, (shape.data, shape.ensemble, shape.lat, shape.lon), mesh_dim_names=AXES
        )
        for name in AXES:
            if getattr(shape, name) > 1:
                axis, group = self._axes[name], self.device_mesh[name].get_group()
                self._axes[name] = self._axis(name, list(axis.ranks), axis.index, group)
        # One domain group per (data, ensemble) replica, one replicas group per domain position.
        # new_group must be called by all ranks for all groups, in the same order.
        for d in range(shape.data):
            for e in range(shape.ensemble):
                ranks = [self.global_rank(d, a, b, e) for a in range(shape.lat) for b in range(shape.lon)]
                group = dist.new_group(ranks) if shape.domain_size > 1 else None
                if (d, e) == (self.coord[0], self.ensemble_index):
                    axis = self._axes["domain"]
                    self._axes["domain"] = self._axis("domain", list(axis.ranks), axis.index, group)
        if shape.data > 1 and shape.ensemble > 1:
            for a in range(shape.lat):
                for b in range(shape.lon):
                    pairs = [(d, e) for d in range(shape.data) for e in range(shape.ensemble)]
                    ranks = [self.global_rank(d, a, b, e) for d, e in pairs]
                    group = dist.new_group(ranks)
                    if (a, b) == self.coord[1:]:
                        axis = self._axes["replicas"]
                        self._axes["replicas"] = self._axis("replicas", list(axis.ranks), axis.index, group)
        else:  # one of the two axes has size 1: the replicas are the other one's ranks
            axis, other = self._axes["replicas"], self._axes["data" if shape.data > 1 else "ensemble"]
            self._axes["replicas"] = self._axis("replicas", list(axis.ranks), axis.index, other.group)
        if shape.world_size > 1:
            axis = self._axes["world"]
            self._axes["world"] = self._axis("world", list(axis.ranks), axis.index, dist.group.WORLD)
        # NCCL requires every rank of a group in its first batch_isend_irecv; a halo exchange
        # need not involve all of them, so open each group with a collective. Every rank visits
        # its groups in the same axis order, so this cannot deadlock.
        for name in ("data", "ensemble", "replicas", "lat", "lon", "domain"):
            group = self._axes[name].group
            if group is not None:
                dist.all_reduce(torch.zeros(1, device=wire), group=group)

    def __repr__(self) -> str:
        ens = f", ensemble={self.ensemble_index}" if self.shape.ensemble > 1 else ""
        return f"DomainMesh(shape={self.shape}, rank={self.rank}, coord={self.coord}{ens})"


def _expand_nodelist(nodelist: str) -> list[str]:
    """Expand the first host of a Slurm node list such as ``gpu[003-004,007],cpu01``."""
    hosts: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", nodelist):
        if plain:
            hosts.append(plain)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            for n in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{prefix}{n:0{len(lo)}d}")
    return hosts


def local_ranks() -> int:
    """Ranks of this job on this host: torchrun's ``LOCAL_WORLD_SIZE``, Slurm's tasks per node,
    else 1 (a plain process)."""
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def cores_per_rank() -> int:
    """The CPU cores this process may run on, shared by the ranks of this host (at least 1)."""
    return max(1, len(os.sched_getaffinity(0)) // local_ranks())


def slurm_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """torch.distributed's env:// variables derived from Slurm's, for a job started by ``srun``.

    Returns an empty dict outside Slurm or when the launcher (torchrun) already set ``RANK``.
    """
    env = dict(os.environ if env is None else env)
    if "RANK" in env or "SLURM_PROCID" not in env or "SLURM_NTASKS" not in env:
        return {}
    master = env.get("MASTER_ADDR")
    if not master:
        hosts = _expand_nodelist(env.get("SLURM_JOB_NODELIST", env.get("SLURM_NODELIST", "")))
        master = hosts[0] if hosts else "127.0.0.1"
    port = env.get("MASTER_PORT") or str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000)
    return {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": env["SLURM_NTASKS"],
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "MASTER_ADDR": master,
        "MASTER_PORT": port,
    }


def _check_world(shape: MeshShape, world_size: int) -> None:
    if shape.world_size != world_size:
        raise ValueError(
            f"mesh {shape.describe()} = {shape.world_size} ranks, "
            f"but the job has world size {world_size}; choose mesh factors whose product is "
            f"{world_size} or launch {shape.world_size} processes"
        )


COLLECTIVE_FACTOR = 10


def collective_timeout_s(timeout_s: float) -> float:
    """How long a collective or a transfer waits for a live peer: ``COLLECTIVE_FACTOR × timeout_s``.
    A lost peer ends the job within ``timeout_s`` (``heartbeat.py``: its beats stop), so this
    limit only catches a rank stuck in its own code, and leaves room for a slow first step or a
    long checkpoint write on one rank while the others wait."""
    return COLLECTIVE_FACTOR * timeout_s


def init_mesh(
    shape: MeshShape | None = None,
    *,
    backend: str | None = None,
    timeout_s: float = 600.0,
    transport: str | None = None,
    device: str = "auto",
) -> DomainMesh:
    """Build the mesh for this process: single process, torchrun, or Slurm srun.

    With no launcher variables and a world size of 1 no process group is created. ``shape``
    defaults to ``1 × 1 × world_size`` (all ranks split longitude). ``transport`` (default: the
    ``JIGSAW_TRANSPORT`` environment variable, else ``auto``): ``transport.choose_transport``
    (shared-memory rings between CPU ranks of one host, NCCL between GPUs, messages staged through
    host memory when ranks share a GPU). ``device``: ``distributed.device``
    (``device.resolve_device``; ``auto`` with ``backend="gloo"`` stays on the CPU). Each rank logs
    its device and how its messages travel (``DomainMesh.transport``).
    """
    os.environ.update(slurm_environment())
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    shape = shape or MeshShape(1, 1, world_size)
    _check_world(shape, world_size)
    dev = resolve_device("cpu" if device == "auto" and backend == "gloo" else device)
    mesh = DomainMesh(shape, rank, dev)
    if world_size == 1 and not dist.is_initialized():
        return mesh
    plan = rank_transport(transport, dev, backend)
    if not dist.is_initialized():
        # peers wait timeout_s to arrive, a collective collective_timeout_s; env:// (no store here)
        # without MASTER_ADDR/PORT (torch's error names the variable) or under torchrun's agent store
        store = None
        own = "TORCHELASTIC_USE_AGENT_STORE" not in os.environ
        if own and "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                                  is_master=rank == 0, timeout=timedelta(seconds=timeout_s),
                                  multi_tenant=True)  # fmt: skip
        dist.init_process_group(
            plan.backend,
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=collective_timeout_s(timeout_s)),
            device_id=plan.bound_device(dev),
        )
    _check_world(shape, dist.get_world_size())
    mesh.wire.staged = plan.staged
    mesh._build_groups()
    mesh.wire.rings = shm.connect(collective_timeout_s(timeout_s)) if plan.rings else None
    shared = f" (shared by {plan.sharing} ranks)" if plan.sharing > 1 else ""
    mesh.transport = f"{dev}{shared}: {plan.describe(mesh.wire.rings is not None)}"
    me = (socket.gethostname(), mesh.transport, sorted(mesh.wire.ring_peers()), plan.describe(False))
    everyone: list = [None] * world_size
    dist.all_gather_object(everyone, me)
    mesh.hosts = [e[0] for e in everyone]
    if rank == 0:  # the other ranks log warnings only
        log.info("messages between ranks: %s", describe_ranks([e[1] for e in everyone]))
        if len(set(mesh.hosts)) > 1 or plan.rings:
            pairs = describe_pairs(mesh.hosts, [frozenset(e[2]) for e in everyone], [e[3] for e in everyone])
            log.info("transport per pair: %s", pairs)
    log.debug("rank %d: %r", rank, mesh)
    return mesh


def rank_transport(transport: str | None, device: torch.device, backend: str | None) -> Transport:
    """This rank's ``Transport``: ``transport`` (default ``JIGSAW_TRANSPORT``, else ``auto``) for
    ``device`` with this host's ranks (``local_ranks``)."""
    request = transport or os.environ.get("JIGSAW_TRANSPORT", "auto")
    return choose_transport(request, device, backend, local_ranks())
