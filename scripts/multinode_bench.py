"""The demo's step on simulated hosts: 1 host × 4 ranks, 2 hosts × 2 with the transport per pair
(shared-memory rings within a host, gloo between) and with gloo everywhere, and, with ``--mbit``,
2 hosts × 2 with the link between the hosts shaped to that bandwidth, against ``plan``'s prediction.

    sudo python scripts/multinode_bench.py --dir runs/multinode-bench [--repeats 3] [--steps 20] [--mbit 200]
    sudo python scripts/multinode_bench.py --dir runs/multinode-bench --faults [--timeout-s 120]

Needs root (network, UTS and mount namespaces: ``tests/simhosts.py``). The simulated hosts share this
machine's cores unless ``--own-cores`` gives each half of them (as separate machines have their own:
the shared-memory transport spins only where a host has a core per rank); 1 host × 4 always runs on
every core. Every configuration runs once
per round, the rounds one after the other, so the machine's load hits them alike; each run's step
time and exposed communication are rank 0's mean over its steps after the first (``step_summary`` in
``metrics.jsonl``). Prints each configuration's median and its ratio to 1 host × 4 in the same round
(median and range), the load average before and after, and writes everything to ``DIR/bench.json``.

The shaped link (``tc`` ``tbf``, both directions) carries every message between the hosts; the
kernel here has no ``netem``, so no delay is added: the link's latency is the veth's own, measured
as a TCP round trip and printed. ``plan``'s prediction for the same mesh takes ``--inter-gbps`` =
the link's rate shared by the host's ranks (plan's figure is per GPU), the measured compute rate,
and ``--link-gbps`` for the shared-memory rings within a host.

``--faults``: the time from a fault to the exit of every surviving rank, with ``distributed.timeout_s``
= ``--timeout-s``: once step 4's checkpoint is complete, node2's processes are killed (a crashed
node whose kernel closes its connections) or its link is cut (a partition: nothing is closed, nothing
arrives); the job is ``jigsaw-earth launch --nnodes 2`` on each host, and a rank's exit is its
launcher's (both its ranks ended).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.simhosts import SimulatedHosts  # noqa: E402

CONFIGS = ("1 host x 4", "2 hosts x 2, per pair", "2 hosts x 2, gloo everywhere")
PAIR = ["node1", "node2"]  # the two hosts of a job; "solo" runs 1 host x 4 with every core


def _train(store: Path, run_dir: Path, steps: int, *more: str) -> list[str]:
    return ["train", "configs/demo.yaml", f"data.store={store}", f"training.steps={steps}",
            "optim.warmup_steps=2", "validation.max_samples=4", "checkpoint.every=0", "logging.every=1",
            "logging.wandb.mode=disabled", f"run.dir={run_dir}", *more]  # fmt: skip


def _summary(run_dir: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    s = [r for r in rows if r["kind"] == "step_summary"][-1]
    step = s["mean_step_s"]
    return {"step_s": step, "comm_s": step * s["comm_fraction"], "compute_s": step * s["compute_fraction"],
            "tflops": s["tflops"]}  # fmt: skip


def _run(hosts: SimulatedHosts, config: str, store: Path, root: Path, steps: int, k: int) -> dict[str, float]:
    run_dir = root / f"run-{k}"
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    more = ("distributed.transport=backend",) if "gloo everywhere" in config else ()
    if config.startswith("1 host"):
        cmd = [sys.executable, "-m", "jigsaw_earth", "launch", "--nproc-per-node", "4",
               *_train(store, run_dir, steps)]  # fmt: skip
        hosts.check("solo", cmd, cwd=ROOT, timeout_s=1800, env={**os.environ, "OMP_NUM_THREADS": "1"})
    else:
        procs = hosts.launch(PAIR, _train(store, run_dir, steps, *more), per_host=2, logs=root, cwd=ROOT,
                             port=29500 + k % 1000)  # fmt: skip
        codes = {h: p.wait(timeout=1800) for h, p in procs.items()}
        if any(codes.values()):
            raise RuntimeError(f"{config}: exit codes {codes}; see {root}/*.log")
    return _summary(run_dir)


def _fault(hosts: SimulatedHosts, fault: str, store: Path, root: Path, timeout_s: float, k: int) -> dict:
    """Seconds from the fault to each surviving host's exit, and its exit status."""
    import time

    run_dir = root / f"fault-{k}"
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    more = ("checkpoint.every=2", f"distributed.timeout_s={timeout_s:g}")
    logs = root / f"fault-{k}-logs"
    logs.mkdir(exist_ok=True)
    procs = hosts.launch(hosts.names, _train(store, run_dir, 100000, *more), per_host=2, logs=logs, cwd=ROOT,
                         port=29500 + k % 1000)  # fmt: skip
    latest = run_dir / "checkpoints" / "latest"
    while not (latest.is_file() and int(latest.read_text().strip().split("_")[1]) >= 4):
        if any(p.poll() is not None for p in procs.values()):
            raise RuntimeError(f"the job ended before its fault; see {root}/*.log")
        time.sleep(0.05)
    t0 = time.monotonic()
    hosts.kill("node2") if fault == "kill" else hosts.cut("node2")
    survivors = ["node1"] if fault == "kill" else hosts.names
    ended = {}
    for host in survivors:
        code = procs[host].wait(timeout=10 * timeout_s + 300)
        ended[host] = {"after_s": time.monotonic() - t0, "exit": code}
    if fault == "kill":
        hosts.boot("node2")
    else:
        hosts.mend("node2")
    return ended


def _plan(mbit: float, per_host: int, measured: dict[str, float], link_gbps: float) -> dict[str, float]:
    """plan's exposed communication for the demo's model and mesh (1 × 2 × 2) on 2 nodes of
    ``per_host`` ranks (``exposed_s``), and with every domain byte over the network (``all_inter_s``:
    a domain group spread over nodes priced as if no peer shared a node). CPU ranks: no overlap
    (the shared-memory transport copies on the computing thread)."""
    from dataclasses import replace

    from jigsaw_earth.models.plan import Hardware, plan_mesh

    from jigsaw_earth.distributed.mesh import MeshShape

    rate = measured["tflops"] * measured["step_s"] / measured["compute_s"]  # compute-only TFLOP/s
    hw = Hardware(tflops=rate, efficiency=1.0, intra_gbps=link_gbps, inter_gbps=mbit / 1000 / per_host,
                  gpus_per_node=per_host, overlap=False)  # fmt: skip
    overrides = {"embed_dim": 96, "channel_hidden": 192, "token_hidden": 64, "patch": 2}  # configs/demo.yaml
    p = plan_mesh("weathermixer", "tiny", (32, 64), MeshShape(1, 2, 2), (9, 2, 4), hw, batch=8, **overrides)
    every = plan_mesh("weathermixer", "tiny", (32, 64), MeshShape(1, 2, 2), (9, 2, 4),
                      replace(hw, gpus_per_node=1), batch=8, **overrides)  # fmt: skip
    return {
        "all_inter_s": every.exposed_s,
        "exposed_s": p.exposed_s,
        "compute_s": p.compute_s,
        "step_s": p.step_s,
        "comm_bytes": sum(p.comm.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, type=Path, help="work directory (store, runs, bench.json)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--mbit", type=float, help="also run 2 hosts x 2 with the link shaped to this Mbit/s")
    parser.add_argument("--faults", action="store_true", help="time a killed host and a cut link instead")
    parser.add_argument("--own-cores", action="store_true",
                        help="each of the two hosts on half of the cores (1 host x 4 on all)")  # fmt: skip
    parser.add_argument("--link-only", action="store_true",
                        help="with --mbit: only 2 hosts x 2 per pair, unshaped and shaped")  # fmt: skip
    parser.add_argument("--timeout-s", type=float, default=120.0, help="distributed.timeout_s with --faults")
    parser.add_argument("--link-gbps", type=float, default=40.0,
                        help="plan's --link-gbps for the rings within a host (default 40)")  # fmt: skip
    args = parser.parse_args()
    root = args.dir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    store = root / "data.zarr"
    if not store.exists():
        subprocess.run(
            [sys.executable, "-m", "jigsaw_earth", "data", "synth", "--out", str(store)], check=True
        )
    if args.faults:
        _faults(args, store, root)
        return
    configs = [CONFIGS[1]] if args.link_only and args.mbit else list(CONFIGS)
    configs += [f"2 hosts x 2 at {args.mbit:g} Mbit/s, per pair"] if args.mbit else []
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    got: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
    cores = sorted(os.sched_getaffinity(0))
    half = len(cores) // 2
    cpus = {"node1": cores[:half], "node2": cores[half:]} if args.own_cores and half else None
    with SimulatedHosts([*PAIR, "solo"], shared=[root], cpus=cpus) as hosts:
        rtt = hosts.round_trip_s("node1", "node2")
        for r in range(args.repeats):
            for i, config in enumerate(configs):
                if "Mbit/s" in config:
                    hosts.slow("node2", args.mbit)
                try:
                    got[config].append(_run(hosts, config, store, root, args.steps, r * len(configs) + i))
                finally:
                    hosts.unslow("node2")
                print(f"round {r + 1} {config}: {got[config][-1]}", flush=True)
    load1 = Path("/proc/loadavg").read_text().split()[:3]
    base = got[configs[0]]
    report = {
        "configs": got,
        "load_before": load0,
        "load_after": load1,
        "round_trip_s": rtt,
        "steps": args.steps,
        "cpus": cpus,
    }
    print(
        f"load average {' '.join(load0)} before, {' '.join(load1)} after; TCP round trip {rtt * 1e6:.0f} µs"
    )
    for config in configs:
        steps = [g["step_s"] for g in got[config]]
        ratios = sorted(g["step_s"] / b["step_s"] for g, b in zip(got[config], base))
        comm = statistics.median(g["comm_s"] for g in got[config])
        print(f"{config:<40} step {statistics.median(steps) * 1e3:7.1f} ms (median of {len(steps)}), "
              f"x{statistics.median(ratios):.3f} of {configs[0]} [{ratios[0]:.3f}, {ratios[-1]:.3f}], "
              f"exposed comm {comm * 1e3:.1f} ms")  # fmt: skip
    if args.mbit:
        shaped, free = got[configs[-1]], got[CONFIGS[1]]
        measured = {k: statistics.median(g[k] for g in shaped) for k in shaped[0]}
        added = statistics.median(s["comm_s"] - f["comm_s"] for s, f in zip(shaped, free))
        plan = _plan(args.mbit, 2, measured, args.link_gbps)
        report["plan"] = {**plan, "measured_exposed_s": measured["comm_s"], "measured_added_s": added}
        sent = plan["comm_bytes"] / 1e6
        print(f"at {args.mbit:g} Mbit/s: exposed comm measured {measured['comm_s'] * 1e3:.1f} ms, "
              f"{added * 1e3:.1f} ms more than unshaped in the same round (median); plan "
              f"{plan['exposed_s'] * 1e3:.1f} ms, {plan['all_inter_s'] * 1e3:.1f} ms with every domain byte "
              f"over the network ({sent:.2f} MB sent per rank per step)")  # fmt: skip
    (root / "bench.json").write_text(json.dumps(report, indent=1))


def _faults(args: argparse.Namespace, store: Path, root: Path) -> None:
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    got: dict[str, list] = {"kill": [], "cut": []}
    with SimulatedHosts(["node1", "node2"], shared=[root]) as hosts:
        for r in range(args.repeats):
            for i, fault in enumerate(got):
                got[fault].append(_fault(hosts, fault, store, root, args.timeout_s, r * 2 + i))
                print(f"round {r + 1} {fault}: {got[fault][-1]}", flush=True)
    load1 = Path("/proc/loadavg").read_text().split()[:3]
    loads = f"load average {' '.join(load0)} before, {' '.join(load1)} after"
    print(f"{loads}; distributed.timeout_s={args.timeout_s:g}")
    for fault, runs in got.items():
        last = [max(e["after_s"] for e in run.values()) for run in runs]
        codes = sorted({e["exit"] for run in runs for e in run.values()})
        print(f"{fault}: every survivor ended {min(last):.1f}-{max(last):.1f} s after the fault "
              f"(median {statistics.median(last):.1f} s of {len(last)}), exit {codes}")  # fmt: skip
    (root / "faults.json").write_text(json.dumps({"faults": got, "load": [load0, load1]}, indent=1))


if __name__ == "__main__":
    main()
