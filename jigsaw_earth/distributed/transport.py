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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..device import default_backend, device_count

__all__ = ["TRANSPORTS", "Transport", "choose_transport", "describe_ranks"]

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
