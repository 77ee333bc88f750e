"""docs/ describes the project as it is, and nothing in docs/ or scripts/ names a path of one machine.

Narration of earlier states (the words the docs used for it: "stop 30", "this round", "Measured
again", "before → after", "no longer", "the former …") belongs to git log. An absolute ``/root``,
``/home`` or ``/work`` path exists only on the machine it was written on, and so does a result
file left in ``/tmp`` (``--json /tmp/run.json``); ``/tmp`` as scratch space in a recipe (``pip
install --target /tmp/site``) is any machine's. Each pattern is narrow on purpose: ``mktemp``,
``tmp_path``, ``runs/tmp``, "round the ring" or "an earlier run's directory" are not matched.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT = {".md", ".py", ".json", ".yaml", ".yml", ".txt", ".sh", ".toml", ".cfg", ".ipynb"}

NARRATION = {
    "a numbered stop": r"\bstops? \d+\b",
    "a numbered round": r"\brounds? \d+\b",
    "this/last/previous stop or round": r"\b(this|last|previous|next|earlier|first|second) (stop|round)s?\b",
    "before a stop or a change": r"\bbefore (stop|round|the change|this change|the option)\b",
    "before → after": r"\bbefore\s*(→|->|/)\s*after\b",
    "measured again": r"\bmeasured again\b",
    "Done …": r"(^|[*>#-]\s+|\*\*|[.:;]\s+)Done\b",
    "Earlier, …": r"(^|[*>#-]\s+|[.;]\s+)Earlier\b",
    "an earlier version": r"\bearlier (versions?|commits?|code|figures?|measurements?)\b",
    "no longer": r"\bno longer\b",
    "used to": r"\bused to (be|take|run|read|write|send)\b",
    "the former …": r"\b(the former(?! and\b| or\b)|formerly)\b",
    "was changed": r"(?<!nothing )\b(was|were) changed\b",
    "as before": r"\bas before\b",
    "a figure labelled before": r"^\|\s*[`*]*(before|after|old|new)\b|\bbefore: old\b",
}
_START = r"(?<![\w.~$-])"
ABSOLUTE = _START + r"/(root|home|work)\b|" + _START + r"/tmp/\S*\.(json|md|log|txt|csv|png|zarr|nc|pt)\b"


def _files() -> list[Path]:
    paths = [*(ROOT / "docs").rglob("*"), *(ROOT / "scripts").rglob("*")]
    return sorted(p for p in paths if p.is_file() and p.suffix in TEXT)


def _hits(pattern: str, flags: int = 0) -> list[str]:
    rx = re.compile(pattern, flags | re.MULTILINE)
    found = []
    for path in _files():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if rx.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    return found


def test_the_check_reads_the_docs_and_the_scripts():
    names = {p.relative_to(ROOT).as_posix() for p in _files()}
    assert {"docs/gpu.md", "docs/install-offline.md", "scripts/check_demo.py"} <= names


@pytest.mark.parametrize("what", sorted(NARRATION))
def test_docs_do_not_narrate_earlier_states(what):
    flags = 0 if what in ("Done …", "Earlier, …") else re.IGNORECASE
    hits = _hits(NARRATION[what], flags)
    assert not hits, f"{what}: describe what the project does now (history lives in git):\n" + "\n".join(hits)


def test_no_absolute_path_of_a_machine():
    hits = _hits(ABSOLUTE)
    assert not hits, "absolute paths of one machine; use a path relative to the repository:\n" + "\n".join(
        hits
    )


@pytest.mark.parametrize(
    "line, bad",
    [
        ("python scripts/plan_docs.py > /tmp/recommendations.md", True),
        ("--json /tmp/wt/bench.json", True),
        ("pip install --no-index --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site", False),
        ("out=$(mktemp -d); `tmp_path` and runs/tmp/x.json and $TMPDIR/x.json", False),
        ("see /work/shared/reference.md", True),
        ("file:///home/user/x", True),
        ("~/work/x or $HOME/work", False),
        ("the blocks travel as one message round the ring", False),
    ],
)
def test_the_path_pattern_is_precise(line, bad):
    assert bool(re.search(ABSOLUTE, line)) is bad


@pytest.mark.parametrize(
    "line, what",
    [
        ("After stop 30 the ring is faster", "a numbered stop"),
        ("* Done: the pair", "Done …"),
        ("Measured again on 2 cores", "measured again"),
        ("| time before → after |", "before → after"),
        ("the training figures of the first round", "this/last/previous stop or round"),
        ("the former two-pass autograd graph", "the former …"),
        ("| before: old `ring_attention` / SDPA | 3.26 |", "a figure labelled before"),
        ("NCCL runs use the process group as before.", "as before"),
    ],
)
def test_the_narration_patterns_catch_what_the_docs_wrote(line, what):
    flags = 0 if what in ("Done …", "Earlier, …") else re.IGNORECASE
    assert re.search(NARRATION[what], line, flags)
