"""``jigsaw-earth launch --nproc-per-node N COMMAND ...``: N ranks of a command on this node, with the
ranks' exit status (75 when they stopped on a signal: ``jigsaw_earth/launcher.py``).

Use it where ``torchrun --nproc-per-node N -m jigsaw_earth COMMAND ...`` would be used on one node:
the same ranks and environment, but a ``SIGTERM`` (a scheduler's stop, ``kill``) makes it exit 75
like the ranks, where torchrun exits 1; every option after ``COMMAND`` is the command's own
(``predict --start`` included, which torchrun takes for its ``--start-method``). On several nodes,
run it on each with ``--nnodes K --node-rank I --master-addr HOST --master-port P`` (a static
rendezvous: node I's ranks are I × N … I × N + N − 1, the store on HOST), or let ``srun`` start
the ranks (``configs/slurm/*.sbatch``); both return the ranks' status the same way.
"""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "launch",
        help="N ranks of a command on this node; exits with their status (75 after a stop signal)",
        allow_abbrev=False,
    )
    p.add_argument("--nproc-per-node", type=int, default=1, metavar="N", help="ranks to start (default 1)")
    p.add_argument("--nnodes", type=int, default=1, metavar="K", help="nodes of the job (default 1)")
    p.add_argument("--node-rank", type=int, default=0, metavar="I", help="this node's number, 0 … K − 1")
    p.add_argument(
        "--master-addr", metavar="HOST",
        help="host of node 0 (the rendezvous store; needed with --nnodes > 1; default 127.0.0.1)",
    )  # fmt: skip
    p.add_argument("--master-port", type=int, metavar="P", help="its port (needed with --nnodes > 1)")
    p.add_argument(
        "--wait", type=float, default=120.0, metavar="S",
        help="after a rank fails or stops, the others get S seconds to end before they are stopped "
        "(default 120, as the Slurm templates' srun --wait)",
    )  # fmt: skip
    p.add_argument("rank_command", nargs=argparse.REMAINDER, metavar="COMMAND ...", help="e.g. train CONFIG")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..cli import COMMANDS
    from ..launcher import Nodes, launch

    if args.nproc_per_node < 1:
        raise ValueError(f"--nproc-per-node {args.nproc_per_node}: give at least 1 (e.g. --nproc-per-node 4)")
    if not args.wait >= 0:
        raise ValueError(f"--wait {args.wait}: give the seconds to wait, 0 or more (default 120)")
    if not args.rank_command or args.rank_command[0] not in COMMANDS or args.rank_command[0] == "launch":
        given = repr(args.rank_command[0]) if args.rank_command else "nothing"
        choices = ", ".join(c for c in COMMANDS if c != "launch")
        raise ValueError(f"launch runs a jigsaw-earth command ({choices}); got {given}: e.g. launch "
                         f"--nproc-per-node 4 train configs/demo.yaml")  # fmt: skip
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        raise ValueError(f"--nnodes {args.nnodes} --node-rank {args.node_rank}: give K ≥ 1 and 0 ≤ I < K")
    if args.nnodes > 1 and (args.master_addr is None or args.master_port is None):
        raise ValueError(f"--nnodes {args.nnodes}: give --master-addr HOST (node 0, reachable from every "
                         f"node) and --master-port P (the same on every node)")  # fmt: skip
    nodes = Nodes(args.nnodes, args.node_rank, args.master_addr or "127.0.0.1", args.master_port)
    return launch(args.rank_command, args.nproc_per_node, args.wait, nodes)
