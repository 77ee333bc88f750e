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

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import CompletedProcess

from .simhosts import SimulatedHosts, unavailable
from .slurm_cluster import CLIENTS, DAEMONS, INSTALL, ClusterUnavailable, SlurmCluster, _which

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


def _slurm_conf(root: Path, hosts: SimulatedHosts, nodes: list[str]) -> str:
    node_lines = "".join(
        f"NodeName={n} NodeAddr={hosts.addresses[n]} CPUs={NODE_CPUS} State=UNKNOWN\n" for n in nodes
    )
    return f"""\
ClusterName=jigsawsim
SlurmctldHost={CONTROLLER}({hosts.addresses[CONTROLLER]})
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.sock,cred_expire=5
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
LogTimeFormat=iso8601_ms
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
MailProg=/bin/true
JobRequeue=1
ReturnToService=2
SlurmdTimeout={SLURMD_TIMEOUT_S}
MinJobAge=3600
KillWait=10
{node_lines}PartitionName=test Nodes={",".join(nodes)} Default=YES MaxTime=INFINITE State=UP
"""


def start_host_cluster(root: Path, nodes: int = 3, shared: tuple[Path, ...] = ()) -> SimSlurmCluster:
    """Start the cluster (``ctl`` and ``n1`` … ``nN``) under ``root``; every node is idle on return."""
    missing = [name for name in CLIENTS + DAEMONS if _which(name) is None]
    if missing:
        raise ClusterUnavailable(f"Slurm/MUNGE not installed (missing {', '.join(missing)}); run `{INSTALL}`")
    reason = unavailable()
    if reason:
        raise ClusterUnavailable(reason)
    names = [f"n{i + 1}" for i in range(nodes)]
    (root / "state").mkdir(parents=True, exist_ok=True)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    hosts = SimulatedHosts([CONTROLLER, *names], shared=[root, *shared])
    try:
        hosts.start()
    except BaseException:
        hosts.close()
        raise
    (root / "slurm.conf").write_text(_slurm_conf(root, hosts, names))
    # `ip netns exec` mounts the host's own /sys, without this machine's cgroups: no autodetection
    (root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
    for name in names:
        (root / f"spool-{name}").mkdir(exist_ok=True)
    sbin = os.pathsep.join(str(Path(_which(d)).parent) for d in DAEMONS)  # type: ignore[arg-type]
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf"), "PATH": f"{os.environ['PATH']}:{sbin}"}
    cluster = SimSlurmCluster(root, CONTROLLER, env, hosts=hosts, nodes=names)
    sock = str(root / "munge.sock")
    try:
        cluster._start_on(
            CONTROLLER, "munged", "munged", "-F", "--force", f"--socket={sock}", f"--key-file={key}",
            f"--pid-file={root}/munged.pid", f"--seed-file={root}/munge.seed",
            f"--log-file={root}/munged.file.log",
        )  # fmt: skip
        cluster._wait("munged", lambda: cluster._ok("munge", f"--socket={sock}", "-n"), 20)
        cluster._start_on(CONTROLLER, "slurmctld", "slurmctld", "-D", "-c")
        cluster._wait("slurmctld", lambda: cluster._ok("scontrol", "ping", want="UP"), 60)
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
