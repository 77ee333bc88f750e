"""docs/cli.md's argument tables are the parser's own: a changed option shows up there, or this fails."""

from __future__ import annotations

import pytest

from jigsaw_earth.cli import COMMANDS
from jigsaw_earth.cli_docs import PAGE, command_parsers, refresh


def test_every_generated_block_is_current():
    _, stale = refresh(PAGE.read_text())
    assert not stale, f"docs/cli.md is stale for {stale}: run python -m jigsaw_earth.cli_docs"


def test_every_command_has_a_section_with_its_options():
    page = PAGE.read_text()
    leaves = [name for name, parser in command_parsers() if not parser._subparsers]
    missing = [name for name in leaves if f"<!-- options: {name} -->" not in page]
    assert not missing, f"docs/cli.md has no options block for {missing}"
    assert set(COMMANDS) <= {name.split()[0] for name in leaves}


def test_a_changed_option_makes_the_page_stale():
    page = PAGE.read_text().replace(
        "| `--overwrite` | replace an existing output |", "| `--overwrite` | x |", 1
    )
    _, stale = refresh(page)
    assert stale, "a hand edit inside a generated block went unnoticed"


def test_a_block_naming_an_unknown_command_is_refused():
    with pytest.raises(ValueError, match="jigsaw-earth nosuch"):
        refresh("<!-- options: nosuch -->\n<!-- end options -->")
