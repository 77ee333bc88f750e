"""No tracked text file holds a merge-conflict marker.

A merge that left ``<<<<<<<`` / ``=======`` / ``>>>>>>>`` lines in a file is caught here, locally
and in CI's default run. The three markers are matched only as git writes them: at the start of a
line, ``<<<<<<<`` and ``>>>>>>>`` followed by a space (or the line's end), ``=======`` alone on its
line. reStructuredText table rules (``=====  =====``) and Markdown's setext underlines of other
lengths are not markers.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^(<{7}|>{7})( |$)|^={7}$|^\|{7}( |$)", re.MULTILINE)


def tracked_text_files() -> list[Path]:
    """Every file git tracks (or would track: untracked and not ignored), binary files left out."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (git ls-files failed): the conflict-marker check needs git")
    files = []
    for name in out.decode().split("\0"):
        path = ROOT / name
        if name and path.is_file() and b"\0" not in path.read_bytes()[:8192]:
            files.append(path)
    return files


def find_markers(text: str) -> list[int]:
    """1-based line numbers of the conflict markers in ``text``."""
    return [text.count("\n", 0, m.start()) + 1 for m in MARKER.finditer(text)]


def test_marker_pattern_matches_what_git_writes():
    merged = "a\n<<<<<<< HEAD\nours\n=======\ntheirs\n>>>>>>> main\nb\n"
    assert find_markers(merged) == [2, 4, 6]
    diff3 = "<<<<<<< HEAD\nx\n||||||| base\ny\n=======\nz\n>>>>>>> topic\n"
    assert find_markers(diff3) == [1, 3, 5, 7]
    tables = "=====  =====\nname   value\n=====  =====\nTitle\n========\n"
    assert find_markers(tables) == []


def test_no_tracked_file_holds_a_conflict_marker():
    found = []
    for path in tracked_text_files():
        text = path.read_text(errors="replace")
        found += [f"{path.relative_to(ROOT)}:{line}" for line in find_markers(text)]
    assert not found, "merge-conflict markers left in: " + ", ".join(found) + " (resolve the merge)"
