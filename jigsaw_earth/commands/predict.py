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

import numpy as np

from ..config import load_config
from .perturb_options import add_perturb_arguments, perturbation_from_args

if TYPE_CHECKING:
    from ..config.schema import TrainConfig
    from ..inference.predict import Prediction
    from ..inference.scoring import ScoreRequest


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
    p.add_argument(
        "--time", nargs="+", metavar="T", help="with --init: only these of its times, e.g. 2024-01-01T00"
    )
    p.add_argument("--checkpoint", help="checkpoint folder; default: the newest in run.dir")
    p.add_argument(
        "--model",
        metavar="DIR",
        help="a shared model's folder (`model export`) instead of a run's CONFIG: on any mesh, its input "
        "contract checked before it loads; KEY=VALUE overrides such as data.store=STORE",
    )
    p.add_argument(
        "--first-init", "--start", dest="start", metavar="TIME",
        help="first initialisation time (default: data.val_period[0]); --first-init works under torchrun, "
        "which takes --start for its own --start-method",
    )  # fmt: skip
    p.add_argument(
        "--last-init", "--end", dest="end", metavar="TIME",
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
    """The spelling of an option the command line used (``--first-init`` or ``--start``)."""
    return long if any(a == long or a.startswith(f"{long}=") for a in argv) else short


def _check_period(start: str, end: str, argv: Sequence[str] = ()) -> None:
    first, last = _spelled(argv, "--first-init", "--start"), _spelled(argv, "--last-init", "--end")
    for option, text in ((first, start), (last, end)):
        try:
            np.datetime64(text, "h")
        except ValueError:
            raise ValueError(f"{option} {text!r} is not a date; write YYYY-MM-DD or YYYY-MM-DDTHH") from None
    if np.datetime64(start, "h") > np.datetime64(end, "h"):
        raise ValueError(f"{first} {start} is after {last} {end}; swap them")


READ_BACK = {
    "zarr": "open it with xarray.open_zarr({path!r})",
    "grib2": "read its files with ecCodes (grib_ls {path}/*.grib2) or xarray.open_dataset(FILE, "
    "engine='cfgrib', backend_kwargs={{'indexpath': ''}}) (--template: other names)",
    "netcdf": "open its files with xarray.open_mfdataset({path!r} + '/*.nc')",
}


def _init_period(args: argparse.Namespace, cfg: TrainConfig) -> tuple[str, str]:
    """``--start``/``--end`` (default ``data.val_period``) select data.store's inits; ``--init`` its own."""
    argv = getattr(args, "argv", [])
    if args.init is not None:
        first, last = _spelled(argv, "--first-init", "--start"), _spelled(argv, "--last-init", "--end")
        given = [o for o, v in ((first, args.start), (last, args.end), ("--max-inits", args.max_inits),
                                ("--every-hours", args.every_hours != 12)) if v]  # fmt: skip
        if given:
            raise ValueError(
                f"{given[0]} selects inits of data.store; with --init choose its times with --time"
            )
        return "", ""
    if args.time:
        raise ValueError(
            "--time chooses the times of an --init analysis; add --init SOURCE (or use --first-init and "
            "--last-init)"
        )
    period = cfg.data.val_period or ["", ""]
    start, end = args.start or period[0], args.end or period[-1]
    if not start or not end:
        raise ValueError("give --start and --end (the config has no data.val_period to default to)")
    _check_period(start, end, argv)
    return start, end


def _score_request(args: argparse.Namespace) -> ScoreRequest | None:
    from ..inference.scoring import ScoreRequest

    given = [o for o, v in (("--truth", args.truth), ("--climatology", args.climatology),
                            ("--regions", args.regions), ("--scores", args.scores)) if v]  # fmt: skip
    if not args.score:
        if given:
            raise ValueError(f"{given[0]} is a scoring option; add --score (or leave it out)")
        return None
    if args.regions:
        from ..metrics.regions import get_regions

        get_regions(args.regions)  # unknown names fail here, before any work
    return ScoreRequest(args.truth, args.climatology, tuple(args.regions) if args.regions else None)


def _stores(args: argparse.Namespace, cfg: TrainConfig) -> tuple[tuple[str, str | None], ...]:
    """What ``--scores`` may never be inside: the stores read and the one written."""
    from ..data.preflight import default_climatology_path

    d = cfg.data
    return (("--out store", args.out), ("--truth store", args.truth), ("truth/training store data.store",
            d.store), ("--climatology store", args.climatology),
            ("climatology", d.climatology or default_climatology_path(d.store)),
            ("--init source", args.init))  # fmt: skip


def _complete(args: argparse.Namespace, result: Prediction) -> None:
    """Rank 0: ``--out`` already held this forecast; where its scores are, if it was scored."""
    n = result.init_times.size
    print(f"{result.path} is complete: it holds this forecast ({n} inits × {result.steps} steps, the same "
          f"request); nothing was forecast or written. Change the request, or pass "
          f"--overwrite with another one, to forecast again")  # fmt: skip
    if args.scores:
        found = Path(f"{args.scores}.json")
        print(f"its scores: {found}" if found.is_file() else f"its scores {found} are missing: score the "
              f"store with jigsaw-earth score {result.path} --truth STORE --out {args.scores}")  # fmt: skip


def _report(args: argparse.Namespace, result: Prediction, cfg: TrainConfig) -> None:
    """Rank 0: the forecast rate, and the scorecard as ``score`` prints it."""
    r = result
    members = "" if r.members is None else f" × {r.members} member" + "s" * (r.members != 1)
    ratio = r.steps_per_s / r.training_steps_per_s
    print(f"forecast {r.init_times.size} inits{members} × {r.steps} steps, batch {r.batch_size}: "
          f"{r.steps_per_s:.2f} model steps/s; the training forward on this mesh: "
          f"{r.training_steps_per_s:.2f} steps/s ({ratio:.2f}×)")  # fmt: skip
    if result.rows is not None:
        from ..metrics.scorecard import (
            format_scorecard,
            grid_resolution,
            init_period,
            read_baselines,
            write_scores,
        )
        from ..metrics.significance import IntervalOptions

        period = init_period(result.init_times)
        resolution = grid_resolution(result.n_lon)
        interval = IntervalOptions().info(int(result.init_times.size))  # TileScorer.finish's default
        print(format_scorecard(result.rows, read_baselines(None), resolution, period, members=result.members,
                               interval=interval))  # fmt: skip
        if args.scores:
            from ..inference.scoring import score_stores

            first, last = result.init_times.min(), result.init_times.max()
            times = [str(np.datetime_as_string(t, unit="h")) for t in (first, last)]
            truth, climatology = score_stores(_score_request(args), cfg)  # the stores actually read
            where = None if result.path is None else str(result.path)
            info = {"forecast": where if where is None or "://" in where else str(Path(where).resolve()),
                    "truth": truth, "climatology": climatology, "baselines": None,
                    "resolution": resolution, "inits": [*times, int(result.init_times.size)],
                    "members": result.members, "interval": interval}  # fmt: skip
            result.statistics.ds.attrs.update({k: v for k, v in info.items() if k in ("forecast", "truth",
                                               "climatology", "resolution") and v})  # fmt: skip
            for path in write_scores(result.rows, Path(args.scores), info, "--scores", _stores(args, cfg),
                                     statistics=result.statistics):  # fmt: skip
                print(f"wrote {path}")
    if result.path is not None:
        print(f"wrote {result.path}; {READ_BACK[args.format].format(path=str(result.path))}")


#: predict's options that make a forecast (dest, as written): not taken with --unfinished
_FORECAST_OPTIONS = (("config", "CONFIG"), ("overrides", "KEY=VALUE"), ("out", "--out"),
                     ("checkpoint", "--checkpoint"), ("start", "--first-init/--start"),
                     ("end", "--last-init/--end"), ("steps", "--steps"), ("variables", "--variables"),
                     ("levels", "--levels"), ("lead_hours", "--lead-hours"), ("lead_every", "--lead-every"),
                     ("batch_size", "--batch-size"), ("overwrite", "--overwrite"), ("members", "--members"),
                     ("seed", "--seed"), ("score", "--score"), ("scores", "--scores"), ("init", "--init"),
                     ("time", "--time"), ("template", "--template"), ("model", "--model"),
                     ("perturb", "--perturb"))  # fmt: skip


def _unfinished(args: argparse.Namespace) -> int:
    from ..inference.unfinished import find_unfinished, foreign_files, foreign_text, remove_unfinished

    given = [name for dest, name in _FORECAST_OPTIONS if getattr(args, dest, None)]
    if given:
        option = "--unfinished" if args.unfinished is not None else "--remove-unfinished"
        raise ValueError(
            f"{option} lists or removes unfinished forecasts and takes no {given[0]}; nothing was run. "
            f"Run it on its own (jigsaw-earth predict {option} ...), and the forecast without it"
        )
    for folder in [*(args.unfinished or []), *(args.remove_unfinished or [])]:
        if "://" in str(folder):
            from ..inference.unfinished import UNFINISHED_LOCAL

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


def _model_config(args: argparse.Namespace) -> TrainConfig:
    """``--model DIR``: the configuration its contract describes, with the KEY=VALUE overrides."""
    from ..mesh_setup import world_size_from_env
    from ..sharing.folder import ModelFolder
    from ..sharing.use import model_config

    if args.config is not None and "=" in args.config:  # an override where CONFIG would stand
        args.overrides, args.config = [args.config, *args.overrides], None
    if args.config is not None or args.checkpoint is not None:
        given = "CONFIG " + args.config if args.config is not None else "--checkpoint"
        raise ValueError(
            f"--model {args.model} is the model to forecast with; leave out {given} (set the store with "
            "data.store=STORE)"
        )
    return model_config(ModelFolder.open(args.model), args.overrides, world_size_from_env())


def run(args: argparse.Namespace) -> int:
    from ..inference.predict import run_prediction
    from ..inference.progress import Stopped
    from ..inference.selection import parse_int_list
    from ..mesh_setup import world_size_from_env

    if args.unfinished is not None or args.remove_unfinished:
        return _unfinished(args)
    if args.model is not None:
        cfg = _model_config(args)
    elif args.config is None:
        raise ValueError(
            "give the run's config (predict CONFIG --out STORE ...), a shared model (predict --model DIR "
            "...), or --unfinished [DIR]"
        )
    else:
        cfg = load_config(args.config, args.overrides, world_size=world_size_from_env())
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    start, end = _init_period(args, cfg)
    if args.seed is not None and args.members is None:
        raise ValueError(f"--seed {args.seed} is the ensemble's noise seed; add --members N or leave it out")
    if args.first_member and args.members is None:
        raise ValueError(
            f"--first-member {args.first_member} numbers an ensemble's members; add --members N or leave "
            f"it out"
        )
    perturb = perturbation_from_args(args, cfg)
    score = _score_request(args)
    if args.scores:  # before any work: the one output check (never a run record, never in a store)
        from ..metrics.scorecard import check_scores_output

        check_scores_output(args.scores, "--scores", _stores(args, cfg))
    variables = [v for item in args.variables for v in item.split(",") if v] if args.variables else None
    try:
        result = run_prediction(
            cfg,
            args.out,
            checkpoint=args.checkpoint,
            start=start,
            end=end,
            steps=args.steps,
            every_hours=args.every_hours,
            max_inits=args.max_inits,
            batch_size=args.batch_size,
            overwrite=args.overwrite,
            variables=variables,
            levels=parse_int_list(args.levels, "--levels"),
            lead_hours=parse_int_list(args.lead_hours, "--lead-hours"),
            lead_every=args.lead_every,
            score=score,
            members=args.members,
            seed=args.seed,
            scores=args.scores,
            first_member=args.first_member,
            init=args.init,
            init_times=[t for item in args.time for t in item.split(",") if t] if args.time else None,
            fmt=args.format,
            template=args.template,
            model=args.model,
            perturb=perturb,
        )
    except Stopped as err:
        if rank == 0:
            print(f"jigsaw-earth predict: {err}", file=sys.stderr)
        return err.exit_code
    if rank == 0 and result.complete:
        _complete(args, result)
    elif rank == 0:
        _report(args, result, cfg)
    return 0
