"""``docs/cli.md`` kept true: every command's options rendered from the parser the CLI itself builds.

The page is hand-written prose with generated blocks between ``<!-- options: COMMAND -->`` and
``<!-- end options -->``; ``python -m jigsaw_earth.cli_docs`` rewrites the blocks in place and
``--check`` exits 1 naming each stale one (``tests/test_cli_docs.py`` runs it). The tables are made
from argparse's actions, not from ``--help`` text, so they read the same on every Python.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from .cli import COMMANDS

__all__ = ["command_parsers", "options_table", "refresh"]

PAGE = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
BLOCK = re.compile(r"(<!-- options: (?P<name>[\w -]+) -->\n)(?P<body>.*?)(<!-- end options -->)", re.DOTALL)


def command_parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every command and subcommand's parser, by its full name (``predict``, ``data prepare``)."""
    root = argparse.ArgumentParser(prog="jigsaw-earth")
    sub = root.add_subparsers(dest="command")
    for module in COMMANDS.values():
        importlib.import_module(module).add_parser(sub)
    yield from _walk(sub, "")


def _walk(sub: argparse._SubParsersAction, prefix: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for name, parser in sub.choices.items():
        full = f"{prefix}{name}"
        yield full, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                yield from _walk(action, f"{full} ")


def _spelling(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`" + (" …" if action.nargs in ("*", "+") else "")
    takes = action.nargs != 0
    metavar = action.metavar or (
        "{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.dest.upper()
    )
    tail = f" {metavar}" + (" …" if action.nargs in ("*", "+") else "") if takes else ""
    return " · ".join(f"`{opt}{tail}`" for opt in action.option_strings)


def _meaning(action: argparse.Action) -> str:
    text = " ".join((action.help or "").split()).replace("|", "\\|")
    if action.default not in (None, False, argparse.SUPPRESS, [], 0, "") and "default" not in text:
        text += f" (default {action.default})"
    return text


def options_table(parser: argparse.ArgumentParser) -> str:
    """The usage line and one table row per argument of ``parser`` (help and subcommands left out)."""
    usage = " ".join(parser.format_usage().split())
    rows = ["| argument | meaning |", "|---|---|"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        rows.append(f"| {_spelling(action)} | {_meaning(action)} |")
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for sub in subs:
        for choice in sub._choices_actions:
            rows.append(f"| `{choice.dest}` | {' '.join((choice.help or '').split())} |")
    return f"`{usage.removeprefix('usage: ')}`\n\n" + "\n".join(rows) + "\n"


def refresh(page: str) -> tuple[str, list[str]]:
    """``page`` with every generated block rewritten, and the names of the blocks that changed."""
    parsers = dict(command_parsers())
    stale: list[str] = []

    def render(match: re.Match) -> str:
        name = match["name"].strip()
        if name not in parsers:
            raise ValueError(f"docs/cli.md names a command 'jigsaw-earth {name}' the CLI does not have")
        body = options_table(parsers[name])
        if body != match["body"]:
            stale.append(name)
        return f"{match[1]}{body}{match[4]}"

    return BLOCK.sub(render, page), stale


def main(argv: list[str] | None = None) -> int:
    check = "--check" in (sys.argv[1:] if argv is None else argv)
    text, stale = refresh(PAGE.read_text())
    if check:
        if stale:
            print(f"docs/cli.md is stale for: {', '.join(stale)}; run python -m jigsaw_earth.cli_docs")
            return 1
        return 0
    PAGE.write_text(text)
    print(f"docs/cli.md: {len(stale)} block(s) rewritten" + (f" ({', '.join(stale)})" if stale else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
