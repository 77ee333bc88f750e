"""The command line's argument vocabulary, written once: ``AxB`` integer tuples (grids, meshes,
chunks), byte sizes, comma lists (variables, levels, names) and paths that may be URLs.

Every parser takes ``what`` (the flag, e.g. ``"--grid"``) and raises a one-line ``ValueError``
naming the flag, the value received and the form to write, with an example.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

__all__ = [
    "BYTE_UNITS",
    "URL",
    "one_input",
    "parse_bytes",
    "parse_grid",
    "parse_ints",
    "parse_list",
    "path_or_url",
]

T = TypeVar("T")
URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")  # scheme://…: a store or file somewhere else

# decimal (KB = 1000 B) and binary (KiB = 1024 B) units, matched case-insensitively
BYTE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
BYTE_UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_ints(
    text: str, what: str, n: int | None = None, *, sep: str = "x", minimum: int = 1, example: str = ""
) -> tuple[int, ...]:
    """``"64x128"`` → ``(64, 128)``: ``n`` integers (any number when ``None``) ≥ ``minimum``,
    separated by ``sep`` (``x`` also reads ``X`` and ``×``)."""
    norm = text.strip().lower().replace("×", "x") if sep == "x" else text.strip()
    try:
        values = tuple(int(v) for v in norm.split(sep))
    except ValueError:
        values = ()
    if not values or (n is not None and len(values) != n) or min(values) < minimum:
        count = f"{n} integers" if n is not None else "integers"
        eg = f", e.g. {example}" if example else ""
        raise ValueError(f"{what} {text!r}: write {count} ≥ {minimum} separated by {sep!r}{eg}")
    return values


def parse_grid(text: str, what: str = "--grid", example: str = "32x64", minimum: int = 1) -> tuple[int, int]:
    """``"NLATxNLON"`` → ``(n_lat, n_lon)`` (also chunk and shard sizes, with ``minimum=0``)."""
    a, b = parse_ints(text, what, 2, minimum=minimum, example=example)
    return a, b


def parse_bytes(text: str, what: str, example: str = "80GB or 80GiB") -> int:
    """``80GB``, ``80 GiB``, ``64MiB``, ``8e10`` → a positive number of bytes (units: ``BYTE_UNITS``)."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([a-z]*)\s*", text, re.IGNORECASE)
    try:
        value = float(m.group(1)) if m else 0.0
    except ValueError:
        value = 0.0
    if not m or m.group(2).upper() not in BYTE_UNITS or value <= 0:
        raise ValueError(f"{what} {text!r}: write a size such as {example}")
    return int(value * BYTE_UNITS[m.group(2).upper()])


def parse_list(
    values: str | Sequence[str] | None, what: str = "", cast: Callable[[str], T] = str, example: str = ""
) -> list[T]:
    """Comma lists, from one string or several (a repeated flag): ``["a,b", "c"]`` → ``[a, b, c]``;
    blanks are dropped, each item is stripped and passed through ``cast``."""
    texts = [values] if isinstance(values, str) else list(values or [])
    items = [item.strip() for text in texts for item in text.split(",") if item.strip()]
    try:
        return [cast(item) for item in items]
    except ValueError:
        eg = f", e.g. {example}" if example else ""
        raise ValueError(f"{what} {','.join(texts)!r}: write a comma list{eg}") from None


def one_input(inputs: Sequence[object], command: str, what: str, example: str) -> None:
    """A command that takes exactly one positional input (``bench io STORE``): an error naming how many
    came, and ``example``, otherwise."""
    if len(inputs) != 1:
        raise ValueError(f"{command} takes one {what}, got {len(inputs)}: {example}")


def path_or_url(text: str) -> Path | str:
    """A path argument: a ``Path``, or a URL (``gs://…``, ``s3://…``) kept as written, which a ``Path``
    would fold into ``gs:/…`` (what reads it opens it by fsspec; what writes refuses it by name)."""
    return text if URL.match(text) else Path(text)
