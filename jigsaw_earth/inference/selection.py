"""What a forecast writes and scores: variables, levels and leads out of everything the model predicts.

The model always predicts every channel at every step; ``Selection`` picks the channels (variables ×
levels, in the store's channel order) and the lead steps that are written (``ForecastWriter``) and
scored (``scoring.TileScorer``). Every bad choice is an error before anything is read or written.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..config.schema import TrainConfig
from ..data.batch import VariableSpec
from ..data.store import ALIASES

__all__ = ["Selection", "parse_int_list", "select"]


@dataclass(frozen=True)
class Selection:
    """The channels and lead steps of a forecast store; ``lead_steps`` count model steps (1 = first)."""

    upper_air: tuple[str, ...]
    levels: tuple[int, ...]
    surface: tuple[str, ...]
    lead_steps: tuple[int, ...]
    step_hours: int

    @property
    def spec(self) -> VariableSpec:
        """The selected fields as a reader's spec (no static fields); channels in store order."""
        return VariableSpec(self.upper_air, self.levels if self.upper_air else (), self.surface, ())

    @property
    def channels(self) -> list[str]:
        return self.spec.channels

    @property
    def steps(self) -> int:
        """Model steps to roll out: the last selected lead."""
        return max(self.lead_steps)

    @property
    def leads(self) -> np.ndarray:
        return np.asarray(self.lead_steps) * np.timedelta64(self.step_hours, "h")

    def channel_index(self, channels: Sequence[str]) -> list[int]:
        """Positions of the selected channels among the model's ``channels``."""
        return [list(channels).index(c) for c in self.channels]


def parse_int_list(values: Sequence[str] | None, option: str) -> list[int] | None:
    """``["6,12", "24"]`` → ``[6, 12, 24]``; a clear error for anything not an integer."""
    if values is None:
        return None
    out = []
    for part in (p for v in values for p in str(v).split(",")):
        if not part.strip():
            continue
        try:
            out.append(int(part))
        except ValueError:
            raise ValueError(f"{option} {part!r} is not a whole number; e.g. {option} 6,12,24") from None
    if not out:
        raise ValueError(f"{option} is empty; e.g. {option} 6,12,24")
    return out


def _canonical(name: str, known: Sequence[str]) -> str:
    """A configured variable by its WB2 name or one of its aliases (``t2m``), else a clear error."""
    if name in known:
        return name
    for wb2 in known:
        if name in ALIASES.get(wb2, ()):
            return wb2
    hint = difflib.get_close_matches(name, known, n=1)
    raise ValueError(
        f"--variables {name!r} is not predicted by this model; it predicts {list(known)}"
        + (f" (did you mean {hint[0]!r}?)" if hint else "")
    )


def _lead_steps(steps: int | None, lead_hours: Sequence[int] | None, lead_every: int | None,
                step_hours: int) -> tuple[int, ...]:  # fmt: skip
    if lead_hours is not None and lead_every is not None:
        raise ValueError("give --lead-hours or --lead-every, not both")
    if steps is not None and steps < 1:
        raise ValueError(f"--steps {steps}: must be at least 1; e.g. --steps 4")
    if lead_hours is not None:
        bad = [h for h in lead_hours if h <= 0 or h % step_hours]
        if bad:
            raise ValueError(
                f"--lead-hours {bad}: every lead must be a positive multiple of the model step "
                f"(data.step_hours={step_hours}); e.g. --lead-hours {step_hours},{4 * step_hours}"
            )
        chosen = sorted({h // step_hours for h in lead_hours})
        if steps is not None and chosen[-1] > steps:
            raise ValueError(
                f"--lead-hours {chosen[-1] * step_hours} is beyond --steps {steps} × {step_hours} h; "
                f"raise --steps or leave it out (the last lead sets it)"
            )
        return tuple(chosen)
    steps = 4 if steps is None else steps
    every = 1 if lead_every is None else lead_every
    if every < 1 or every > steps:
        raise ValueError(f"--lead-every {every}: must be between 1 and --steps {steps}; e.g. --lead-every 4")
    return tuple(range(every, steps + 1, every))


def select(
    cfg: TrainConfig,
    *,
    variables: Sequence[str] | None = None,
    levels: Sequence[int] | None = None,
    steps: int | None = None,
    lead_hours: Sequence[int] | None = None,
    lead_every: int | None = None,
) -> Selection:
    """The selection of ``predict``'s options; ``None`` means all (and ``steps`` 4, every lead)."""
    d = cfg.data
    known = [*d.upper_air, *d.surface]
    names = list(dict.fromkeys(_canonical(v, known) for v in variables)) if variables else known
    upper = tuple(v for v in d.upper_air if v in names)
    surface = tuple(v for v in d.surface if v in names)
    if levels is not None:
        unknown = sorted(set(levels) - set(d.levels))
        if unknown:
            raise ValueError(
                f"--levels {unknown} not predicted by this model; it has levels {sorted(d.levels)}"
            )
        if not upper:
            raise ValueError(
                f"--levels {list(levels)} given but none of the variables {names} has levels; "
                f"add an upper-air variable ({list(d.upper_air)}) or drop --levels"
            )
    chosen = tuple(sorted(set(levels if levels is not None else d.levels)))
    return Selection(upper, chosen if upper else (), surface,
                     _lead_steps(steps, lead_hours, lead_every, d.step_hours), d.step_hours)  # fmt: skip
