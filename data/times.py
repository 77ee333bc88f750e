"""Time axes: decoding numeric time, regular step, gaps versus irregular spacing, resampling.

A store's time axis is one of:

- **regular**: every spacing equals the step (the most common spacing);
- **regular with gaps**: every spacing is a whole multiple of the step (missing times);
- **irregular**: some spacing is not a multiple of the step (e.g. 7 h and 8 h alternating).

Irregular axes are refused everywhere with the spacing histogram and the fix (``data prepare
--resample 6h``); gaps are refused by training unless ``data.allow_gaps`` (samples whose window
crosses a gap are then skipped and counted). ``sample_index`` is the one place that turns a
time axis into (input, targets) index pairs; the trainer and ``predict`` both use it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "N_TIME_FEATURES",
    "TIME_FEATURES",
    "TIME_UNIT_ATTRS",
    "TimeAxis",
    "decode_times",
    "evenly_spaced",
    "hour_dayofyear",
    "parse_hours",
    "period_mask",
    "resample_plan",
    "sample_index",
    "time_features",
]

log = logging.getLogger(__name__)

#: store (root) attributes that hold the units of a numeric time coordinate, as found in the wild
TIME_UNIT_ATTRS = ("time_units", "time:units", "units_time", "time_unit", "time_reference")


#: the model's time inputs at the input time, in this order (``time_features``)
TIME_FEATURES = ("sin_hour", "cos_hour", "sin_dayofyear", "cos_dayofyear")
N_TIME_FEATURES = len(TIME_FEATURES)


def evenly_spaced(indices: np.ndarray, most: int | None) -> np.ndarray:
    """At most ``most`` of ``indices`` (all when ``most`` is 0 or ``None``), evenly spaced over them,
    the first and the last included: the same on every rank."""
    if most and len(indices) > most:
        return indices[np.linspace(0, len(indices) - 1, most).round().astype(int)]
    return indices


def period_mask(times: np.ndarray, period: Sequence[Any] | None, unit: str | None = None) -> np.ndarray:
    """Which of ``times`` (datetime64) lie in the closed period ``[first, last]``; all of them when
    there is no period. ``unit`` reads the bounds at that precision (``"h"``: to the hour)."""
    t = np.asarray(times)
    if not period:
        return np.ones(len(t), dtype=bool)
    lo, hi = (np.datetime64(p) if unit is None else np.datetime64(p, unit) for p in period)
    return (t >= lo) & (t <= hi)


def hour_dayofyear(times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hour of day 0…23, day of year 1…366) of each valid time: where WB2 climatologies
    (``hour``, ``dayofyear``) are looked up. Any shape; minutes and seconds are dropped."""
    t = np.asarray(times).astype("datetime64[h]")
    day = t.astype("datetime64[D]")
    hour = (t - day).astype(np.int64)
    doy = (day - day.astype("datetime64[Y]").astype("datetime64[D]")).astype(np.int64) + 1
    return hour, doy


def time_features(times: np.ndarray) -> np.ndarray:
    """``(len(times), N_TIME_FEATURES)`` float32: sin/cos of hour of day and of day of year (UTC)."""
    t = np.asarray(times).astype("datetime64[s]")
    day = t.astype("datetime64[D]")
    hours = (t - day).astype(np.int64) / 3600.0
    year = t.astype("datetime64[Y]")
    doy = (day - year.astype("datetime64[D]")).astype(np.int64) + hours / 24.0
    a = 2 * np.pi * hours / 24.0
    b = 2 * np.pi * doy / 365.25
    return np.stack([np.sin(a), np.cos(a), np.sin(b), np.cos(b)], axis=-1).astype(np.float32)


def parse_hours(text: str | int, what: str) -> int:
    """'6h', '6', '1d' → hours."""
    s = str(text).strip().lower()
    scale = 24 if s.endswith("d") else 1
    try:
        hours = int(float(s.rstrip("hd")) * scale)
    except ValueError:
        raise ValueError(f"{what} {text!r}: write hours such as 6h (or days such as 1d)") from None
    if hours <= 0:
        raise ValueError(f"{what} {text!r} must be positive")
    return hours


def decode_times(
    values: np.ndarray,
    attrs: Mapping[str, Any],
    store_attrs: Mapping[str, Any],
    units: str | None,
    where: str,
) -> np.ndarray:
    """Datetimes of a time coordinate: as stored, or numeric decoded with CF units.

    Units come from ``units`` (``--time-units``) first, then the coordinate's ``units``
    attribute, then a store attribute named in ``TIME_UNIT_ATTRS``.
    """
    values = np.asarray(values)
    if np.issubdtype(values.dtype, np.datetime64) and units is None:
        return values
    if np.issubdtype(values.dtype, np.datetime64):
        raise ValueError(f"time of {where} is already decoded as datetimes; drop --time-units")
    if not np.issubdtype(values.dtype, np.number):
        raise ValueError(f"time of {where} is {values.dtype}; it must be datetimes or numbers with CF units")
    source = "--time-units"
    if units is None:
        units, source = attrs.get("units"), "the time coordinate's units"
    if units is None:
        for key in TIME_UNIT_ATTRS:
            if isinstance(store_attrs.get(key), str):
                units, source = store_attrs[key], f"store attribute {key!r}"
                break
    if units is None:
        raise ValueError(
            f"time of {where} is {values.dtype} without units (no 'units' on the coordinate, no store "
            f"attribute among {list(TIME_UNIT_ATTRS)}); give them: `jigsaw-earth data prepare SRC "
            f"--time-units 'hours since 1970-01-01' --out DST`"
        )
    from xarray.coding.times import decode_cf_datetime

    calendar = attrs.get("calendar", "proleptic_gregorian")
    try:
        out = np.asarray(decode_cf_datetime(values, str(units), calendar))
    except Exception as err:
        raise ValueError(
            f"cannot decode time of {where} with units {units!r} (from {source}): {err}. "
            f"Give CF units such as 'hours since 1970-01-01' with --time-units"
        ) from None
    if not np.issubdtype(out.dtype, np.datetime64):
        raise ValueError(
            f"time of {where} with units {units!r} is outside the datetime64 range "
            f"(calendar {calendar!r}); give a standard calendar"
        )
    log.info("decoded time of %s with units %r from %s", where, units, source)
    return out.astype("datetime64[ns]")


def _hours(td: np.ndarray) -> np.ndarray:
    return np.asarray(td).astype("timedelta64[s]").astype(np.int64) / 3600.0


@dataclass(frozen=True)
class TimeAxis:
    """The spacing of a time axis: ``step``, ``gaps`` and ``irregular`` spacings."""

    times: np.ndarray  # datetime64[s]

    @classmethod
    def of(cls, times: np.ndarray) -> TimeAxis:
        t = np.asarray(times).astype("datetime64[s]")
        if len(t) >= 2 and np.any(np.diff(t) <= np.timedelta64(0, "s")):
            bad = int(np.nonzero(np.diff(t) <= np.timedelta64(0, "s"))[0][0])
            raise ValueError(
                f"times are not strictly increasing ({t[bad]} then {t[bad + 1]}); sort the "
                f"store by time and drop duplicate times"
            )
        return cls(t)

    @property
    def diffs(self) -> np.ndarray:
        return np.diff(self.times)

    @property
    def step(self) -> np.timedelta64:
        """The most common spacing (ties: the smallest)."""
        if len(self.times) < 2:
            raise ValueError(f"the store has {len(self.times)} time(s); at least 2 are needed")
        values, counts = np.unique(self.diffs, return_counts=True)
        return values[np.argmax(counts)]

    @property
    def step_hours(self) -> float:
        return float(_hours(self.step))

    def histogram(self) -> dict[float, int]:
        """Spacing in hours → count."""
        values, counts = np.unique(self.diffs, return_counts=True)
        return {float(_hours(v)): int(c) for v, c in zip(values, counts)}

    def describe_histogram(self, limit: int = 6) -> str:
        items = sorted(self.histogram().items(), key=lambda kv: -kv[1])
        text = ", ".join(f"{h:g} h ×{c}" for h, c in items[:limit])
        return text + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")

    @property
    def irregular(self) -> list[int]:
        """Positions ``i`` where ``times[i+1] - times[i]`` is not a multiple of the step."""
        return [int(i) for i in np.nonzero(self.diffs % self.step != np.timedelta64(0, "s"))[0]]

    @property
    def gaps(self) -> list[tuple[np.datetime64, np.datetime64]]:
        """(last time before, first time after) of every missing stretch on a regular axis."""
        d = self.diffs
        at = np.nonzero((d != self.step) & (d % self.step == np.timedelta64(0, "s")))[0]
        return [(self.times[i], self.times[i + 1]) for i in at]

    def missing_times(self) -> int:
        d = self.diffs
        return int(((d // self.step) - 1)[d % self.step == np.timedelta64(0, "s")].sum())

    def require_regular(self, where: str, fix_key: str = "") -> None:
        """Raise for an irregular axis, with the spacing histogram and the fix."""
        bad = self.irregular
        if not bad:
            return
        i = bad[0]
        raise ValueError(
            f"time axis of {where} is irregular: spacings {self.describe_histogram()}; "
            f"{len(bad)} of {len(self.diffs)} are not multiples of the most common {self.step_hours:g} h "
            f"(first {self.times[i]} -> {self.times[i + 1]}). This is not a gap. Resample it: "
            f"`jigsaw-earth data prepare SRC --out DST --resample 6h` (nearest time within "
            f"--resample-tolerance, or --resample-method linear){fix_key}"
        )


def resample_plan(
    times: np.ndarray, step_hours: int, method: str, tolerance_hours: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Targets on a regular ``step_hours`` axis (aligned to 00 UTC) and how to make each.

    Returns ``(targets, i0, i1, w)``: value = ``(1 - w)·x[i0] + w·x[i1]``. ``nearest`` takes the
    closest source time within ``tolerance_hours`` (``w = 0``); ``linear`` interpolates between
    the bracketing source times when they are at most ``tolerance_hours`` apart. Targets with
    no source within the tolerance are left out (they become gaps, listed in the log).
    """
    t = TimeAxis.of(times).times
    step = np.timedelta64(int(step_hours), "h")
    day0 = t[0].astype("datetime64[D]").astype("datetime64[s]")
    first = day0 + ((t[0] - day0 + step - np.timedelta64(1, "s")) // step) * step
    targets = np.arange(first, t[-1] + np.timedelta64(1, "s"), step).astype("datetime64[s]")
    tol = np.timedelta64(round(tolerance_hours * 3600), "s")
    right = np.clip(np.searchsorted(t, targets, side="left"), 0, len(t) - 1)
    left = np.clip(right - 1, 0, len(t) - 1)
    exact = t[right] == targets
    if method == "nearest":
        pick = np.where(np.abs(t[left] - targets) <= np.abs(t[right] - targets), left, right)
        pick = np.where(exact, right, pick)
        ok = np.abs(t[pick] - targets) <= tol
        i0, i1, w = pick, pick, np.zeros(len(targets))
    elif method == "linear":
        span = (t[right] - t[left]).astype(np.int64)
        w = np.where(exact | (span == 0), 0.0, (targets - t[left]).astype(np.int64) / np.maximum(span, 1))
        i0 = np.where(exact, right, left)
        i1 = right
        ok = exact | ((t[left] <= targets) & (targets <= t[right]) & (t[right] - t[left] <= tol))
    else:
        raise ValueError(f"--resample-method {method!r}: choose nearest or linear")
    if not ok.all():
        log.warning(
            "resampling to %d h: %d of %d target times have no source time within %g h and are "
            "left out (gaps)",
            step_hours,
            int((~ok).sum()),
            len(ok),
            tolerance_hours,
        )
    if ok.sum() < 2:
        raise ValueError(
            f"resampling to {step_hours} h with tolerance {tolerance_hours:g} h keeps "
            f"{int(ok.sum())} times; raise --resample-tolerance"
        )
    return targets[ok], i0[ok], i1[ok], w[ok]


def sample_index(
    times: np.ndarray,
    inits: np.ndarray,
    step_hours: int,
    lead_steps: int,
    allow_gaps: bool,
    where: str,
    what: str,
) -> tuple[np.ndarray, np.ndarray]:
    """``(inits, targets (n, lead_steps))`` store indices whose targets exist ``step_hours`` apart.

    ``inits`` are candidate store indices. An irregular axis is refused; ``step_hours`` must be
    a multiple of the step. Inits whose window needs a missing time raise unless ``allow_gaps``
    (then they are skipped and counted in the log).
    """
    axis = TimeAxis.of(times)
    axis.require_regular(where)
    step_h = axis.step_hours
    if step_hours % step_h:
        raise ValueError(
            f"data.step_hours={step_hours} is not a multiple of the {step_h:g} h spacing of "
            f"{where}; set data.step_hours to a multiple of {step_h:g}"
        )
    t = axis.times
    inits = np.asarray(inits, dtype=np.int64)
    wanted = t[inits][:, None] + np.timedelta64(int(step_hours), "h") * np.arange(1, lead_steps + 1)[None, :]
    pos = np.clip(np.searchsorted(t, wanted), 0, len(t) - 1)
    found = (t[pos] == wanted).all(axis=1)
    inside = (wanted <= t[-1]).all(axis=1)  # windows running past the end are not gaps
    crossing = inside & ~found
    if crossing.any():
        gaps = axis.gaps
        if not allow_gaps:
            a, b = gaps[0] if gaps else (t[0], t[-1])
            raise ValueError(
                f"{where} has {len(gaps)} time gap(s) ({axis.missing_times()} missing times of the "
                f"{step_h:g} h axis, the first between {a} and {b}); {int(crossing.sum())} {what} sample(s) "
                f"need a missing time. Set data.allow_gaps: true to skip them, choose a period "
                f"without gaps, or fill the store (`jigsaw-earth data inspect` lists the gaps)"
            )
        log.warning(
            "%s: skipping %d of %d %s samples whose window crosses a time gap (data.allow_gaps)",
            where,
            int(crossing.sum()),
            int(inside.sum()),
            what,
        )
    return inits[found], pos[found]
