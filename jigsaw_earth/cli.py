"""``jigsaw-earth`` command line: one module per subcommand in ``jigsaw_earth.commands``."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from .fs_errors import explain

__all__ = ["EXIT_INTERRUPTED", "EXIT_PEER_GONE", "main"]

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_PEER_GONE = 1  # a collective failed because another rank died: that rank's status says why

COMMANDS = {
    "validate": "jigsaw_earth.commands.validate",
    "data": "jigsaw_earth.commands.data",
    "bench": "jigsaw_earth.commands.bench",
    "model": "jigsaw_earth.commands.model",
    "plan": "jigsaw_earth.commands.plan",
    "train": "jigsaw_earth.commands.train",
    "config": "jigsaw_earth.commands.config",
    "score": "jigsaw_earth.commands.score",
    "plot": "jigsaw_earth.commands.plot",
    "predict": "jigsaw_earth.commands.predict",
    "selftest": "jigsaw_earth.commands.selftest",
    "launch": "jigsaw_earth.commands.launch",
    "ensemble": "jigsaw_earth.commands.ensemble",
}

# One line per command for ``--help``; a command's module (and its heavy imports) is loaded only
# when that command runs.
SUMMARIES = {
    "validate": "check every distributed op, layer and model against its serial counterpart",
    "data": "synthesise, prepare, inspect ERA5-style Zarr stores; per-rank I/O report",
    "bench": "jigsaw layers and models against plain-PyTorch twins; matmul micro-benchmark",
    "model": "model summary (parameters, memory, communication); export a trained model, verify one",
    "plan": "rank the data × lat × lon meshes of a world size: memory, bytes, step time, a pick",
    "train": "train from a YAML config (single process, torchrun or Slurm srun)",
    "config": "validate or show a training config",
    "score": "WeatherBench 2 scorecard of a forecast store",
    "plot": "scorecard and map PNGs of a score file",
    "predict": "sharded inference: forecasts written by all ranks into one WB2-layout Zarr",
    "selftest": "is this machine ready? versions, GEMM rate, a tiny run on the device against the CPU",
    "launch": "N ranks of a command on this node, exiting with their status (75 after a stop signal)",
    "ensemble": "ensembles from any model: calibrate a predict --perturb scheme's amplitude",
}


def _parser(chosen: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jigsaw-earth",
        description="Domain- and weight-sharded weather forecasting (Jigsaw) on any lat × lon mesh.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        if name == chosen:
            importlib.import_module(module).add_parser(sub)
        else:
            sub.add_parser(name, help=SUMMARIES.get(name, ""), add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C while parsing or importing: one line, no traceback
        print("jigsaw-earth: interrupted (Ctrl-C)", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(argv: list[str]) -> int:
    if os.environ.get("JIGSAW_DEVICE_PLUGIN"):  # a device torch does not ship, in every rank
        from .device import load_device_plugin

        load_device_plugin()
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser = _parser(chosen)
    args, extra = parser.parse_known_args(argv)
    # KEY=VALUE overrides may follow a command's options (argparse cannot intermix positionals)
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.argv = argv  # the command line as given (recorded by commands that write results)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if not args.verbose:  # zarr's abandoned asyncio tasks after a read error: noise, not the error
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print(
            f"jigsaw-earth {args.command}: interrupted (Ctrl-C); nothing after the last message was kept "
            f"({_resumes(args.command)})",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    except OSError as err:  # a blocked or read-only directory, a full disk, a missing file
        text = explain(err) if err.errno is not None and err.filename is not None else str(err)
        print(f"jigsaw-earth {args.command}: error: {text}", file=sys.stderr)
        return 2
    except (ValueError, KeyError) as err:
        print(f"jigsaw-earth {args.command}: error: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        if not _peer_gone(err):
            raise
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        print(f"jigsaw-earth {args.command}: error: another rank is gone ({first}); its own messages say "
              f"why. Run the same command again: {_resumes(args.command)}", file=sys.stderr)  # fmt: skip
        return EXIT_PEER_GONE


def _resumes(command: str) -> str:
    if command == "predict":
        return "a predict resumes from its last recorded batch"
    return "a training run resumes from its last checkpoint"


#: what torch.distributed's backends say when another rank's process is gone (gloo raises a plain
#: ``RuntimeError``, NCCL a ``DistBackendError`` naming a remote error), and the shared-memory rings
#: (``distributed/shm.py``)
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing",
             "ncclRemoteError", "remote process exited", "exited while rank")  # fmt: skip


def _peer_gone(err: RuntimeError) -> bool:
    """A collective failed because another rank died (killed, out of memory), not by this rank's fault."""
    dist = sys.modules.get("torch.distributed")
    kind = getattr(dist, "DistError", None)
    text = str(err)
    return (kind is not None and isinstance(err, kind)) or any(s in text for s in PEER_GONE)


if __name__ == "__main__":
    sys.exit(main())
