"""A lost peer ends the job: every rank beats through the rendezvous store, and stops when one falls silent.

gloo waits in a receive from a peer whose host crashed or was cut off (nothing closes the
connection) until TCP gives up, many minutes later; a peer whose process died closes its sockets,
and the ranks that talked to it raise, but the others wait on, and nothing says who was lost. So
every rank runs a side thread (``PeerWatch``) that, every ``interval_s`` (a twentieth of
``timeout_s``, 0.5 to 5 s), adds 1 to its own counter in the job's rendezvous ``TCPStore``
(``MASTER_ADDR:MASTER_PORT``: torchrun's agent store, or rank 0's under ``srun`` and ``jigsaw-earth
launch``; keys under ``jigsaw-earth/heartbeat/RUN/ATTEMPT``) and reads every rank's counter in one
request. A rank's thread beats whatever its main thread does (a checkpoint written to a slow file
system, a first step that compiles, a validation pass), so the timeout covers network hiccups, not
work.

The verdict:

* a counter that has not moved for ``silence_s`` (``timeout_s`` less five beats, the time the
  goodbye takes): that rank is lost (its host crashed or its link is cut); a store that has not
  answered for as long: the ranks of the store's host are;
* when the main thread's communication fails (a peer's connection closed, a shared-memory peer gone,
  a collective timed out; ``conclude``), a roll call: after a fresh read every rank that has not left
  on purpose must beat within three beats, and those that do not are lost;
* a rank that left on purpose says why (``leave``): done, stopped, or failed with its error. A peer
  that failed is named with its error and the survivors exit 1 (no requeue: the error would come
  back); lost peers make them exit ``EXIT_PEER_LOST`` (75, what the Slurm templates requeue);
* the first rank to reach a verdict publishes it in the store, and the others adopt it at their
  next beat: every survivor names the same ranks, soon after the first.

The verdict is logged as one line (``describe`` adds what the command knows: the newest complete
checkpoint, the command that resumes), and the process ends at once with ``os._exit``, from
whichever thread reached it: a gloo wait cannot be interrupted, and the process group's teardown
would wait on the lost peer too (rank 0 first waits two beats when its process serves the store, so
the others can read the verdict). A checkpoint being written at that moment stays an unfinished
``step_N.tmp`` folder, which no load takes (``checkpoint/manager.py``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import NoReturn

import torch.distributed as dist

from .transport import rank_spans

__all__ = ["EXIT_PEER_LOST", "LEFT", "PeerGone", "PeerWatch", "Verdict", "interval_for", "watched"]

log = logging.getLogger(__name__)
EXIT_PEER_LOST = 75  # EX_TEMPFAIL, as a stop on a signal: the Slurm templates requeue it
LEFT = 1 << 40  # added to a rank's counter when it leaves on purpose (its reason under why/RANK)


class PeerGone(RuntimeError):
    """A peer this rank waits for is gone (its process exited); raised by the transports."""


def interval_for(timeout_s: float) -> float:
    """Seconds between beats: a twentieth of the timeout, within [0.5, 5] s."""
    return min(5.0, max(0.5, timeout_s / 20))


@dataclass
class Verdict:
    """Who is gone and why: ``lost`` ranks (no beat), ``failed`` ranks with their errors."""

    lost: list[int] = field(default_factory=list)
    why: str = ""
    failed: dict[int, str] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return 1 if self.failed and not self.lost else EXIT_PEER_LOST

    def to_json(self) -> str:
        return json.dumps({"lost": self.lost, "why": self.why, "failed": self.failed})

    @classmethod
    def from_json(cls, text: str) -> Verdict:
        data = json.loads(text)
        return cls(list(data["lost"]), data["why"], {int(r): e for r, e in data["failed"].items()})

    def describe(self, hosts: list[str]) -> str:
        """``ranks 2-3 on node2 lost (no heartbeat for 120 s)`` or ``rank 3 on node2 failed: …``."""
        parts = []
        if self.lost:
            by_host: dict[str, list[int]] = {}
            for r in self.lost:
                by_host.setdefault(hosts[r] if r < len(hosts) else "?", []).append(r)
            where = ", ".join(
                f"rank{'s' if len(rs) > 1 else ''} {rank_spans(rs)} on {h}" for h, rs in by_host.items()
            )
            parts.append(f"lost {where} ({self.why})")
        for r, err in sorted(self.failed.items()):
            parts.append(f"rank {r} on {hosts[r] if r < len(hosts) else '?'} failed: {err}")
        return "; ".join(parts)


class PeerWatch:
    """This rank's heartbeat and watch over its peers (the module docstring); ``start`` is collective.

    Two daemon threads: the beater talks to the store (a call may block for as long as a cut link
    lasts) and keeps what it learns; the judge only reads that, so it decides on time whatever the
    network does. The main thread never calls the store either (``roll_call`` reads the beater's
    news), so nothing here waits on a lost host."""

    def __init__(self, rank: int, world: int, hosts: list[str], timeout_s: float,
                 describe: Callable[[Verdict], str] = lambda v: "",
                 on_end: Callable[[], None] = lambda: None) -> None:  # fmt: skip
        self.rank, self.world, self.hosts, self.timeout_s = rank, world, hosts, timeout_s
        self.describe, self.on_end = describe, on_end
        self.interval_s = interval_for(timeout_s)
        # silence that makes a verdict: the rest of timeout_s covers the judge's tick, the goodbye and
        # the store's host waiting for the others to read the verdict (``_end``)
        self.silence_s = timeout_s - 5 * self.interval_s
        self.store: dist.Store | None = None
        self.store_host: list[int] = []  # the ranks on the store's host
        self._stop = threading.Event()  # set: no verdict any more (this rank leaves or ends)
        self._leaving: str | None = None  # why, once ``leave`` is called; the beater records it
        self._left = threading.Event()  # the beater has recorded why (or given up)
        self._wake = threading.Event()  # the beater's sleep ends early (a roll call, or leaving)
        self._concluding = threading.Lock()
        self._news = threading.Condition()  # the beater's last read: counters, when, why-left
        now = time.monotonic()
        self._seen, self._moved, self._store_ok = [0] * world, [now] * world, now
        self._reads = 0  # successful reads so far
        self._why: dict[int, str] = {}
        self._verdict: str | None = None  # this rank's, for the beater to publish
        self.published: Verdict | None = None  # the first verdict a peer published

    # ------------------------------------------------------------------ life cycle
    def start(self) -> bool:
        """Connect to the rendezvous store, make this rank's counter, start beating (collective).
        False (every rank alike, with a warning) when a rank cannot reach the store: no watch."""
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        run = os.environ.get("TORCHELASTIC_RUN_ID", os.environ.get("SLURM_JOB_ID", ""))
        failure = ""
        try:
            client = dist.TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=self.timeout_s),
                                   wait_for_workers=False)  # fmt: skip
            self.store = dist.PrefixStore(f"jigsaw-earth/heartbeat/{run}/{attempt}", client)
            self.store.add(self._key(self.rank), 1)
        except Exception as err:
            failure = f"rank {self.rank}: {str(err).splitlines()[0] if str(err) else type(err).__name__}"
        flags: list = [None] * self.world
        dist.all_gather_object(flags, (failure, _on_store_host(addr, port)))  # every counter exists now
        failed = [f for f, _ in flags if f]
        if failed:
            log.warning("no heartbeat: the rendezvous store %s:%d is out of reach (%s); a lost host may "
                        "leave this job waiting", addr, port, "; ".join(failed))  # fmt: skip
            return False
        self.store_host = [r for r, (_, here) in enumerate(flags) if here]
        self._record(self.store.multi_get([self._key(r) for r in range(self.world)]))  # type: ignore[union-attr]
        for target, name in ((self._beat, "jigsaw-heartbeat"), (self._judge, "jigsaw-peer-watch")):
            threading.Thread(target=target, name=name, daemon=True).start()
        log.debug("heartbeat every %.1f s; a peer silent for %g s is lost", self.interval_s, self.timeout_s)
        return True

    def leave(self, why: str) -> None:
        """Stop judging and tell the peers why this rank goes (``done``, ``stopped``, ``failed: …``),
        so they do not count it as lost; waits two beats at most. Idempotent."""
        if self._stop.is_set():
            return
        self._go(why[:300])

    def _go(self, why: str, verdict: Verdict | None = None) -> None:
        """Stop judging; the beater publishes ``verdict`` (unless a peer did), records ``why`` and
        stops (waited for a beat at most)."""
        self._stop.set()
        self._verdict = verdict.to_json() if verdict is not None else None
        self._leaving = why
        self._wake.set()
        self._left.wait(timeout=self.interval_s)

    # ------------------------------------------------------------------ the beater (store I/O)
    @staticmethod
    def _key(rank: int) -> str:
        return f"beat/{rank}"

    def _beat(self) -> None:
        store, keys = self.store, [self._key(r) for r in range(self.world)]
        assert store is not None
        while True:
            if self._leaving is not None:
                try:
                    if self._verdict is not None and not store.check(["verdict"]):
                        store.set("verdict", self._verdict)  # the others adopt it (a race is harmless)
                    store.set(f"why/{self.rank}", self._leaving)
                    store.add(self._key(self.rank), LEFT)
                except Exception as err:  # the store's host may be gone: peers then judge by silence
                    log.debug("heartbeat: could not record leaving (%s)", err)
                self._left.set()
                return
            try:
                store.add(self._key(self.rank), 1)
                values = [int(v) for v in store.multi_get(keys)]
                for r, v in enumerate(values):  # why a peer left, read once
                    if v >= LEFT and r != self.rank and r not in self._why:
                        self._why[r] = store.get(f"why/{r}").decode() if store.check([f"why/{r}"]) else ""
                if self.published is None and store.check(["verdict"]):
                    self.published = Verdict.from_json(store.get("verdict").decode())
                self._record(values)
            except Exception as err:
                log.debug("heartbeat: the store did not answer (%s)", err)
            if self._wake.wait(self.interval_s) and self._leaving is None:
                self._wake.clear()  # a roll call asked for this read

    def _record(self, values: list) -> None:
        now = time.monotonic()
        with self._news:
            for r, v in enumerate(values):
                v = int(v)
                if v != self._seen[r]:
                    self._seen[r], self._moved[r] = v, now
            self._store_ok, self._reads = now, self._reads + 1
            self._news.notify_all()

    # ------------------------------------------------------------------ the judge (no I/O)
    def _judge(self) -> None:
        while not self._stop.wait(self.interval_s / 2):
            verdict = self.published or self.silent()
            if verdict is not None and not self._stop.is_set():
                self._end(verdict)

    def silent(self) -> Verdict | None:
        """A verdict once the store or a peer has been silent for ``silence_s``; else None. Peers
        silent for three beats by then are named with it (they fell silent at the same moment).
        While the store does not answer this rank, its peers' silence is not theirs to answer for."""
        now, limit = time.monotonic(), self.silence_s
        with self._news:
            if now - self._store_ok > limit:
                silent = f"the rendezvous store did not answer for {limit:.0f} s"
                return Verdict(self._store_host_peers(), silent)
            if now - self._store_ok > 2 * self.interval_s:
                return None
            quiet = [r for r in range(self.world) if self._seen[r] < LEFT and r != self.rank]
            if not any(now - self._moved[r] > limit for r in quiet):
                return None
            lost = [r for r in quiet if now - self._moved[r] > 3 * self.interval_s]
        return Verdict(lost, f"no heartbeat for {limit:.0f} s")

    def _store_host_peers(self) -> list[int]:
        return [r for r in self.store_host if r != self.rank] or list(self.store_host)

    def roll_call(self) -> Verdict:
        """Who is gone now: peers that neither beat within three intervals of a fresh read nor left
        on purpose, with those that left with an error; the store's host when it stays silent. (The
        fresh read comes first: a peer that beat once more just before it died must not count.)"""
        deadline = time.monotonic() + 4 * self.interval_s
        with self._news:
            reads = self._reads
            self._wake.set()  # the beater reads at once
            while self._reads == reads and time.monotonic() < deadline:
                self._news.wait(timeout=max(0.0, deadline - time.monotonic()))
            if self._reads == reads:
                return Verdict(self._store_host_peers(), "the rendezvous store does not answer")
            first, reads = list(self._seen), self._reads
            waiting = {r for r, v in enumerate(first) if v < LEFT and r != self.rank}
            while waiting and time.monotonic() < deadline and self.published is None:
                self._news.wait(timeout=max(0.0, deadline - time.monotonic()))
                waiting = {r for r in waiting if self._seen[r] == first[r]}
            if self.published is not None:  # a peer's verdict came first: everyone tells the same
                return self.published
            if waiting and self._reads == reads:
                return Verdict(self._store_host_peers(), "the rendezvous store stopped answering")
            left = {r: self._why.get(r, "") for r, v in enumerate(self._seen) if v >= LEFT and r != self.rank}
        failed = {r: why.partition(": ")[2] or why for r, why in left.items() if why.startswith("failed")}
        return Verdict(sorted(waiting), "its processes are gone or unreachable", failed)

    # ------------------------------------------------------------------ ending
    def conclude(self, error: BaseException) -> None:
        """The main thread's communication failed with ``error``: when peers are gone (lost or
        failed), end this process with the verdict; otherwise return (the error is this rank's own,
        and the caller raises it after ``leave``)."""
        if self._concluding.locked():  # the beating thread is ending the process with its verdict
            while True:
                time.sleep(60)
        if self._stop.is_set():
            return
        verdict = self.roll_call()
        if verdict.lost or verdict.failed:
            self._end(verdict)

    def _end(self, verdict: Verdict) -> NoReturn:
        """Log the one line, tell the peers this rank stops (two beats at most), exit at once."""
        if not self._concluding.acquire(blocking=False):  # the other thread is ending the process
            while True:
                time.sleep(60)
        me = f"rank {self.rank} on {self.hosts[self.rank] if self.hosts else socket.gethostname()}"
        extra = self.describe(verdict)
        log.error("%s; %s stops (exit %d)%s", verdict.describe(self.hosts), me, verdict.exit_code,
                  f"; {extra}" if extra else "")  # fmt: skip
        self._go("stopped: a peer is gone", verdict)
        try:
            self.on_end()  # what must not outlive this process (a lock another host cannot judge)
        except Exception as err:
            log.debug("heartbeat: on_end failed (%s)", err)
        if self.rank == 0 and "TORCHELASTIC_USE_AGENT_STORE" not in os.environ:
            time.sleep(2 * self.interval_s)  # this process serves the store: the others read the verdict
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(verdict.exit_code)


def _on_store_host(addr: str, port: int) -> bool:
    """Whether this process runs on the host of the store at ``addr`` (the address this host uses to
    reach it is the store's own address, or the store is on loopback)."""
    try:
        target = socket.gethostbyname(addr)
        if target.startswith("127."):
            return True
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target, port))  # no packet is sent: the route picks the local address
            return s.getsockname()[0] == target
    except OSError:
        return False


def communication_error(err: BaseException) -> bool:
    """Whether ``err`` is how a failed peer shows on this rank: torch.distributed's errors, gloo's
    plain ``RuntimeError``, a shared-memory peer gone (``PeerGone``)."""
    return isinstance(err, (dist.DistError, PeerGone)) or type(err) is RuntimeError


@contextlib.contextmanager
def watched(rank: int, world: int, hosts: list[str], timeout_s: float, describe: Callable[[Verdict], str],
            on_end: Callable[[], None] = lambda: None) -> Iterator[PeerWatch | None]:  # fmt: skip
    """Run the block under this rank's ``PeerWatch`` (none for one process or without a rendezvous
    store): a communication error escaping it first asks the roll call (``conclude``); leaving it
    tells the peers why (done, stopped on a signal, failed with the error's first line). ``on_end``
    runs before a verdict ends the process (``finally`` blocks do not run then)."""
    if world < 2 or not dist.is_initialized() or "MASTER_ADDR" not in os.environ:
        yield None
        return
    watch = PeerWatch(rank, world, hosts, timeout_s, describe, on_end)
    if not watch.start():
        yield None
        return
    try:
        yield watch
    except BaseException as err:
        if communication_error(err):
            watch.conclude(err)
        stopped = getattr(err, "exit_code", None) == EXIT_PEER_LOST or isinstance(err, KeyboardInterrupt)
        first = (str(err).splitlines() or [""])[0]
        watch.leave("stopped" if stopped else f"failed: {type(err).__name__}: {first}")
        raise
    watch.leave("done")
