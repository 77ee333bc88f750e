"""Simulated hosts for tests: K "machines" on this one, each with its own network, name, /dev/shm and /tmp.

``SimulatedHosts(["node1", "node2"], shared=[tmp_path])`` makes, for each host,

* a network namespace whose only links are ``lo`` and ``eth0``, a veth to a bridge that lives in one
  more namespace of its own (the switch): the hosts reach each other at ``198.18.N.k/24`` (RFC 2544's
  benchmarking range, on these links only: nothing in this machine's own namespace gets an address,
  a route or an interface, so nothing outside the test is contacted or disturbed);
* a UTS namespace (``hostname`` says the host's name) and a mount namespace with its own tmpfs on
  ``/dev/shm`` and ``/tmp`` and an ``/etc/hosts`` naming every host, so ``socket.gethostname()`` and
  name resolution work as on a cluster node, and shared-memory files of one host are not seen by
  another. The rest of the file system is shared, as a cluster's parallel file system is: ``shared``
  paths under ``/tmp`` (pytest's ``tmp_path``, a venv made by ``mktemp``) are bound back in, so
  every host sees the same run directory.

A host's namespaces are held by one small "anchor" process; ``run`` starts a command inside them
(``nsenter``), ``kill`` ends every process of a host (``ip netns pids``: a crashed node; ``boot``
starts it again, with a fresh ``/dev/shm`` and ``/tmp``), ``cut`` sets its link down (a partition or a
node that died without closing a connection: nobody is told), ``mend`` sets it up again, ``slow``
shapes its link to a bandwidth with ``tc``'s token bucket (``tbf``, both directions). This kernel has
no ``netem``, so no delay is added: the link's latency is the veth's and the bridge's own (tens of
microseconds; ``round_trip_s`` measures it). ``close`` (or leaving the ``with`` block) kills
everything and deletes the namespaces; names carry the creating process's pid and a random token,
so two runs never collide, and ``sweep`` (called on every start) removes what a killed test run
left behind. ``cpus={"node1": [0], "node2": [1]}`` gives hosts cores of their own (every command run
there is pinned to them), as separate machines have; by default the hosts share this machine's.

Needs root and ``ip``, ``unshare``, ``nsenter`` and ``tc`` (Linux); ``unavailable()`` says in one line
what is missing, and the tests skip with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import random
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["PREFIX", "SimulatedHosts", "sweep", "unavailable"]

PREFIX = os.environ.get("JIGSAW_SIMHOSTS_PREFIX", "jsh")  # namespace names: PREFIX-PID-TOKEN-HOST
TOOLS = ("ip", "unshare", "nsenter", "tc", "mount")
_READY = "simulated host ready"


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")


def unavailable() -> str | None:
    """Why simulated hosts cannot be made here (one line), or None when they can."""
    if not sys.platform.startswith("linux"):
        return f"simulated hosts need Linux namespaces; this is {sys.platform}"
    if os.geteuid() != 0:
        return "simulated hosts need root (network, UTS and mount namespaces); run the tests as root"
    missing = [t for t in TOOLS if _which(t) is None]
    if missing:
        return f"simulated hosts need {', '.join(missing)} (apt-get install iproute2 util-linux)"
    probe = f"{PREFIX}-probe-{os.getpid()}-{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode:
        return f"simulated hosts: `ip netns add` fails here ({made.stderr.strip()})"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {done.stderr.strip()}")


def _netns_pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _kill_all(ns: str, sig: int = signal.SIGKILL) -> list[int]:
    pids = _netns_pids(ns)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    return pids


def _exited(pid: int) -> bool:
    """Whether ``pid`` has ended: gone, or a zombie whose threads have all exited (its files closed,
    its locks released; a killed process's other threads can take a moment after its leader)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        states = [Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True
    return all(state in ("Z", "X") for state in states) and len(states) <= 1


def _wait_exited(pids: list[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(_exited(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.01)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(prefix: str = PREFIX) -> list[str]:
    """Delete the namespaces (and kill their processes) of runs whose creating process is gone."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    removed = []
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if len(parts) < 4 or parts[0] != prefix or not parts[1].isdigit() or _alive(int(parts[1])):
            continue
        _kill_all(name)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        removed.append(name)
    return removed


def _topmost(paths: Iterable[Path]) -> list[Path]:
    """The paths not inside another one of them."""
    ordered = sorted({p.resolve() for p in paths}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for p in ordered:
        if not any(p.is_relative_to(k) for k in kept):
            kept.append(p)
    return kept


class SimulatedHosts:
    """K simulated hosts joined by one switch (see the module docstring); a context manager."""

    def __init__(self, names: Sequence[str], shared: Iterable[str | os.PathLike] = (), prefix: str = PREFIX,
                 cpus: dict[str, Sequence[int]] | None = None):  # fmt: skip
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"host names must be distinct and at least one: {list(names)}")
        for name in names:
            if not name.replace("-", "").isalnum() or len(name) > 60:
                raise ValueError(f"host name {name!r}: use letters, digits and '-' (a valid hostname)")
        self.names = list(names)
        self.cpus = {h: sorted(c) for h, c in (cpus or {}).items()}  # a host's own cores (default: all)
        self.token = f"{prefix}-{os.getpid()}-{secrets.token_hex(3)}"
        self.subnet = f"198.18.{random.randrange(1, 255)}"  # per run, though the links are private anyway
        self.addresses = {n: f"{self.subnet}.{i + 1}" for i, n in enumerate(names)}
        self.switch = f"{self.token}-switch"
        self.namespaces = {n: f"{self.token}-{i}" for i, n in enumerate(names)}
        self.ports = {n: f"h{i}" for i, n in enumerate(names)}  # the switch's end of each host's link
        self.state = Path(tempfile.mkdtemp(prefix=f"{self.token}-"))
        keep = [Path(p) for p in shared] + [Path(sys.prefix), Path.cwd()]
        self.shared = [p for p in _topmost(keep) if p.is_relative_to("/tmp")]  # others are not hidden
        self.anchors: dict[str, subprocess.Popen] = {}
        self.procs: list[subprocess.Popen] = []
        self._made: list[str] = []

    # ------------------------------------------------------------------ life cycle
    def __enter__(self) -> SimulatedHosts:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        reason = unavailable()
        if reason:
            raise RuntimeError(reason)
        sweep()
        hosts = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in self.addresses.items())
        (self.state / "hosts").write_text(hosts)
        self._add_ns(self.switch)
        _ip("link", "add", "br0", "type", "bridge", ns=self.switch)
        _ip("link", "set", "br0", "up", ns=self.switch)
        for name in self.names:
            ns, port = self.namespaces[name], self.ports[name]
            self._add_ns(ns)
            _ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns, ns=self.switch)
            _ip("link", "set", port, "master", "br0", ns=self.switch)
            _ip("link", "set", port, "up", ns=self.switch)
            _ip("addr", "add", f"{self.addresses[name]}/24", "dev", "eth0", ns=ns)
            _ip("link", "set", "eth0", "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)
            self.boot(name)

    def _add_ns(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._made.append(ns)

    def boot(self, host: str, timeout_s: float = 30.0) -> None:
        """Start ``host``'s anchor: its hostname, fresh tmpfs on /dev/shm and /tmp, /etc/hosts."""
        if host in self.anchors and self.anchors[host].poll() is None:
            raise RuntimeError(f"host {host} is up; kill it before booting it again")
        paths = [shlex.quote(str(p)) for p in self.shared]
        fds = " ".join(f"{3 + i}<{p}" for i, p in enumerate(paths))
        binds = "".join(  # the shared folders under /tmp, opened before the tmpfs hides them
            f"mkdir -p {p}; mount --no-canonicalize --bind /proc/self/fd/{3 + i} {p}; "
            for i, p in enumerate(paths)
        )
        script = (
            f"set -e; {'exec ' + fds + ';' if fds else ''} hostname {host}; "
            f"mount --bind {shlex.quote(str(self.state / 'hosts'))} /etc/hosts; "
            "mount -t tmpfs -o mode=1777 tmpfs /dev/shm; mount -t tmpfs -o mode=1777 tmpfs /tmp; "
            f"{binds}echo '{_READY}'; exec cat >/dev/null"  # ends when the test process does
        )
        cmd = ["ip", "netns", "exec", self.namespaces[host], "unshare", "--uts", "--mount",
               "--propagation", "private", "bash", "-c", script]  # fmt: skip
        anchor = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)  # fmt: skip
        self.anchors[host] = anchor
        line = _read_line(anchor, timeout_s)
        if line.strip() != _READY:
            anchor.kill()
            err = anchor.stderr.read() if anchor.stderr else ""
            raise RuntimeError(f"simulated host {host} did not start: {line.strip()} {err.strip()}")

    def close(self) -> None:
        """Kill every process of every host and delete the namespaces (idempotent)."""
        for ns in reversed(self._made):
            for _ in range(50):
                if not _kill_all(ns):
                    break
                time.sleep(0.02)
        for p in [*self.procs, *self.anchors.values()]:
            with contextlib.suppress(Exception):
                p.kill()
                p.wait(timeout=5)
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()
        shutil.rmtree(self.state, ignore_errors=True)

    # ------------------------------------------------------------------ running things
    def _enter(self, host: str, cwd: str | os.PathLike | None) -> list[str]:
        anchor = self.anchors.get(host)
        if anchor is None or anchor.poll() is not None:
            raise RuntimeError(f"host {host} is down (killed, or never booted): boot it first")
        wd = Path(cwd or Path.cwd()).resolve()
        return ["nsenter", "-t", str(anchor.pid), "-n", "-u", "-m", f"--wd={wd}"]

    def run(self, host: str, cmd: Sequence[str], *, cwd: str | os.PathLike | None = None,
            env: dict[str, str] | None = None, **popen: object) -> subprocess.Popen:  # fmt: skip
        """Start ``cmd`` on ``host`` (its network, name, /dev/shm and /tmp) in a session of its own;
        ``popen``: more ``subprocess.Popen`` arguments (stdout, stderr, text…)."""
        start = functools.partial(_start_child, self.cpus.get(host))
        proc = subprocess.Popen([*self._enter(host, cwd), *cmd], env=env, start_new_session=True,
                                preexec_fn=start, **popen)  # type: ignore[call-overload]  # fmt: skip
        self.procs.append(proc)
        return proc

    def check(self, host: str, cmd: Sequence[str], timeout_s: float = 60.0, **kw: object) -> str:
        """Run ``cmd`` on ``host`` to its end; its stdout (an error with its output if it fails)."""
        proc = self.run(host, cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise RuntimeError(f"{cmd} on {host} did not end within {timeout_s:g} s: {out}{err}") from None
        if proc.returncode:
            raise RuntimeError(f"{cmd} on {host} exited {proc.returncode}: {out}{err}")
        return out

    def launch(self, hosts: Sequence[str], command: Sequence[str], *, per_host: int, logs: Path,
               launcher: str = "jigsaw-earth", env: dict[str, str] | None = None, port: int = 29500,
               cwd: str | os.PathLike | None = None) -> dict[str, subprocess.Popen]:  # fmt: skip
        """Start a job of ``per_host`` ranks on each of ``hosts`` (the first holds the rendezvous
        store): ``jigsaw-earth launch --nnodes K --node-rank I ...`` or ``torchrun --nnodes K
        --node-rank I ... -m jigsaw_earth`` (``launcher``), ``command`` after it (``train CONFIG ...``).
        Each host's output goes to ``logs/HOST.log``; returns each host's launcher process."""
        nodes = ["--nnodes", str(len(hosts)), "--master-addr", hosts[0], "--master-port", str(port),
                 "--nproc-per-node", str(per_host)]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        procs = {}
        for i, host in enumerate(hosts):
            if launcher == "torchrun":
                cmd = [sys.executable, "-m", "torch.distributed.run", *nodes, "--node-rank", str(i),
                       "-m", "jigsaw_earth", *command]  # fmt: skip
            else:
                cmd = [
                    sys.executable,
                    "-m",
                    "jigsaw_earth",
                    "launch",
                    *nodes,
                    "--node-rank",
                    str(i),
                    *command,
                ]
            with open(logs / f"{host}.log", "w") as out:
                procs[host] = self.run(host, cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        return procs

    def pids(self, host: str) -> list[int]:
        """Every process of ``host`` (its anchor included)."""
        return _netns_pids(self.namespaces[host])

    # ------------------------------------------------------------------ faults
    def kill(self, host: str) -> list[int]:
        """Kill every process of ``host`` at once (SIGKILL), as a node that crashes; its link stays up,
        so its peers' connections are closed by this kernel. Returns the pids killed."""
        killed: list[int] = []
        for _ in range(50):
            got = _kill_all(self.namespaces[host])
            if not got:
                break
            killed += got
            time.sleep(0.02)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.anchors[host].wait(timeout=5)
        killed = sorted(set(killed))
        _wait_exited(killed, 10.0)
        return killed

    def cut(self, host: str) -> None:
        """Set ``host``'s link down at both ends: nothing is closed, nothing arrives (a partition)."""
        _ip("link", "set", "eth0", "down", ns=self.namespaces[host])
        _ip("link", "set", self.ports[host], "down", ns=self.switch)

    def mend(self, host: str) -> None:
        """Set ``host``'s link up again (after ``cut``)."""
        _ip("link", "set", self.ports[host], "up", ns=self.switch)
        _ip("link", "set", "eth0", "up", ns=self.namespaces[host])

    def slow(self, host: str, mbit: float) -> None:
        """Shape ``host``'s link to ``mbit`` Mbit/s in each direction (``tc`` token bucket; no delay)."""
        rate = int(mbit * 1e6)
        burst = max(64 * 1024, rate // 8 // 100)  # ≥ one GSO segment; ≤ 10 ms of the rate above that
        limit = max(4 << 20, rate // 8)  # queue up to a second of traffic: shaped, not dropped
        for ns, dev in ((self.namespaces[host], "eth0"), (self.switch, self.ports[host])):
            cmd = ["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate}bit",
                   "burst", str(burst), "limit", str(limit)]  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"`{' '.join(cmd)}` failed: {done.stderr.strip()}")

    def unslow(self, host: str) -> None:
        for ns, dev in ((self.namespaces[host], "eth0"), (self.switch, self.ports[host])):
            subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], capture_output=True)

    def round_trip_s(self, src: str, dst: str, repeats: int = 200) -> float:
        """The median TCP round trip of a 1-byte message from ``src`` to ``dst`` (no ``ping`` here)."""
        code = _PINGPONG.format(addr=self.addresses[dst], repeats=repeats)
        server = self.run(dst, [sys.executable, "-c", code, "serve"], stdout=subprocess.PIPE, text=True)
        try:
            port = int(_read_line(server, 30))
            out = self.check(src, [sys.executable, "-c", code, "ping", str(port)])
            return float(out)
        finally:
            server.kill()
            server.wait()


_PINGPONG = """
import socket, statistics, sys, time
if sys.argv[1] == "serve":
    s = socket.socket(); s.bind(("{addr}", 0)); s.listen(1)
    print(s.getsockname()[1], flush=True)
    c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while (b := c.recv(1)):
        c.sendall(b)
else:
    c = socket.create_connection(("{addr}", int(sys.argv[2])))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times = []
    for _ in range({repeats}):
        t = time.perf_counter(); c.sendall(b"x"); c.recv(1); times.append(time.perf_counter() - t)
    print(statistics.median(times))
"""


def _start_child(cpus: Sequence[int] | None) -> None:  # pragma: no cover - in the child before exec
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no command outlives the test
    if cpus:
        os.sched_setaffinity(0, cpus)  # the host's own cores, as a machine of its own


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """The first line of ``proc``'s stdout, or what it said before failing (``timeout_s`` at most)."""
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
        if not sel.select(timeout_s):
            proc.kill()
            raise RuntimeError(f"{proc.args} printed nothing within {timeout_s:g} s")
    return proc.stdout.readline()  # type: ignore[union-attr]
