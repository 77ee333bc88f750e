"""predict's one request: built the same from the command line and in Python, checked on construction
(one line naming the option, the value and the fix), a JSON round trip, and its JSON schema in docs/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import create_model

from jigsaw_earth.cli_docs import REQUEST_SCHEMA, command_parsers, request_schema
from jigsaw_earth.commands.predict import _request
from jigsaw_earth.config import parse_config
from jigsaw_earth.inference.perturb import Perturbation
from jigsaw_earth.inference.request import PredictRequest, option_of
from jigsaw_earth.inference.scoring import ScoreRequest

CFG = parse_config({"data": {"store": "data.zarr", "val_period": ["2020-01-11", "2020-01-13"]}})
PARSER = dict(command_parsers())["predict"]


def _from_argv(*argv: str) -> PredictRequest:
    args = PARSER.parse_args(["config.yaml", *argv])
    args.argv = list(argv)
    return _request(args, CFG)


def test_the_command_line_builds_the_request_a_notebook_builds() -> None:
    argv = ["--out", "fc.zarr", "--first-init", "2020-01-11", "--last-init", "2020-01-12T12", "--steps", "4",
            "--variables", "z,t", "t2m", "--levels", "500,850", "--lead-hours", "6", "12", "--members", "4",
            "--seed", "7", "--perturb", "gaussian", "--amplitude", "0.1", "--pairs", "--score", "--regions",
            "europe", "--scores", "s", "--format", "netcdf", "--batch-size", "2"]  # fmt: skip
    request = PredictRequest(
        out=Path("fc.zarr"), first_init="2020-01-11", last_init="2020-01-12T12", steps=4,
        variables=["z", "t", "t2m"], levels=[500, 850], lead_hours=[6, 12], members=4, seed=7,
        perturb=Perturbation("gaussian", 0.1, pairs=True).with_defaults(CFG.data.step_hours),
        score=ScoreRequest(regions=("europe",)), scores="s", format="netcdf", batch_size=2,
    )  # fmt: skip
    assert _from_argv(*argv) == request
    assert _from_argv("--out", "fc.zarr") == PredictRequest(out="fc.zarr")


def test_every_field_is_one_option_of_predict_with_the_fields_name() -> None:
    dests = {a.dest: a.option_strings for a in PARSER._actions}
    for field in PredictRequest.model_fields:
        assert option_of(field) in dests.get(field, []), (
            f"{field}: no option {option_of(field)} (dest {field})"
        )


def test_the_request_round_trips_through_json() -> None:
    request = PredictRequest(
        out="fc.zarr", init="ifs.grib2", init_times=["2024-01-01T00"], levels=[500], members=2,
        first_member=2, perturb=Perturbation("lagged", 1.0, lag_hours=6),
        score=ScoreRequest("era5.zarr", None, ("all",)),
    )  # fmt: skip
    assert PredictRequest.from_json(request.model_dump_json()) == request


@pytest.mark.parametrize(
    ("values", "line"),
    [
        ({"every_hours": 0}, "--every-hours 0: must be at least 1; e.g. --every-hours 1"),
        ({"max_inits": -1}, "--max-inits -1: must be 0 (all) or more"),
        ({"batch_size": 0}, "--batch-size 0: must be at least 1"),
        ({"steps": "4"}, "predict request steps='4': expected an integer"),
        ({"members": True}, "predict request members=True: expected an integer"),
        ({"step": 4}, "predict request: unknown key 'step'; did you mean 'steps'?"),
        ({"format": "grib"}, "predict request format='grib' is not allowed (did you mean 'grib2'?)"),
        ({"levels": ["6h"]}, "--levels '6h' is not a whole number"),
        ({"first_init": "yesterday"}, "--first-init 'yesterday' is not a date"),
        ({"first_init": "2020-02-05", "last_init": "2020-02-01"}, "after --last-init 2020-02-01; swap them"),
        ({"seed": 3}, "--seed 3 is the ensemble's noise seed; add --members N"),
        ({"init": "a.grib2", "max_inits": 3}, "--max-inits selects inits of data.store"),
        ({"init_times": ["2020-01-01"]}, "--time chooses the times of an --init analysis"),
        ({"score": ScoreRequest(regions=("europa",))}, "did you mean 'europe'"),
        ({"out": ""}, "--out '' is empty"),
        ({"out": None}, "nothing to do: give --out STORE"),
    ],
)
def test_a_bad_value_is_one_line_naming_it(values: dict, line: str) -> None:
    with pytest.raises(ValueError) as err:
        PredictRequest(**{"out": "fc.zarr", **values})
    assert line in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_the_command_names_the_period_as_typed_and_checks_the_default() -> None:
    with pytest.raises(ValueError, match=r"^--start 2020-02-05 is after --end 2020-02-01; swap them$"):
        _from_argv("--out", "fc.zarr", "--start", "2020-02-05", "--end", "2020-02-01")
    with pytest.raises(ValueError, match=r"^--first-init 2020-02-05 is after --last-init 2020-01-13"):
        _from_argv("--out", "fc.zarr", "--first-init", "2020-02-05")  # the config's val_period[1]
    with pytest.raises(ValueError, match=r"^--regions is a scoring option; add --score"):
        _from_argv("--out", "fc.zarr", "--regions", "europe")


def test_the_schema_in_docs_is_the_requests() -> None:
    # the request's fields as the file holds them (the nested types' serialisation varies by pydantic)
    on_file, now = json.loads(REQUEST_SCHEMA.read_text()), json.loads(request_schema())
    assert on_file["properties"] == now["properties"], "run python -m jigsaw_earth.cli_docs"
    assert sorted(on_file["$defs"]) == sorted(now["$defs"]), "run python -m jigsaw_earth.cli_docs"
    grown = create_model("PredictRequest", __base__=PredictRequest, more=(int, 0))
    assert grown.model_json_schema() != PredictRequest.model_json_schema()  # a new field: a new schema
    assert all(p.get("description") for p in PredictRequest.model_json_schema()["properties"].values())


def test_the_period_defaults_to_the_configs() -> None:
    request = PredictRequest(out="fc.zarr", first_init="2020-01-12")
    assert request.period(CFG.data.val_period) == ("2020-01-12", "2020-01-13")
    assert PredictRequest(out="fc.zarr", init="a.nc").period(CFG.data.val_period) == ("", "")
    with pytest.raises(ValueError, match=r"the config has no data\.val_period"):
        request.period([])
