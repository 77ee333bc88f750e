"""``jigsaw-earth`` command line: one module per subcommand in ``jigsaw_earth.commands``."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

__all__ = ["main"]

COMMANDS = {
    "validate": "jigsaw_earth.commands.validate",
    "data": "jigsaw_earth.commands.data",
    "bench": "jigsaw_earth.commands.bench",
    "model": "jigsaw_earth.commands.model",
    "train": "jigsaw_earth.commands.train",
    "config": "jigsaw_earth.commands.config",
    "score": "jigsaw_earth.commands.score",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jigsaw-earth",
        description="Domain- and weight-sharded weather forecasting (Jigsaw) on any lat × lon mesh.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS.values():
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        return int(args.run(args) or 0)
    except (ValueError, FileNotFoundError, KeyError) as err:
        print(f"jigsaw-earth {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
