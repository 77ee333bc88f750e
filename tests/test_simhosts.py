"""The simulated-hosts fixture itself (tests/simhosts.py): names, private /dev/shm and /tmp, a shared
folder, links only between the hosts, and the faults (kill, cut, slow) doing what they say."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.simhosts import PREFIX, SimulatedHosts, sweep, unavailable

REASON = unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

_CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("connected")
except OSError as err:
    print(type(err).__name__)
"""


def _listen(hosts: SimulatedHosts, host: str) -> tuple[subprocess.Popen, int]:
    code = "import socket; s = socket.socket(); s.bind(('', 0)); s.listen(8); print(s.getsockname()[1], " \
        "flush=True)\nwhile True: s.accept()[0].close()"  # fmt: skip
    proc = hosts.run(host, [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def _connect(hosts: SimulatedHosts, src: str, dst: str, port: int, timeout_s: float = 3.0) -> str:
    return hosts.check(src, [sys.executable, "-c", _CONNECT, dst, str(port), str(timeout_s)]).strip()


def test_hosts_are_apart_but_share_the_project_folder(tmp_path):
    with SimulatedHosts(["node1", "node2"], shared=[tmp_path], cpus={"node1": [0]}) as hosts:
        names = {h: hosts.check(h, ["hostname"]).strip() for h in hosts.names}
        cores = "import os; print(sorted(os.sched_getaffinity(0)))"
        assert hosts.check("node1", [sys.executable, "-c", cores]).strip() == "[0]"  # its own core
        assert names == {"node1": "node1", "node2": "node2"}
        # each resolves the other's name to its link address, and its own to its own (not loopback)
        code = (
            "import socket; print(socket.gethostbyname('node2'), socket.gethostbyname(socket.gethostname()))"
        )
        got = hosts.check("node1", [sys.executable, "-c", code]).split()
        assert got == [hosts.addresses["node2"], hosts.addresses["node1"]]
        # /dev/shm and /tmp are the host's own; tmp_path (under /tmp) is everyone's
        hosts.check("node1", ["sh", "-c", f"echo a > /dev/shm/x && echo b > /tmp/y && echo c > {tmp_path}/z"])
        seen = hosts.check("node2", ["sh", "-c", f"ls /dev/shm /tmp; cat {tmp_path}/z"])
        assert "x" not in seen.split() and "y" not in seen.split() and seen.split()[-1] == "c"
        assert (tmp_path / "z").read_text() == "c\n"
        # the hosts' links exist only in their namespaces: no address of theirs in this one
        ours = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
        assert hosts.subnet + "." not in ours
        namespaces = [*hosts.namespaces.values(), hosts.switch]
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [ns for ns in namespaces if ns in left], left


def test_kill_cut_mend_and_boot(tmp_path):
    with SimulatedHosts(["a", "b"], shared=[tmp_path]) as hosts:
        server, port = _listen(hosts, "b")
        assert _connect(hosts, "a", "b", port) == "connected"
        hosts.cut("b")  # a partition: the connection attempt times out, nothing refuses it
        assert _connect(hosts, "a", "b", port, timeout_s=1.0) in ("TimeoutError", "timeout")
        hosts.mend("b")
        assert _connect(hosts, "a", "b", port) == "connected"
        killed = hosts.kill("b")  # every process of b, its anchor included
        assert server.pid in killed and server.wait(timeout=10) == -9
        assert hosts.pids("b") == []
        assert _connect(hosts, "a", "b", port) == "ConnectionRefusedError"  # b's kernel answers
        with pytest.raises(RuntimeError, match="host b is down"):
            hosts.run("b", ["true"])
        hosts.boot("b")  # up again, with a fresh /dev/shm
        assert hosts.check("b", ["hostname"]).strip() == "b"


def test_slow_shapes_both_directions_and_round_trip(tmp_path):
    with SimulatedHosts(["a", "b"], shared=[tmp_path]) as hosts:
        assert hosts.round_trip_s("a", "b") > 0
        hosts.slow("b", 50)
        for ns, dev in ((hosts.namespaces["b"], "eth0"), (hosts.switch, hosts.ports["b"])):
            shown = subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", dev], capture_output=True,
                                   text=True).stdout  # fmt: skip
            assert "tbf" in shown and "50Mbit" in shown, shown
        hosts.unslow("b")
        shown = subprocess.run(["tc", "-n", hosts.namespaces["b"], "qdisc", "show", "dev", "eth0"],
                               capture_output=True, text=True).stdout  # fmt: skip
        assert "tbf" not in shown


def test_sweep_removes_what_a_dead_run_left(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that is gone
    name = f"{PREFIX}-{dead.pid}-0000aa-0"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert name in sweep()
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert name not in listed
