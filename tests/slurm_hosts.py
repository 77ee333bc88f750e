"""A throw-away Slurm cluster across simulated hosts: slurmctld on a controller host, slurmd on each node.

``start_host_cluster(root, nodes=3)`` makes simulated hosts (``tests/simhosts.py``: each its own
network, hostname, ``/dev/shm`` and ``/tmp``, ``root`` and the project shared like a cluster's file
system) named ``ctl``, ``n1`` … ``nK`` and starts Debian's ``slurm-wlm`` and ``munge`` in them as root,
in the foreground: munged and slurmctld on ``ctl``, one slurmd on each node host, the node named by
its host name and reached at its own address (``NodeAddr``), each with its own spool folder
(``SlurmdSpoolDir=…/spool-%n``). munged's socket is a path in ``root``: a Unix socket is reached by
path from every host, as one key shared by all would. Every client command (``sbatch``, ``scontrol``,
``scancel``) runs on ``ctl`` (``SimSlurmCluster.run``), so nothing outside the simulated network is
contacted; the jobs' own ``scontrol requeue`` runs on their first node.

``kill_node`` kills every process of a node host at once (its slurmd and the job's tasks, as a node
that crashes; ``simhosts.SimulatedHosts.kill``): slurmctld hears nothing more from it, marks it DOWN
after ``SlurmdTimeout`` and requeues its jobs (``--requeue``) onto the nodes left.
The timers are short so that a test sees this within seconds: ``SlurmdTimeout=6`` (slurmctld pings
every third of it), ``cred_expire=5`` (a requeued job starts 5 s after its requeue; Slurm's default
is 120 s) and ``sched_interval=1``. Raises ``ClusterUnavailable`` with the reason (Slurm/MUNGE not
installed, not root, no namespaces here, a daemon's log) where the cluster cannot start.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import CompletedProcess

from .simhosts import SimulatedHosts, unavailable
from .slurm_cluster import ClusterUnavailable, SlurmCluster, require_slurm, slurm_conf, write_config

__all__ = ["CONTROLLER", "NODE_CPUS", "SimSlurmCluster", "start_host_cluster"]

CONTROLLER = "ctl"
NODE_CPUS = 4  # declared per node (SlurmdParameters=config_overrides), whatever the machine has
SLURMD_TIMEOUT_S = 6


@dataclass
class SimSlurmCluster(SlurmCluster):
    """The cluster on simulated hosts; ``run`` runs a client command on the controller host."""

    hosts: SimulatedHosts | None = None
    nodes: list[str] = field(default_factory=list)

    def run(self, *cmd: str, timeout: float = 30, env: dict[str, str] | None = None) -> CompletedProcess:
        assert self.hosts is not None
        proc = self.hosts.run(CONTROLLER, list(cmd), env=env or self.env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        return CompletedProcess(list(cmd), proc.returncode, out, err)

    def _start(self, name: str, *cmd: str) -> None:
        """A daemon of the controller host (munged, slurmctld)."""
        self._start_on(CONTROLLER, name, *cmd)

    def _start_on(self, host: str, name: str, *cmd: str) -> None:
        assert self.hosts is not None
        with open(self.root / f"{name}.out", "w") as log:  # its own log is NAME.log (slurm.conf)
            self.procs[name] = self.hosts.run(host, list(cmd), env=self.env, stdout=log,
                                              stderr=subprocess.STDOUT)  # fmt: skip

    def logs(self, tail: int = 40) -> str:
        parts = []
        for name in ["munged.file", "slurmctld", *(f"slurmd-{n}" for n in self.nodes)]:
            path = self.root / f"{name}.log"
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-tail:]
                parts.append(f"--- {name} ({path}) ---\n" + "\n".join(lines))
        return "\n".join(parts)

    def node_states(self) -> dict[str, str]:
        """Node name → its state as ``sinfo`` says it (idle, alloc, down*, drain…)."""
        try:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %T", timeout=10).stdout
        except subprocess.TimeoutExpired:
            return {}
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def job_nodes(self, job_id: str) -> list[str]:
        """The nodes of the job's current (or last) allocation, expanded."""
        nodes = self.job(job_id).get("NodeList", "")
        if not nodes or nodes == "(null)":
            return []
        return self.run("scontrol", "show", "hostnames", nodes).stdout.split()

    def kill_node(self, node: str) -> list[int]:
        """Kill every process of ``node`` (its slurmd and the job's tasks on it): a crashed node."""
        assert self.hosts is not None
        self.procs.pop(f"slurmd-{node}", None)
        return self.hosts.kill(node)

    def boot_node(self, node: str, limit_s: float = 60) -> None:
        """Boot a killed node host again and start its slurmd; it is idle again on return (a node
        that answers again returns to service: ``ReturnToService=2``)."""
        assert self.hosts is not None
        self.hosts.boot(node)
        self._start_on(node, f"slurmd-{node}", "slurmd", "-D", "-N", node)
        self._wait(f"slurmd-{node}", lambda: self.node_states().get(node) == "idle", limit_s)

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self.hosts is not None:
                self.hosts.close()


def start_host_cluster(root: Path, nodes: int = 3, shared: tuple[Path, ...] = ()) -> SimSlurmCluster:
    """Start the cluster (``ctl`` and ``n1`` … ``nN``) under ``root``; every node is idle on return."""
    require_slurm()
    reason = unavailable()
    if reason:
        raise ClusterUnavailable(reason)
    names = [f"n{i + 1}" for i in range(nodes)]
    root.mkdir(parents=True, exist_ok=True)
    hosts = SimulatedHosts([CONTROLLER, *names], shared=[root, *shared])
    try:
        hosts.start()
    except BaseException:
        hosts.close()
        raise
    extra = (f"SlurmctldLogFile={root}/slurmctld.log", f"SlurmdLogFile={root}/slurmd-%n.log",
             "LogTimeFormat=iso8601_ms", f"SlurmdTimeout={SLURMD_TIMEOUT_S}")  # fmt: skip
    conf = slurm_conf(
        root, name="jigsawsim", controller=(CONTROLLER, hosts.addresses[CONTROLLER]),
        nodes={n: hosts.addresses[n] for n in names}, cpus=NODE_CPUS, ports=(6817, 6818), cred_expire_s=5,
        per_node=True, extra=extra,
    )  # fmt: skip
    env = write_config(root, conf)
    # `ip netns exec` mounts the host's own /sys, without this machine's cgroups: no autodetection
    (root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
    for name in names:
        (root / f"spool-{name}").mkdir(exist_ok=True)
    cluster = SimSlurmCluster(root, CONTROLLER, env, hosts=hosts, nodes=names)
    try:
        cluster.start_controller()
        for name in names:
            cluster._start_on(name, f"slurmd-{name}", "slurmd", "-D", "-N", name)  # NodeName = host name
        deadline = time.monotonic() + 60
        while sorted(cluster.node_states().values()) != ["idle"] * nodes:
            for name in names:
                proc = cluster.procs[f"slurmd-{name}"]
                if proc.poll() is not None:
                    raise ClusterUnavailable(f"slurmd on {name} exited {proc.returncode}:\n{cluster.logs()}")
            if time.monotonic() > deadline:
                raise ClusterUnavailable(
                    f"nodes not idle after 60 s {cluster.node_states()}:\n{cluster.logs()}"
                )
            time.sleep(0.3)
    except BaseException:
        cluster.stop()
        raise
    return cluster
