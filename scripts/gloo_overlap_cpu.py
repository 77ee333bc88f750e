"""CPU that gloo's transport thread spends per message exchanged between two local ranks: messages
back to back, with compute while each is in flight (as the jigsaw rings do), and with compute
between messages that are waited at once. Two processes, one torch thread each; 0.5 MiB both ways
(the size of WeatherMixer small's weight-ring and token-ring messages at 64 x 128).

    python scripts/gloo_overlap_cpu.py [--mib 32] [--gemms 30]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist

from jigsaw_earth.bench.scaling import comm_thread_cpu
from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.distributed.spawn import spawn

MESSAGE = 512 << 10
MODES = ("back_to_back", "compute_in_flight", "compute_between")


def worker(mesh: DomainMesh, total: int, gemms: int) -> dict:
    peer, out = 1 - mesh.rank, {}
    buf, got, m = torch.ones(MESSAGE // 4), torch.empty(MESSAGE // 4), torch.randn(256, 256)
    n = total // MESSAGE
    for mode in MODES:
        dist.barrier()
        g0, t0 = comm_thread_cpu(), time.perf_counter()
        for _ in range(n):
            if mode == "compute_between":
                for _ in range(gemms):
                    m = m @ m * 0.01
            ops = [dist.P2POp(dist.isend, buf, peer), dist.P2POp(dist.irecv, got, peer)]
            works = dist.batch_isend_irecv(ops)
            if mode == "compute_in_flight":
                for _ in range(gemms):
                    m = m @ m * 0.01
            for w in works:
                w.wait()
        out[mode] = {"wall_ms_per_message": (time.perf_counter() - t0) * 1e3 / n,
                     "gloo_thread_cpu_ms_per_message": (comm_thread_cpu() - g0) * 1e3 / n}  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=32, help="MiB each rank sends per mode (32)")
    p.add_argument("--gemms", type=int, default=30, help="256^3 GEMMs of compute per message (30)")
    args = p.parse_args()
    ranks = spawn(MeshShape(1, 1, 2), worker, args.mib << 20, args.gemms)
    print(json.dumps({f"rank{r}": v for r, v in enumerate(ranks)}, indent=1))


if __name__ == "__main__":
    main()
