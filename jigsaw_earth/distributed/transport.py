"""How a rank's messages travel: the process-group backend, and whether device tensors cross ranks
through host memory. Decided once per rank, before the process group starts (``init_mesh``), from
``distributed.transport`` (or ``JIGSAW_TRANSPORT``), ``distributed.backend``, the device and how many
ranks share this host's devices:

==========================  =======================  =======  ======================================
ranks on                    distributed.transport    backend  messages
==========================  =======================  =======  ======================================
CPU                         auto (or host)           gloo     point-to-point through shared-memory
                                                              rings (one host), collectives by gloo
CPU                         backend                  gloo     everything by gloo
GPUs, one rank per GPU      auto or backend          NCCL     device tensors straight to NCCL
GPUs shared (more ranks on  auto or host             gloo     staged: copied to pinned host memory,
a host than its GPUs), or                                     carried as between CPU ranks, copied
``host`` asked                                                back to the device
==========================  =======================  =======  ======================================

NCCL refuses two ranks on one GPU, so ranks that share one stage their messages; one rank per GPU
keeps NCCL with no staging. ``comm.py`` does the staging; ``shm.py`` the rings.

The transport is chosen per pair of ranks: the rings join the ranks of one host (``shm.connect``
groups the ranks by host), and a message to a rank on another host goes through the process group
(gloo, or NCCL between GPUs). A job on two hosts keeps its rings within each host. What a mesh's
messages travel by at run time is its ``Wire`` (``DomainMesh.wire``, held by each of its ``Axis``
objects): the rings, whether device tensors are staged, whether exchanges overlap compute.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

from ..device import default_backend, device_count

__all__ = [
    "TRANSPORTS",
    "Transport",
    "Wire",
    "choose_transport",
    "describe_pairs",
    "describe_ranks",
    "rank_spans",
]

TRANSPORTS = ("auto", "backend", "host")


@dataclass(frozen=True)
class Transport:
    """``backend``: the process group's; ``staged``: device tensors cross ranks through host memory;
    ``rings``: point-to-point messages through the shared-memory rings when every rank is on one host;
    ``sharing``: ranks of this host per device (1: a device each)."""

    backend: str
    staged: bool
    rings: bool
    sharing: int = 1

    def bound_device(self, device: torch.device) -> torch.device | None:
        """The device the process group is bound to (``init_process_group(device_id=...)``): the
        rank's accelerator when the backend carries device tensors, else none."""
        return device if device.type != "cpu" and not self.staged else None

    def describe(self, rings_connected: bool) -> str:
        """One line for the log: how this rank's messages travel."""
        if not self.staged and self.backend != "gloo":
            return f"{self.backend}, device to device"
        carrier = "shared-memory rings and gloo" if rings_connected else "gloo"
        return f"staged through pinned host memory, {carrier}" if self.staged else carrier


def _overlap_default() -> bool:
    """``JIGSAW_OVERLAP=off`` sets the default of processes that build no Trainer (the validator,
    benchmarks, tests); the trainer sets ``distributed.overlap``."""
    return os.environ.get("JIGSAW_OVERLAP", "on").lower() != "off"


@dataclass
class Wire:
    """How the messages of one mesh travel at run time (``comm.exchange`` and ``comm.all_reduce_``
    read it from the axis they are given).

    ``rings``: a ``shm.SharedMemoryTransport`` carrying CPU point-to-point messages to the ranks of
    this host (``rings.peers``), or None; every other pair goes through the process group.
    ``staged``: device tensors cross ranks through pinned host memory. ``overlap``: exchanges return
    before their transfers complete (``distributed.overlap``)."""

    rings: Any = None
    staged: bool = False
    overlap: bool = field(default_factory=_overlap_default)

    def device_for(self, device: torch.device) -> torch.device:
        """Where a tensor handed to the process group lives: the CPU when messages are staged, else
        ``device`` (the rank's own: NCCL takes device tensors only)."""
        return torch.device("cpu") if self.staged else device

    def ring_peers(self) -> frozenset[int]:
        """The global ranks this rank reaches through the shared-memory rings."""
        return frozenset(self.rings.peers) if self.rings is not None else frozenset()


def choose_transport(request: str, device: torch.device, backend: str | None, local_ranks: int) -> Transport:
    """The transport of a rank computing on ``device`` with ``local_ranks`` ranks on its host.
    ``backend``: ``distributed.backend`` when set (None: auto)."""
    if request not in TRANSPORTS:
        raise ValueError(
            f"distributed.transport={request!r}: use auto (shared-memory rings between CPU ranks of one "
            f"host, NCCL between GPUs, staged through host memory when ranks share a GPU), host (stage "
            f"device tensors through host memory) or backend (the process group's own)"
        )
    rings = request != "backend"
    if device.type == "cpu":
        return Transport(backend or "gloo", False, rings)
    native = default_backend(device)
    gpus = max(1, device_count(device.type))
    sharing = -(-local_ranks // gpus)
    if backend == native or (backend is None and request != "host" and sharing == 1):
        if sharing > 1:
            raise ValueError(
                f"distributed.backend={native}: {local_ranks} ranks on this host share its {gpus} "
                f"{device.type} device(s), and {native} refuses two ranks on one device; set "
                f"distributed.backend=auto (ranks that share a device stage their messages through host "
                f"memory) or launch at most {gpus} ranks per host"
            )
        if request == "host":
            raise ValueError(
                f"distributed.transport=host stages messages through host memory, which {native} does "
                f"not carry; set distributed.backend=auto or gloo with it"
            )
        return Transport(native, False, False, sharing)
    return Transport(backend or "gloo", True, rings, sharing)


def describe_ranks(transports: list[str], shown: int = 16) -> str:
    """Every rank's ``DEVICE: HOW`` (``DomainMesh.transport``) in one line, ranks grouped by how their
    messages travel: ``fakenccl, device to device: rank 0 fakegpu:0, rank 1 fakegpu:1``."""
    groups: dict[str, list[str]] = {}
    for rank, line in enumerate(transports):
        device, _, how = line.partition(": ")
        groups.setdefault(how, []).append(f"rank {rank} {device}")
    parts = []
    for how, ranks in groups.items():
        more = f", … ({len(ranks)} ranks)" if len(ranks) > shown else ""
        parts.append(f"{how}: {', '.join(ranks[:shown])}{more}")
    return "; ".join(parts)


def rank_spans(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` → ``0-2, 5``."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def describe_pairs(hosts: list[str], ring_peers: list[frozenset[int]], between: list[str]) -> str:
    """The transport of every pair of ranks in one line: the hosts with their ranks, and how many
    pairs each way carries. ``hosts[r]``: rank r's host; ``ring_peers[r]``: the ranks it reaches by
    the rings; ``between[r]``: how it reaches the others (the process group: ``gloo``, ``nccl,
    device to device``, ``staged through pinned host memory, gloo``)."""
    world = len(hosts)
    by_host: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        by_host.setdefault(host, []).append(rank)
    counts: dict[str, int] = {}
    for a in range(world):
        for b in range(a + 1, world):
            where = "within a host" if hosts[a] == hosts[b] else "between hosts"
            how = "shared-memory rings" if b in ring_peers[a] else between[a]
            counts[f"{how} ({where})"] = counts.get(f"{how} ({where})", 0) + 1
    placed = ", ".join(f"{host} ranks {rank_spans(ranks)}" for host, ranks in by_host.items())
    pairs = ", ".join(f"{how} {n}" for how, n in counts.items())
    return f"{len(by_host)} host(s): {placed}; pairs of ranks by transport: {pairs}"
