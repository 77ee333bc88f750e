"""``predict --members N --perturb SCHEME``: ensembles from any model by perturbed initial conditions.

A ``Perturbation`` is the request: the scheme, its amplitude and settings, ± pairs and an unperturbed
member 0. Which perturbation a member gets is a pure function of its global number (``draw``), so a
member is the same in any run that holds it (``--first-member K`` continues an ensemble); its field is a
function of ``(seed, draw, init time, global grid index)`` only (``perturb_fields.py`` makes it on each
rank's tile). Perturbations are added to the normalised initial state in units of each variable and
level (``scale``): ``tendency`` (default), the standard deviation of its one-step (6-hour) change, or
``std``, its standard deviation:

* ``gaussian``: white noise, ``amplitude`` units at every point;
* ``correlated``: a Gaussian random field on the sphere of unit variance and a Gaussian angular power
  spectrum of ``length_scale_km`` (``sphere_field.py``), times ``amplitude`` units, independent per
  channel;
* ``bred``: a Gaussian start grown by the model over ``bred_cycles`` cycles of ``bred_cycle_hours``
  ending at the init, each cycle's growth rescaled to an area-weighted RMS (WB2 latitude weights, every
  channel, in units) of ``amplitude``;
* ``lagged``: member ``m`` is the forecast from ``m × lag_hours`` before the init, valid at the init:
  the perturbation is ``amplitude × (that forecast − the init's state)`` (``amplitude`` 1: the plain
  lagged ensemble; ``scale`` does not apply). Member 0 is the init itself.

Member numbers: with ``control`` member 0 is unperturbed and members ``1, 2, …`` take draws ``0, 1, …``;
with ``pairs`` consecutive perturbed members take the same draw with ``+`` and ``−`` (``draw``).
``jigsaw-earth ensemble calibrate`` writes the chosen settings (``RUN_DIR/perturb-SCHEME.json``), which
``predict --perturb SCHEME`` reads unless given otherwise (``resolve``).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..config.schema import TrainConfig

__all__ = [
    "SCALES",
    "SCHEMES",
    "SETTINGS_KIND",
    "Perturbation",
    "check_history",
    "check_perturbation",
    "default_amplitude",
    "earlier_times",
    "log_choice",
    "read_settings",
    "resolve",
    "settings_path",
]

log = logging.getLogger(__name__)

SCHEMES = ("gaussian", "correlated", "bred", "lagged")
SCALES = ("tendency", "std")  # a perturbation's unit per channel: its 6-hour change's std, or its std
SETTINGS_KIND = "jigsaw-earth perturbation"
UNCALIBRATED = "uncalibrated amplitude"


@dataclass(frozen=True)
class Perturbation:
    """An initial-condition perturbation; hours of 0 mean ``data.step_hours`` (``with_defaults``)."""

    scheme: str
    amplitude: float
    pairs: bool = False
    control: bool = False
    scale: str = "tendency"  # gaussian, correlated, bred
    length_scale_km: float = 1000.0  # correlated
    bred_cycles: int = 3  # bred
    bred_cycle_hours: int = 0
    lag_hours: int = 0  # lagged
    source: str = field(default="", compare=False)  # where the settings came from (logs only)

    def with_defaults(self, step_hours: int) -> Perturbation:
        """Hours left at 0 set to one model step."""
        return replace(self, bred_cycle_hours=self.bred_cycle_hours or step_hours,
                       lag_hours=self.lag_hours or step_hours)  # fmt: skip

    def draw(self, member: int) -> tuple[int, float] | None:
        """``(draw, sign)`` of global member ``member``; None for an unperturbed member (the control,
        and a lagged ensemble's member 0). A lagged member's draw is its number of lags."""
        if self.scheme == "lagged":
            return None if member == 0 else (member, 1.0)
        j = member - 1 if self.control else member
        if j < 0:
            return None
        return (j // 2, 1.0 if j % 2 == 0 else -1.0) if self.pairs else (j, 1.0)

    def describe(self) -> dict[str, Any]:
        """The settings that decide the fields (JSON), only the scheme's own."""
        own = {"gaussian": ("scale",), "correlated": ("scale", "length_scale_km"), "lagged": ("lag_hours",),
               "bred": ("scale", "bred_cycles", "bred_cycle_hours")}[self.scheme]  # fmt: skip
        keep = ("scheme", "amplitude", "pairs", "control", *own)
        return {k: v for k, v in asdict(self).items() if k in keep}

    def text(self) -> str:
        """One line for logs and tables."""
        return ", ".join(f"{k} {v}" for k, v in self.describe().items())


def default_amplitude(scheme: str, scale: str = "tendency") -> float:
    """The amplitude when neither the command line nor a calibration gives one: one unit of ``tendency``
    (a 6-hour change), 0.05 of ``std``, the plain lagged ensemble."""
    return 0.05 if scale == "std" and scheme != "lagged" else 1.0


def settings_path(cfg: TrainConfig, scheme: str) -> Path:
    """Where ``ensemble calibrate`` writes its choice and ``predict`` looks for it by default."""
    return Path(cfg.run.dir) / f"perturb-{scheme}.json"


def read_settings(path: str | Path, scheme: str | None = None) -> dict[str, Any]:
    """A calibration's settings (``Perturbation``'s fields), checked: its kind and scheme."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"--perturb-settings {path}: cannot read it ({err}); give the file "
                         f"`jigsaw-earth ensemble calibrate` wrote") from None  # fmt: skip
    if not isinstance(data, dict) or data.get("kind") != SETTINGS_KIND:
        raise ValueError(f"--perturb-settings {path} is not a calibration of `jigsaw-earth ensemble "
                         f"calibrate` (no \"kind\": {SETTINGS_KIND!r})")  # fmt: skip
    if scheme is not None and data.get("scheme") != scheme:
        raise ValueError(f"--perturb-settings {path} calibrates --perturb {data.get('scheme')}, not "
                         f"{scheme}; give that scheme or its own settings")  # fmt: skip
    names = {f.name for f in fields(Perturbation)}
    return {k: v for k, v in data.items() if k in names}


def resolve(cfg: TrainConfig, scheme: str, given: dict[str, Any], settings: str | Path | None = None
            ) -> Perturbation:  # fmt: skip
    """The perturbation of ``--perturb scheme``: the options ``given`` (None: not given) over a
    calibration's settings (``settings``, or ``settings_path`` if it exists) over the defaults."""
    if scheme not in SCHEMES:
        raise ValueError(f"--perturb {scheme!r} is not one of {', '.join(SCHEMES)}")
    values: dict[str, Any] = {"scheme": scheme}
    path = Path(settings) if settings is not None else settings_path(cfg, scheme)
    if settings is not None or path.is_file():
        values.update(read_settings(path, scheme), source=f"settings of {path}")
    values.update({k: v for k, v in given.items() if v is not None})
    if "amplitude" not in values:
        values["amplitude"] = default_amplitude(scheme, values.get("scale", "tendency"))
        values["source"] = f"{UNCALIBRATED} (no {path})"
    return Perturbation(**values).with_defaults(cfg.data.step_hours)


def log_choice(p: Perturbation) -> None:
    """One line saying which perturbation the members get and where its settings came from (a warning
    when its amplitude is nobody's choice)."""
    if p.source.startswith(UNCALIBRATED):
        log.warning("--perturb %s: %s, %s: run `jigsaw-earth ensemble calibrate CONFIG --perturb %s` or "
                    "give --amplitude", p.scheme, p.text(), p.source, p.scheme)  # fmt: skip
    else:
        log.info("members perturbed: %s%s", p.text(), f" ({p.source})" if p.source else "")


def check_perturbation(p: Perturbation, total: int, first: int, step_hours: int, from_analysis: bool) -> None:
    """Refuse a perturbation that cannot be made, one line each: a negative amplitude, ± pairs that a
    scheme has not or that this run would split, hours off the model's step, a scheme that needs the
    store's earlier analyses with ``--init``."""
    if not (math.isfinite(p.amplitude) and p.amplitude > 0):
        raise ValueError(
            f"--amplitude {p.amplitude}: must be positive (the perturbation's size in units of each "
            f"variable, --scale; lagged: a multiple of the lag difference); e.g. --amplitude "
            f"{default_amplitude(p.scheme, p.scale)}"
        )
    if p.scheme in ("bred", "lagged") and from_analysis:
        raise ValueError(
            f"--perturb {p.scheme} makes its members from data.store's earlier analyses; --init gives only "
            f"its own states: use --perturb gaussian or correlated with --init"
        )
    if p.scale not in SCALES:
        raise ValueError(f"--scale {p.scale!r}: choose {' or '.join(SCALES)}")
    if p.scheme == "lagged" and p.pairs:
        raise ValueError(
            "--pairs: a lagged member is an earlier forecast, with no opposite; leave --pairs out"
        )
    if p.pairs:
        lo = max(first - int(p.control), 0)
        hi = first + total - int(p.control)
        if lo % 2 or hi % 2:
            start = "member 1" if p.control else "member 0"
            raise ValueError(
                f"--pairs: perturbed members come in ± pairs from {start}; --members {total} --first-member "
                f"{first} would split one: use an even number of perturbed members (e.g. --members "
                f"{total + 1 if (hi - lo) % 2 else total + 2}{' with --control' if p.control else ''}) "
                f"starting at a pair"
            )
    for option, hours in (("--bred-cycle-hours", p.bred_cycle_hours), ("--lag-hours", p.lag_hours)):
        if hours <= 0 or hours % step_hours:
            raise ValueError(f"{option} {hours}: must be a positive multiple of data.step_hours={step_hours}")
    if p.scheme == "bred" and p.bred_cycles < 1:
        raise ValueError(f"--bred-cycles {p.bred_cycles}: give at least 1 (e.g. --bred-cycles 3)")


def earlier_times(p: Perturbation, members: range) -> dict[int, list[int]]:
    """Hours before the init whose analyses the members need (scheme bred or lagged; else empty)."""
    if p.scheme == "bred":
        return {m: [c * p.bred_cycle_hours for c in range(1, p.bred_cycles + 1)] for m in members}
    if p.scheme == "lagged":
        return {m: [m * p.lag_hours] for m in members if m > 0}
    return {}


def check_history(p: Perturbation, members: range, times: np.ndarray, inits: np.ndarray) -> None:
    """Every earlier analysis a member needs is in the store (``times``: the store's, ``inits``: indices
    of the forecast's inits); else one line: the first member and init without it, and the fix."""
    need = earlier_times(p, members)
    have = set(np.asarray(times).astype("datetime64[h]").astype(np.int64).tolist())
    starts = np.asarray(times)[np.asarray(inits)].astype("datetime64[h]")
    for m, hours in need.items():
        for t in starts:
            missing = [h for h in hours if int((t - np.timedelta64(h, "h")).astype(np.int64)) not in have]
            if not missing:
                continue
            span = np.timedelta64(max(missing), "h")
            store = np.asarray(times).astype("datetime64[h]")
            if p.scheme == "lagged":
                what = f"member {m} is the forecast from {m} × {p.lag_hours} h"
                fewer = "fewer members (--members, --first-member) or a shorter --lag-hours"
            else:
                what = f"breeding {p.bred_cycles} cycles of {p.bred_cycle_hours} h starts"
                fewer = "fewer --bred-cycles or a shorter --bred-cycle-hours"
            raise ValueError(
                f"--perturb {p.scheme}: {what} before init {t}, at {t - span}, which data.store does not "
                f"hold (it runs {store.min()} … {store.max()}); give later inits (--first-init "
                f"{store.min() + span} or after), {fewer}"
            )
