"""Locks and pins across hosts (``jigsaw_earth/locks.py``), on simulated hosts (``tests/simhosts.py``).

A process on another host cannot be asked with ``kill(pid, 0)``: its lock counts as held while its
lease runs, renewed by the holder every quarter lease. Three kinds, one agent process per host
holding all three: training's ``run.lock`` (``PathLock``, a ``flock``), predict's
``_progress/lock`` (created exclusively) and a checkpoint's pin. With the lease at 4 s
(``JIGSAW_LOCK_LEASE_S``):

* a live holder on ``n1`` is refused to ``n2`` well after one lease (it renews);
* ``n1`` killed (a crashed node): ``n2`` is still refused while the lease runs (the message says how
  long), and takes all three over once it has run out; asked without the lease (the ranks of a job
  that do not take the lock), ``run.lock`` is free as soon as the flock is;
* a holder that is alive to the file system but silent (SIGSTOP: its ``flock`` stays, its lease
  stops), as a file system that keeps a dead host's lock until it notices: the lock is taken over
  once the lease has run out, by a fresh file, and the stopped holder, resumed, removes nothing
  of the new holder's.

And without hosts: a lock of an earlier attempt of this Slurm job is stale at once; a lease that is
not a positive number of seconds is refused before anything is written.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jigsaw_earth.checkpoint.manager import FORMAT, VERSION
from jigsaw_earth.locks import LEASE_ENV, PathLock, holder_alive

from .simhosts import SimulatedHosts, unavailable

log = logging.getLogger(__name__)
LEASE_S = 4.0
KINDS = ("run", "predict", "pin")

AGENT = """
import json, sys
from pathlib import Path
from jigsaw_earth.checkpoint.manager import _pinned_by, pinned
from jigsaw_earth.inference.unfinished import Lock
from jigsaw_earth.locks import LockHeld, PathLock

root, held = Path(sys.argv[1]), {}
for line in sys.stdin:
    out = {}
    if line.strip() == "take":
        if "run" not in held:
            try:
                held["run"] = PathLock.acquire(root / "run.lock", "run.dir", "choose another")
            except LockHeld as err:
                out["run"] = str(err)
        if "predict" not in held:
            lock = Lock(root / "fc.zarr.in-progress")
            try:
                lock.acquire()
                held["predict"] = lock
            except ValueError as err:
                out["predict"] = str(err)
        if "pin" not in held:
            pins = _pinned_by(root / "ckpt")
            if pins:
                out["pin"] = "pinned by " + ", ".join(p.name for p in pins)
            else:
                held["pin"] = pinned(root / "ckpt")
                held["pin"].__enter__()
        out.update({k: "held" for k in held})
    elif line.strip() == "peek":  # who holds run.lock: by the full rule, and by this host's flock only
        out = {k: bool(PathLock.holder(root / "run.lock", lease=k == "lease")) for k in ("lease", "flock")}
    elif line.strip() == "release":
        for kind, thing in held.items():
            thing.__exit__(None, None, None) if kind == "pin" else thing.release()
        held.clear()
    print(json.dumps(out), flush=True)
"""


class Agent:
    """A process on one host that takes (or is refused) all three kinds, on command."""

    def __init__(self, hosts: SimulatedHosts, host: str, root: Path):
        env = {**os.environ, LEASE_ENV: str(LEASE_S), "PYTHONPATH": os.pathsep.join(sys.path)}
        self.host = host
        self.proc = hosts.run(host, [sys.executable, "-c", AGENT, str(root)], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip

    def send(self, command: str, timeout_s: float = 120) -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout_s):
                self.proc.kill()
                pytest.fail(f"the agent on {self.host} did not answer {command!r}: {self.proc.stderr.read()}")
        line = self.proc.stdout.readline()
        if not line:
            pytest.fail(f"the agent on {self.host} ended: {self.proc.stderr.read()}")  # type: ignore[union-attr]
        return json.loads(line)

    def take_until_held(self, limit_s: float) -> float:
        """Ask again every 0.2 s until all three are held; the seconds it took."""
        t0 = time.monotonic()
        while (got := self.send("take")) != dict.fromkeys(KINDS, "held"):
            assert time.monotonic() - t0 < limit_s, f"{self.host} still refused after {limit_s:g} s: {got}"
            time.sleep(0.2)
        return time.monotonic() - t0


def _refused_by(got: dict[str, Any], host: str) -> None:
    assert set(got) == set(KINDS) and "held" not in got.values(), got
    assert f"host {host}" in got["run"] and "is in use by another run" in got["run"], got["run"]
    assert f"on {host}" in got["predict"] and "is being written by" in got["predict"], got["predict"]
    assert got["pin"].startswith(f"pinned by .pin-{host}-"), got["pin"]


@pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")
def test_a_lock_of_another_host_lives_by_its_lease(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "meta.json").write_text(json.dumps({"format": FORMAT, "version": VERSION, "step": 2}))
    (tmp_path / "fc.zarr.in-progress").mkdir()
    with SimulatedHosts(["n1", "n2"], shared=[tmp_path]) as hosts:
        one, two = Agent(hosts, "n1", tmp_path), Agent(hosts, "n2", tmp_path)
        assert one.send("take") == dict.fromkeys(KINDS, "held")
        holder = json.loads((tmp_path / "run.lock").read_text())
        assert (holder["host"], holder["pid"]) == ("n1", one.proc.pid)  # nsenter execs the command
        time.sleep(1.25 * LEASE_S)  # past one lease: only its renewals keep it
        _refused_by(two.send("take"), "n1")

        assert two.send("peek") == {"lease": True, "flock": True}
        hosts.kill("n1")  # a crashed node: no process of it releases anything
        # a rank that does not take the lock leaves the lease to the one that does
        assert two.send("peek") == {"lease": True, "flock": False}
        got = two.send("take")
        _refused_by(got, "n1")
        assert "counts as held while its lease runs" in got["run"] and "s more unless renewed" in got["run"]
        waited = two.take_until_held(3 * LEASE_S)
        log.info(
            "the locks of a killed host were taken over %.1f s after the kill (lease %g s)", waited, LEASE_S
        )
        assert json.loads((tmp_path / "run.lock").read_text())["host"] == "n2"

        # n2's holder stopped: its flock stays (as on a file system that has not noticed a dead
        # host), its lease stops
        hosts.boot("n1")
        one = Agent(hosts, "n1", tmp_path)
        assert one.send("ready?") == {}  # started (its imports done) before the other is stopped
        os.kill(two.proc.pid, signal.SIGSTOP)
        try:
            _refused_by(one.send("take"), "n2")
            one.take_until_held(3 * LEASE_S)
        finally:
            os.kill(two.proc.pid, signal.SIGCONT)
        assert two.send("release") == {}
        locks = [tmp_path / "run.lock", tmp_path / "fc.zarr.in-progress" / "_progress" / "lock"]
        held = {p.name for p in locks if p.exists() and json.loads(p.read_text())["host"] == "n1"}
        assert held == {"run.lock", "lock"}, "the resumed holder removed the new holder's lock"
        assert [p.name.split("-")[1] for p in ckpt.glob(".pin-*")] == ["n1"]
        assert one.send("release") == {}
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["meta.json"]


def test_a_lock_of_an_earlier_attempt_of_this_slurm_job_is_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slurm ends every task of a job before it requeues it: the requeued attempt takes its locks at
    once, though the host that held them is gone and their lease still runs; another job's, or the
    same attempt's, lock of another host is held while its lease runs."""
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    path = tmp_path / "run.lock"
    other = {"pid": 1, "host": f"not-{socket.gethostname()}", "started": "?", "command": "jigsaw-earth train"}
    earlier, same, another = ({"slurm_job": "4242", "slurm_restart": r} for r in (0, 1, 0))
    another["slurm_job"] = "4243"
    cases = [(earlier, False), (same, True), (another, True), ({}, True)]
    for extra, alive in cases:
        path.write_text(json.dumps({**other, **extra}))  # just written: its lease runs
        assert holder_alive({**other, **extra}, path) is alive, extra
    path.write_text(json.dumps({**other, "slurm_job": "4242", "slurm_restart": 0}))
    lock = PathLock.acquire(path, "run.dir x", "choose another")
    assert json.loads(path.read_text())["slurm_restart"] == 1
    lock.release()
    assert not path.exists()


def test_a_bad_lease_is_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in ("soon", "0", "-5", "nan"):
        monkeypatch.setenv(LEASE_ENV, bad)
        with pytest.raises(ValueError, match=rf"{LEASE_ENV}='{bad}': give the lock lease in seconds"):
            PathLock.acquire(tmp_path / "run.lock", "run.dir x", "choose another")
        assert not (tmp_path / "run.lock").exists()
