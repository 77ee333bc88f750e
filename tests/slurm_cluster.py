"""A throw-away one-node Slurm cluster for tests: munged, slurmctld and slurmd started by the test.

Debian's ``slurm-wlm`` and ``munge`` (``apt-get install slurm-wlm munge``) run as root in the
foreground, with every file (munge key and socket, ``slurm.conf``, state, spool, logs) under one
temporary directory and ports picked free, so nothing touches a system cluster and nothing is
left behind. ``start_cluster`` raises ``ClusterUnavailable`` with the reason (what is missing and
how to install it, or a daemon's log) where the cluster cannot start; tests skip on it.

The node is declared with 12 CPUs whatever the machine has (``SlurmdParameters=config_overrides``)
so that three 4-task jobs fit at once; no cgroups or systemd are needed (``proctrack/linuxproc``,
``task/none``). ``cred_expire=10`` lets a requeued job start 10 s after its requeue (Slurm's
default is 120 s) and ``sched_interval=1`` schedules it at once.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import CompletedProcess

from jigsaw_earth.distributed.spawn import free_port

__all__ = [
    "FINAL_STATES",
    "ClusterUnavailable",
    "SlurmCluster",
    "require_slurm",
    "slurm_conf",
    "start_cluster",
    "write_config",
]

CLIENTS = ("sbatch", "scontrol", "scancel", "sinfo", "squeue", "munge")
DAEMONS = ("munged", "slurmctld", "slurmd")
INSTALL = "apt-get install slurm-wlm munge"
NODE_CPUS = 12
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}


class ClusterUnavailable(RuntimeError):
    """The one-node cluster cannot start here; the message says why and what to install."""


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _first_job_id() -> int:
    """A first job id whose next few jobs' template ports (20000 + id % 20000) are free."""
    for _ in range(100):
        first = random.randrange(1000, 11000)
        if all(_port_free(20000 + (first + k) % 20000) for k in range(8)):
            return first
    raise ClusterUnavailable("no free ports in 21000-31000 for the jobs' MASTER_PORT")


@dataclass
class SlurmCluster:
    root: Path
    node: str
    env: dict[str, str]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def run(self, *cmd: str, timeout: float = 30, env: dict[str, str] | None = None) -> CompletedProcess:
        """A Slurm client command against this cluster (``env`` defaults to the cluster's)."""
        return subprocess.run(cmd, env=env or self.env, capture_output=True, text=True, timeout=timeout)

    def _start(self, name: str, *cmd: str) -> None:
        with open(self.root / f"{name}.log", "w") as log:  # the daemon keeps its own copy
            self.procs[name] = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def start_controller(self) -> None:
        """Start munged (its socket and key under ``root``) and slurmctld; return once both answer."""
        sock, root = self.root / "munge.sock", self.root
        self._start(
            "munged", "munged", "-F", "--force", f"--socket={sock}", f"--key-file={root}/munge.key",
            f"--pid-file={root}/munged.pid", f"--seed-file={root}/munge.seed",
            f"--log-file={root}/munged.file.log",
        )  # fmt: skip
        self._wait("munged", lambda: self._ok("munge", f"--socket={sock}", "-n"), 20)
        self._start("slurmctld", "slurmctld", "-D", "-c")
        self._wait("slurmctld", lambda: self._ok("scontrol", "ping", want="UP"), 60)

    def _wait(self, name: str, ready: Callable[[], bool], limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        while not ready():
            if self.procs[name].poll() is not None:
                code = self.procs[name].returncode
                raise ClusterUnavailable(f"{name} exited with code {code}:\n{self.logs()}")
            if time.monotonic() > deadline:
                raise ClusterUnavailable(f"{name} not ready after {limit_s:.0f} s:\n{self.logs()}")
            time.sleep(0.3)

    def _ok(self, *cmd: str, want: str = "") -> bool:
        try:
            out = self.run(*cmd, timeout=10)
        except subprocess.TimeoutExpired:
            return False
        return out.returncode == 0 and want in out.stdout

    def logs(self, tail: int = 40) -> str:
        """The last lines of every daemon's log, for failure messages."""
        parts = []
        for name in DAEMONS:
            path = self.root / f"{name}.log"
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-tail:]
                parts.append(f"--- {name} ({path}) ---\n" + "\n".join(lines))
        return "\n".join(parts)

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, Restarts, ExitCode, ...)."""
        try:
            out = self.run("scontrol", "show", "job", "-o", job_id).stdout
        except subprocess.TimeoutExpired:  # a busy controller: unknown for now, ask again
            return {}
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def _jobs(self) -> list[str]:
        try:
            return self.run("squeue", "-h", "-o", "%i", timeout=10).stdout.split()
        except subprocess.TimeoutExpired:
            return []

    def stop(self) -> None:
        """Cancel every job, wait for the node to drain, then end the daemons (newest first)."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            deadline = time.monotonic() + 60
            while (jobs := self._jobs()) and time.monotonic() < deadline:
                self.run("scancel", *jobs)
                time.sleep(1)
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)


def slurm_conf(
    root: Path,
    *,
    name: str,
    controller: tuple[str, str],
    nodes: dict[str, str],
    cpus: int,
    ports: tuple[int, int],
    cred_expire_s: int,
    per_node: bool,
    extra: tuple[str, ...] = (),
) -> str:
    """``slurm.conf`` of a test cluster with every file under ``root``: ``controller`` and each of
    ``nodes`` as (name, address), ``cpus`` declared per node, ``(slurmctld, slurmd)`` ports; with
    ``per_node`` each slurmd has its own spool folder and pid file (``%n``: several on one file system)."""
    each = "-%n" if per_node else ""
    node_lines = [f"NodeName={n} NodeAddr={addr} CPUs={cpus} State=UNKNOWN" for n, addr in nodes.items()]
    return "\n".join([
        f"ClusterName={name}",
        f"SlurmctldHost={controller[0]}({controller[1]})",
        f"SlurmctldPort={ports[0]}",
        f"SlurmdPort={ports[1]}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge.sock,cred_expire={cred_expire_s}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool{each}",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd{each}.pid",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SchedulerType=sched/builtin",
        "SchedulerParameters=sched_interval=1",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "JobRequeue=1",
        "ReturnToService=2",
        "MinJobAge=3600",
        "KillWait=10",
        *extra,
        *node_lines,
        f"PartitionName=test Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])  # fmt: skip


def require_slurm() -> None:
    """Raise ``ClusterUnavailable`` naming what to install where a Slurm or MUNGE program is missing."""
    missing = [name for name in CLIENTS + DAEMONS if _which(name) is None]
    if missing:
        raise ClusterUnavailable(f"Slurm/MUNGE not installed (missing {', '.join(missing)}); run `{INSTALL}`")


def write_config(root: Path, conf: str) -> dict[str, str]:
    """Write a fresh munge key and ``conf`` as ``slurm.conf`` under ``root``; the environment that
    daemons and clients run with (``SLURM_CONF`` set, the daemons' folder on ``PATH``)."""
    (root / "state").mkdir(parents=True, exist_ok=True)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    (root / "slurm.conf").write_text(conf)
    sbin = os.pathsep.join(str(Path(_which(d)).parent) for d in DAEMONS)  # type: ignore[arg-type]
    return {**os.environ, "SLURM_CONF": str(root / "slurm.conf"), "PATH": f"{os.environ['PATH']}:{sbin}"}


def start_cluster(root: Path) -> SlurmCluster:
    """Start munged, slurmctld and slurmd under ``root``; the node is idle when this returns."""
    require_slurm()
    if os.geteuid() != 0:
        raise ClusterUnavailable("the one-node cluster runs slurmd as root; run the tests as root (CI does)")
    node = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(node)
    except OSError:
        raise ClusterUnavailable(f"host name {node!r} does not resolve; add it to /etc/hosts") from None
    (root / "spool").mkdir(parents=True, exist_ok=True)
    conf = slurm_conf(
        root, name="jigsawtest", controller=(node, "127.0.0.1"), nodes={node: "127.0.0.1"}, cpus=NODE_CPUS,
        ports=(free_port(), free_port()), cred_expire_s=10, per_node=False,
        extra=(f"FirstJobId={_first_job_id()}",),
    )  # fmt: skip
    cluster = SlurmCluster(root, node, write_config(root, conf))
    try:
        cluster.start_controller()
        cluster._start("slurmd", "slurmd", "-D", "-N", node)
        cluster._wait("slurmd", lambda: cluster._ok("sinfo", "-h", "-N", "-o", "%T", want="idle"), 60)
    except BaseException:
        cluster.stop()
        raise
    return cluster
