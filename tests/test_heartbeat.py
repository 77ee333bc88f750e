"""The words of a lost peer's verdict and of the per-pair transport line (pure functions; the
behaviour on real hosts is tests/test_multinode.py's)."""

from __future__ import annotations

from jigsaw_earth.distributed.heartbeat import EXIT_PEER_LOST, Verdict, communication_error, interval_for
from jigsaw_earth.distributed.shm import PeerGone
from jigsaw_earth.distributed.transport import describe_pairs, rank_spans
from jigsaw_earth.training.loop import NonFiniteLossError


def test_a_verdict_names_ranks_by_host_and_picks_the_exit_status() -> None:
    hosts = ["node1", "node1", "node2", "node2", "node3"]
    lost = Verdict([2, 3, 4], "no heartbeat for 105 s")
    assert lost.describe(hosts) == "lost ranks 2-3 on node2, rank 4 on node3 (no heartbeat for 105 s)"
    assert lost.exit_code == EXIT_PEER_LOST == 75  # requeued by the Slurm templates
    failed = Verdict([], "", {3: "ValueError: bad data"})
    assert failed.describe(hosts) == "rank 3 on node2 failed: ValueError: bad data"
    assert failed.exit_code == 1  # a requeue would fail the same way


def test_the_transport_line_counts_pairs_within_and_between_hosts() -> None:
    hosts = ["a", "a", "b", "b", "b"]
    rings = [frozenset({1}), frozenset({0}), frozenset({3, 4}), frozenset({2, 4}), frozenset({2, 3})]
    line = describe_pairs(hosts, rings, ["gloo"] * 5)
    assert line == (
        "2 host(s): a ranks 0-1, b ranks 2-4; pairs of ranks by transport: shared-memory rings (within a "
        "host) 4, gloo (between hosts) 6"
    )
    assert describe_pairs(hosts, [frozenset()] * 5, ["gloo"] * 5).endswith(
        "gloo (within a host) 4, gloo (between hosts) 6"
    )
    assert rank_spans([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"


def test_which_errors_ask_for_a_roll_call() -> None:
    assert communication_error(RuntimeError("Connection closed by peer"))  # gloo's
    assert communication_error(PeerGone("rank 1 exited"))
    assert not communication_error(NonFiniteLossError("loss nan"))  # this rank's own
    assert not communication_error(ValueError("bad config"))
    assert interval_for(120) == 5.0 and interval_for(10) == 0.5 and interval_for(1) == 0.5
