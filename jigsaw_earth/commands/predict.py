"""``jigsaw-earth predict``: sharded inference into one WB2-layout forecast Zarr store (``--format
grib2|netcdf``: a folder of GRIB 2 or CF netCDF files); ``--members N`` writes an ensemble (a
``number`` dimension) of a stochastic model, or of any model with ``--perturb SCHEME`` (perturbed
initial states: ``perturb_options.py``); ``--init SOURCE`` starts from an analysis (GRIB, netCDF,
Zarr) instead of ``data.store``.

Exit codes: 0 done, or ``--out`` already held this forecast (nothing is done: ``inference/rerun.py``); 2
a bad config, input or filesystem fault (one line names it and the fix); 75 stopped on SIGTERM, SIGUSR1
or Ctrl-C before the next model step, or by a lost host, with every batch done recorded in ``OUT.in-progress``
(``PREFIX.in-progress`` for ``--score --scores PREFIX`` alone): the same command resumes it; 130 a
second Ctrl-C. ``--unfinished [DIR]`` lists predict's unfinished forecasts and
``--remove-unfinished PATH`` removes one (nothing else).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .perturb_options import add_perturb_arguments, perturbation_from_args

if TYPE_CHECKING:
    from ..config.schema import TrainConfig
    from ..inference import Prediction, PredictRequest, ScoreRequest


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "predict", help="forecast from a trained run; all ranks write one WB2-layout Zarr store"
    )
    p.add_argument(
        "config", nargs="?", help="the run's YAML config (e.g. configs/demo.yaml or RUN_DIR/config.yaml)"
    )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. mesh.lon=4")
    p.add_argument(
        "--out",
        help="forecast store (WB2 forecast layout; a path, or an s3:// or gs:// URL) or, with --format "
        "grib2|netcdf, a local folder; optional with --score",
    )
    p.add_argument(
        "--format",
        choices=("zarr", "grib2", "netcdf"),
        default="zarr",
        help="zarr: one store (default); grib2 or netcdf: a folder of files (--template)",
    )
    p.add_argument(
        "--template",
        metavar="NAME",
        help="file names of --format grib2|netcdf from {date} {time} {step} [{number}] (default "
        "{date}{time}_{step:03d}.grib2, {date}{time}.nc)",
    )
    p.add_argument(
        "--init",
        metavar="SOURCE",
        help="forecast from this analysis (GRIB file or folder as IFS open data, GFS or the CDS publish "
        "them; netCDF; Zarr) instead of data.store's inits; on the model's grid",
    )
    p.add_argument("--time", nargs="+", dest="init_times", metavar="T",
                   help="with --init: only these of its times, e.g. 2024-01-01T00")  # fmt: skip
    p.add_argument("--checkpoint", help="checkpoint folder; default: the newest in run.dir")
    p.add_argument(
        "--model",
        metavar="DIR",
        help="a shared model's folder (`model export`) instead of a run's CONFIG: on any mesh, its input "
        "contract checked before it loads; KEY=VALUE overrides such as data.store=STORE",
    )
    p.add_argument(
        "--first-init", "--start", dest="first_init", metavar="TIME",
        help="first initialisation time (default: data.val_period[0]); --first-init works under torchrun, "
        "which takes --start for its own --start-method",
    )  # fmt: skip
    p.add_argument(
        "--last-init", "--end", dest="last_init", metavar="TIME",
        help="last initialisation time (default: data.val_period[1])",
    )  # fmt: skip
    p.add_argument("--steps", type=int, help="steps of data.step_hours (default 4, or the last lead)")
    p.add_argument("--variables", nargs="+", metavar="NAME", help="write/score only these variables")
    p.add_argument("--levels", nargs="+", metavar="HPA", help="only these levels, e.g. 500 850 or 500,850")
    p.add_argument("--lead-hours", nargs="+", metavar="H", help="only these leads, e.g. 6,12,24,72")
    p.add_argument("--lead-every", type=int, metavar="K", help="only every K-th step's lead")
    p.add_argument("--every-hours", type=int, default=12, help="initialise at multiples of this hour")
    p.add_argument("--max-inits", type=int, default=0, help="at most this many inits, evenly spaced")
    p.add_argument(
        "--batch-size", type=int, help="inits per forward (default: what half the free memory holds)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out store")
    p.add_argument(
        "--members",
        type=int,
        metavar="N",
        help="an ensemble of N members (store dimension 'number'): a stochastic model (model.noise_channels) "
        "or any model with --perturb",
    )
    p.add_argument("--seed", type=int, help="the ensemble's noise seed (default run.seed); with --members")
    p.add_argument(
        "--first-member",
        type=int,
        default=0,
        metavar="K",
        help="number the members K … K+N-1: further members of the same ensemble (the same seed), e.g. "
        "--members 10 --first-member 10 after a first --members 10 run",
    )
    add_perturb_arguments(p)
    g = p.add_argument_group("scoring while forecasting (--score)")
    g.add_argument(
        "--score", action="store_true", help="WB2 RMSE/bias/ACC (ensembles: CRPS …) as it runs, as `score`"
    )
    g.add_argument("--truth", metavar="ERA5.zarr", help="verifying analysis (default data.store)")
    g.add_argument("--climatology", metavar="CLIM.zarr", help="for ACC (default: the run's climatology)")
    g.add_argument("--regions", nargs="+", metavar="NAME", help="WB2 regions or 'all' (default global)")
    g.add_argument(
        "--scores", metavar="PREFIX", help="also write the scores to PREFIX.json, .csv and PREFIX-stats.nc"
    )
    u = p.add_argument_group("unfinished forecasts (a stopped predict resumes with the same command)")
    u.add_argument(
        "--unfinished", nargs="*", metavar="DIR", help="list predict's unfinished forecasts in DIR (or .)"
    )
    u.add_argument(
        "--remove-unfinished", nargs="+", metavar="PATH", help="remove these unfinished forecasts of predict"
    )
    p.set_defaults(run=run)


def _spelled(argv: Sequence[str], long: str, short: str) -> str:
    """The spelling of an option the command line used: ``short`` (``--start``) where typed so, else
    ``long`` (``--first-init``)."""
    return short if any(a == short or a.startswith(f"{short}=") for a in argv) else long


READ_BACK = {
    "zarr": "open it with xarray.open_zarr({path!r})",
    "grib2": "read its files with ecCodes (grib_ls {path}/*.grib2) or xarray.open_dataset(FILE, "
    "engine='cfgrib', backend_kwargs={{'indexpath': ''}}) (--template: other names)",
    "netcdf": "open its files with xarray.open_mfdataset({path!r} + '/*.nc')",
}


def _score_request(args: argparse.Namespace) -> ScoreRequest | None:
    """``--score`` and its settings; a setting without ``--score`` is refused."""
    from ..inference import ScoreRequest

    given = [o for o, v in (("--truth", args.truth), ("--climatology", args.climatology),
                            ("--regions", args.regions)) if v]  # fmt: skip
    if not args.score:
        if given:
            raise ValueError(f"{given[0]} is a scoring option; add --score (or leave it out)")
        return None
    return ScoreRequest(args.truth, args.climatology, tuple(args.regions) if args.regions else None)


def _respelled(message: str, argv: Sequence[str]) -> str:
    """``message`` naming ``--first-init``/``--last-init`` as the command line spelled them."""
    for long, short in (("--first-init", "--start"), ("--last-init", "--end")):
        message = message.replace(long, _spelled(argv, long, short))
    return message


def _request(args: argparse.Namespace, cfg: TrainConfig) -> PredictRequest:
    """The one request of the parsed options: each field from the option of its name (``dest``), the
    scoring and the perturbation from their groups; checked, the default period included, with the
    errors naming the options as typed."""
    from ..inference import PredictRequest

    values = {name: getattr(args, name) for name in PredictRequest.model_fields}
    try:
        values.update(score=_score_request(args), perturb=perturbation_from_args(args, cfg))
        request = PredictRequest.parse(values)
        request.period(cfg.data.val_period)
    except ValueError as err:
        raise ValueError(_respelled(str(err), getattr(args, "argv", []))) from None
    return request


def _complete(request: PredictRequest, result: Prediction) -> None:
    """Rank 0: ``--out`` already held this forecast; where its scores are, if it was scored."""
    n = result.init_times.size
    print(f"{result.path} is complete: it holds this forecast ({n} inits × {result.steps} steps, the same "
          f"request); nothing was forecast or written. Change the request, or pass "
          f"--overwrite with another one, to forecast again")  # fmt: skip
    prefix = request.scores
    if prefix:
        found = Path(f"{prefix}.json")
        print(f"its scores: {found}" if found.is_file() else f"its scores {found} are missing: score the "
              f"store with jigsaw-earth score {result.path} --truth STORE --out {prefix}")  # fmt: skip


def _report(request: PredictRequest, result: Prediction) -> None:
    """Rank 0: the forecast rate, the scorecard as ``score`` prints it, and what was written."""
    r = result
    members = "" if r.members is None else f" × {r.members} member" + "s" * (r.members != 1)
    ratio = r.steps_per_s / r.training_steps_per_s
    print(f"forecast {r.init_times.size} inits{members} × {r.steps} steps, batch {r.batch_size}: "
          f"{r.steps_per_s:.2f} model steps/s; the training forward on this mesh: "
          f"{r.training_steps_per_s:.2f} steps/s ({ratio:.2f}×)")  # fmt: skip
    if r.scorecard is not None:
        print(r.scorecard)
    for path in r.score_files:
        print(f"wrote {path}")
    if r.path is not None:
        print(f"wrote {r.path}; {READ_BACK[request.format].format(path=str(r.path))}")


def _forecast_options(args: argparse.Namespace) -> list[str]:
    """The options given that make a forecast (not taken with ``--unfinished``), as written."""
    from ..inference import PredictRequest, option_of

    fields = PredictRequest.model_fields
    given = [name for dest, name in (("config", "CONFIG"), ("overrides", "KEY=VALUE")) if getattr(args, dest)]
    return given + [option_of(f) for f, field in fields.items() if getattr(args, f, None) not in
                    (None, False, [], field.default)]  # fmt: skip


def _unfinished(args: argparse.Namespace) -> int:
    from ..inference import UNFINISHED_LOCAL, find_unfinished, foreign_files, foreign_text, remove_unfinished

    given = _forecast_options(args)
    if given:
        option = "--unfinished" if args.unfinished is not None else "--remove-unfinished"
        raise ValueError(
            f"{option} lists or removes unfinished forecasts and takes no {given[0]}; nothing was run. "
            f"Run it on its own (jigsaw-earth predict {option} ...), and the forecast without it"
        )
    for folder in [*(args.unfinished or []), *(args.remove_unfinished or [])]:
        if "://" in str(folder):
            option = "--unfinished" if folder in (args.unfinished or []) else "--remove-unfinished"
            raise ValueError(f"{option} {folder}: predict {UNFINISHED_LOCAL}; nothing was run")
    for folder in args.unfinished or []:
        if not Path(folder).is_dir():
            what = "is not a folder" if Path(folder).exists() else "does not exist"
            raise ValueError(f"--unfinished {folder}: {what}; give the folder that holds the forecasts")
    for path in args.remove_unfinished or []:
        print(f"removed {remove_unfinished(path).text()}")
    folders = args.unfinished or (["."] if args.unfinished is not None else [])  # --unfinished alone: .
    for folder in folders:
        found = find_unfinished(folder)
        print(f"{len(found)} unfinished forecast{'s' * (len(found) != 1)} of predict in {folder}")
        removable = []
        for item in found:
            print(f"  {item.text()}")
            foreign = foreign_files(item.path)
            if foreign:  # --remove-unfinished would refuse it: say why here
                print(f"    {foreign_text(item.path, foreign)}: move your files out before removing it")
            elif item.holder is None:
                removable.append(item)
        if removable:
            print(f"resume one with the command that started it, or remove it: jigsaw-earth predict "
                  f"--remove-unfinished {removable[0].path}")  # fmt: skip
        elif found:
            print("resume one with the command that started it; none can be removed now (in use, or holding "
                  "files predict did not write)")  # fmt: skip
    return 0


def run(args: argparse.Namespace) -> int:
    from ..inference import Stopped, prediction_config, run_prediction

    if args.unfinished is not None or args.remove_unfinished:
        return _unfinished(args)
    if args.config is None and args.model is None:
        raise ValueError(
            "give the run's config (predict CONFIG --out STORE ...), a shared model (predict --model DIR "
            "...), or --unfinished [DIR]"
        )
    cfg = prediction_config(args.config, args.overrides, args.model, args.checkpoint)
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    request = _request(args, cfg)
    try:
        result = run_prediction(cfg, request)
    except Stopped as err:
        if rank == 0:
            print(f"jigsaw-earth predict: {err}", file=sys.stderr)
        return err.exit_code
    if rank == 0 and result.complete:
        _complete(request, result)
    elif rank == 0:
        _report(request, result)
    return 0
