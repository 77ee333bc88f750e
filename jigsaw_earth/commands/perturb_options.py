"""The command-line options of initial-condition perturbations, shared by ``predict`` and ``ensemble``."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config.schema import TrainConfig
    from ..inference.perturb import Perturbation

__all__ = ["OPTIONS", "add_perturb_arguments", "perturbation_from_args"]

#: dest → option, for the settings of a scheme (None when not given)
OPTIONS = {"amplitude": "--amplitude", "scale": "--scale", "length_scale_km": "--length-scale",
           "bred_cycles": "--bred-cycles", "bred_cycle_hours": "--bred-cycle-hours",
           "lag_hours": "--lag-hours"}  # fmt: skip


def add_perturb_arguments(p: argparse.ArgumentParser, calibrating: bool = False) -> None:
    """``--perturb SCHEME`` and its settings (docs/ensembles.md, "Ensembles from any model");
    ``calibrating``: the scheme is required, and the amplitude is what is sought (no ``--amplitude``,
    no ``--perturb-settings``)."""
    from ..inference.perturb import SCALES, SCHEMES

    g = p.add_argument_group("perturbed initial conditions (any model; docs/ensembles.md)")
    g.add_argument(
        "--perturb", choices=SCHEMES, required=calibrating, metavar="SCHEME",
        help=f"perturb each member's initial state: {', '.join(SCHEMES)} (with --members N)",
    )  # fmt: skip
    if not calibrating:
        g.add_argument(
            "--amplitude",
            type=float,
            metavar="A",
            help="RMS of the perturbation in units of each variable (--scale; lagged: a multiple of the lag "
            "difference); default: the calibration's (RUN_DIR/perturb-SCHEME.json), else 1",
        )
    g.add_argument(
        "--scale", choices=SCALES,
        help="a variable's unit: tendency, the std of its one-step change (default), or std, its std",
    )  # fmt: skip
    g.add_argument("--length-scale", dest="length_scale_km", type=float, metavar="KM",
                   help="correlated: the field's length scale in km (default 1000)")  # fmt: skip
    g.add_argument("--bred-cycles", type=int, metavar="N", help="bred: breeding cycles (default 3)")
    g.add_argument(
        "--bred-cycle-hours", type=int, metavar="H", help="bred: hours per cycle (default one step)"
    )
    g.add_argument("--lag-hours", type=int, metavar="H",
                   help="lagged: member m starts m x H hours before the init (default one step)")  # fmt: skip
    g.add_argument("--pairs", action="store_true", default=None,
                   help="symmetric pairs: consecutive perturbed members take +p and -p")  # fmt: skip
    g.add_argument("--control", action="store_true", default=None, help="member 0 unperturbed")
    g.add_argument("--perturb-settings", metavar="FILE",
                   help="settings of `ensemble calibrate` (default RUN_DIR/perturb-SCHEME.json)")  # fmt: skip


def perturbation_from_args(args: argparse.Namespace, cfg: TrainConfig) -> Perturbation | None:
    """The perturbation the options ask for (None without ``--perturb``); a setting without
    ``--perturb`` is refused."""
    from ..inference.perturb import resolve

    given = {dest: getattr(args, dest, None) for dest in (*OPTIONS, "pairs", "control")}
    if args.perturb is None:
        named = {**OPTIONS, "pairs": "--pairs", "control": "--control"}
        extra = [named[k] for k, v in given.items() if v is not None]
        if getattr(args, "perturb_settings", None):
            extra.append("--perturb-settings")
        if extra:
            raise ValueError(f"{extra[0]} is a setting of --perturb; add --perturb SCHEME or leave it out")
        return None
    return resolve(cfg, args.perturb, given, getattr(args, "perturb_settings", None))
