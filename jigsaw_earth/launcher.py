"""Start N ranks of one command on this node, forward stop signals to them, exit with their status.

On several nodes each node's launcher starts its share (``Nodes``: node I of K runs ranks
I × N … I × N + N − 1, and every rank meets at the store on ``--master-addr:--master-port``,
a static rendezvous like torchrun's ``--nnodes K --node-rank I``).

``jigsaw-earth launch --nproc-per-node N COMMAND ...`` is torchrun's single-node case without its
agent: it sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` (a free port on 127.0.0.1) for each rank, runs ``python -m jigsaw_earth COMMAND ...``,
and relays ``SIGTERM``, ``SIGUSR1``, ``SIGINT`` and ``SIGHUP`` to every rank. A rank that stops on a
signal exits 75 after its checkpoint (train) or its recorded batches (predict); torchrun answers a
``SIGTERM`` with its own exit 1 and a traceback, while this launcher exits with the ranks' status, so
a wrapper that reruns on 75 does. Each rank runs in its own session (a Ctrl-C at the terminal reaches
the launcher, which forwards it once) and gets ``SIGTERM`` if the launcher dies (Linux).

The status (``launch_status``): the first rank to exit with a code other than 0 and 75 decides (a
failure); else 75 when any rank stopped on a signal; else 0. Once a rank has failed or stopped, the
others get ``wait_s`` seconds to end on their own (they reach the same step boundary or the same
peer timeout), then ``SIGTERM``, then ``SIGKILL`` 10 s later; the ranks the launcher ended do not
decide the status.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType

__all__ = ["FORWARDED", "Nodes", "launch", "launch_status"]

log = logging.getLogger(__name__)
FORWARDED = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)
EXIT_STOPPED = 75
_KILL_AFTER_S = 10.0


def launch_status(exits: Sequence[int]) -> int:
    """The launcher's exit status from the ranks' own exit codes, in the order they exited (negative:
    killed by that signal, reported as 128 + signal, as shells do)."""
    codes = [128 - c if c < 0 else c for c in exits]
    failed = [c for c in codes if c not in (0, EXIT_STOPPED)]
    if failed:
        return failed[0]
    return EXIT_STOPPED if EXIT_STOPPED in codes else 0


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass(frozen=True)
class Nodes:
    """The job's nodes: ``count`` of them, this one number ``rank``; the store on ``addr:port``
    (``port`` None: a free one, for one node)."""

    count: int = 1
    rank: int = 0
    addr: str = "127.0.0.1"
    port: int | None = None


def launch(command: Sequence[str], nproc: int, wait_s: float = 120.0, nodes: Nodes = Nodes()) -> int:
    """Run ``python -m jigsaw_earth *command`` as this node's ``nproc`` ranks; returns ``launch_status``."""
    from .distributed.spawn import free_port

    port = str(nodes.port or free_port())
    world = str(nodes.count * nproc)
    procs: list[subprocess.Popen] = []
    for local in range(nproc):
        rank = nodes.rank * nproc + local
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": world,
               "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": nodes.addr, "MASTER_PORT": port}  # fmt: skip
        if nproc > 1:
            env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun: N ranks share the node's cores
        procs.append(subprocess.Popen([sys.executable, "-m", "jigsaw_earth", *command], env=env,
                                      start_new_session=True, preexec_fn=_die_with_parent))  # fmt: skip

    def forward(signum: int, frame: FrameType | None) -> None:
        log.debug("forwarding %s to %d ranks", signal.Signals(signum).name, nproc)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    saved = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        exits = _wait(procs, wait_s)
        status = launch_status(exits)
        if status:
            ended = len(procs) - len(exits)
            log.warning("ranks exited with %s%s; launch exits %d", ", ".join(map(str, exits)),
                        f" ({ended} stopped by the launcher)" if ended else "", status)  # fmt: skip
        return status
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        for p in procs:  # never leave a rank behind (an exception in the launcher itself)
            if p.poll() is None:
                p.kill()


def _wait(procs: list[subprocess.Popen], wait_s: float) -> list[int]:
    """The ranks' own exit codes, in the order they exited (those the launcher ended left out)."""
    exits: list[int] = []
    seen: set[int] = set()
    ended: set[int] = set()
    deadline = term_at = None
    while len(seen) < len(procs):
        for rank, p in enumerate(procs):
            if rank in seen or p.poll() is None:
                continue
            seen.add(rank)
            if rank not in ended:
                exits.append(p.returncode)
                if p.returncode != 0 and deadline is None:
                    deadline = time.monotonic() + wait_s
                    log.warning("rank %d exited with %d; the other ranks get %g s to end", rank, p.returncode,
                                wait_s)  # fmt: skip
        now = time.monotonic()
        if deadline is not None and now > deadline and term_at is None:
            term_at = now
            for rank, p in enumerate(procs):
                if p.poll() is None:
                    log.warning("rank %d did not end within %g s: stopping it", rank, wait_s)
                    ended.add(rank)
                    p.terminate()
        if term_at is not None and now > term_at + _KILL_AFTER_S:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.05)
    return exits
