"""What ``predict`` is asked to do: one typed, validated ``PredictRequest``.

The command line builds it once from its options (``commands/predict.py``) and a notebook builds the
same object; ``run_prediction(cfg, request)`` takes it whole. Each field is one option of ``predict``
(``first_init`` is ``--first-init``, ``init_times`` is ``--time``: the field's ``option``), documented
here and in the JSON schema ``docs/predict-request.schema.json`` (``python -m jigsaw_earth.cli_docs``
writes it; ``--check`` fails when it is stale). What needs no config is checked on construction, each
fault one line naming the option, the value and the fix (``ValueError``); what needs the run's config
(the default period, ensembles the model can make, the selection, the format's files) is checked by
``run_prediction`` before any work.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from ..config.base import is_time
from ..config.errors import one_line
from .perturb import Perturbation
from .scoring import ScoreRequest
from .selection import parse_int_list

__all__ = ["EVERY_HOURS", "PredictRequest", "check_period", "option_of"]

EVERY_HOURS = 12  # --every-hours when not given


def _text(value: Any) -> Any:
    """A path given as ``pathlib.Path`` (or any path-like) as its text; a URL stays as written."""
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _words(value: Any) -> Any:
    """``["z,t", "u"]`` → ``["z", "t", "u"]``: names or times given comma-separated or one by one."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return [w for v in value for w in v.split(",") if w]
    return value


def _whole_numbers(option: str) -> BeforeValidator:
    """``["500,850"]`` → ``[500, 850]`` (``--levels``, ``--lead-hours``); integers pass as given."""

    def parse(value: Any) -> Any:
        if isinstance(value, list | tuple) and any(isinstance(v, str) for v in value):
            return parse_int_list(value, option)
        return value

    return BeforeValidator(parse)


Text = Annotated[str, BeforeValidator(_text)]
Words = Annotated[list[str], BeforeValidator(_words)]


def _field(text: str, option: str, default: Any = None, **more: Any) -> Any:
    """A documented field and the option of ``predict`` that sets it."""
    return Field(default, description=text, json_schema_extra={"option": option}, **more)


def _is_time(option: str, text: str) -> None:
    if not is_time(text):
        raise ValueError(f"{option} {text!r} is not a date; write YYYY-MM-DD or YYYY-MM-DDTHH")


def check_period(first: str, last: str) -> None:
    """``--first-init`` and ``--last-init`` are times, in order."""
    _is_time("--first-init", first)
    _is_time("--last-init", last)
    if np.datetime64(first, "h") > np.datetime64(last, "h"):
        raise ValueError(f"--first-init {first} is after --last-init {last}; swap them")


#: the least value of a whole-number option, and what to say below it
_LEAST = {"every_hours": (1, "at least 1"), "max_inits": (0, "0 (all) or more"),
          "batch_size": (1, "at least 1")}  # fmt: skip


class PredictRequest(BaseModel):
    """One forecast run: where the model and initial states come from, which inits, which fields
    and leads, the ensemble, the output and the scoring. Unknown fields are refused; a field left out
    takes ``predict``'s default."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # the model and the initial states
    checkpoint: Text | None = _field("checkpoint folder (default: the newest in run.dir)", "--checkpoint")
    model: Text | None = _field(
        "a shared model's folder (`model export`) instead of the run's checkpoint", "--model"
    )
    init: Text | None = _field(
        "forecast from this analysis (GRIB, netCDF, Zarr) instead of data.store's inits", "--init"
    )
    init_times: Words | None = _field("with init: only these of its times (default: all)", "--time")
    # which inits of data.store
    first_init: Text | None = _field(
        "first initialisation time (default: data.val_period[0])", "--first-init"
    )
    last_init: Text | None = _field("last initialisation time (default: data.val_period[1])", "--last-init")
    every_hours: StrictInt = _field("initialise at multiples of this hour", "--every-hours", EVERY_HOURS)
    max_inits: StrictInt = _field("at most this many inits, evenly spaced (0: all)", "--max-inits", 0)
    # which fields and leads
    steps: StrictInt | None = _field(
        "model steps of data.step_hours (default 4, or the last lead)", "--steps"
    )
    variables: Words | None = _field("only these variables (WB2 names or short names)", "--variables")
    levels: Annotated[list[StrictInt] | None, _whole_numbers("--levels")] = _field(
        "only these pressure levels (hPa)", "--levels"
    )
    lead_hours: Annotated[list[StrictInt] | None, _whole_numbers("--lead-hours")] = _field(
        "only these leads in hours", "--lead-hours"
    )
    lead_every: StrictInt | None = _field("only every K-th step's lead", "--lead-every")
    batch_size: StrictInt | None = _field(
        "inits per forward (default: what half the free memory holds, or a resumed run's)", "--batch-size"
    )
    # the ensemble
    members: StrictInt | None = _field("an ensemble of this many members (None: one deterministic forecast)",
                                 "--members")  # fmt: skip
    seed: StrictInt | None = _field("the ensemble's noise seed (default run.seed)", "--seed")
    first_member: StrictInt = _field("number the members from this one (further members of an ensemble)",
                               "--first-member", 0)  # fmt: skip
    perturb: Perturbation | None = _field("the members' initial states perturbed so (any model)", "--perturb")
    # the output
    out: Text | None = _field("the forecast store, or with format grib2|netcdf a folder", "--out")
    format: Literal["zarr", "grib2", "netcdf"] = _field("zarr: one store; grib2, netcdf: a folder of files",
                                                        "--format", "zarr")  # fmt: skip
    template: str | None = _field("file names of format grib2|netcdf (formats.TEMPLATES)", "--template")
    overwrite: StrictBool = _field("replace an existing output", "--overwrite", False)
    # the scoring
    score: ScoreRequest | None = _field("score the forecast as it runs (truth, climatology, regions)",
                                        "--score")  # fmt: skip
    scores: Text | None = _field(
        "the scores' file prefix; names a score-only run's in-progress folder", "--scores"
    )

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as err:
            raise ValueError(_one_line(err)) from None

    @classmethod
    def parse(cls, values: dict[str, Any]) -> PredictRequest:
        """A request of ``values`` (field → value, as the command line's options give them), checked as
        on construction."""
        try:
            return cls.model_validate(values)
        except ValidationError as err:
            raise ValueError(_one_line(err)) from None

    @classmethod
    def from_json(cls, text: str | bytes) -> PredictRequest:
        """A request written by ``model_dump_json`` (or by hand), checked as on construction."""
        try:
            return cls.model_validate_json(text)
        except ValidationError as err:
            raise ValueError(_one_line(err)) from None

    @field_validator("every_hours", "max_inits", "batch_size")
    @classmethod
    def _at_least(cls, value: int | None, info: Any) -> int | None:
        least, what = _LEAST[info.field_name]
        if value is not None and value < least:
            option = option_of(info.field_name)
            raise ValueError(f"{option} {value}: must be {what}; e.g. {option} {max(least, 1)}")
        return value

    @field_validator("first_init", "last_init")
    @classmethod
    def _a_time(cls, value: str | None, info: Any) -> str | None:
        if value is not None:
            _is_time(option_of(info.field_name), value)
        return value

    @field_validator("out")
    @classmethod
    def _named(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("--out '' is empty; give the forecast store to write, e.g. --out fc.zarr")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> PredictRequest:
        self._check_inits()
        if self.seed is not None and self.members is None:
            raise ValueError(
                f"--seed {self.seed} is the ensemble's noise seed; add --members N or leave it out"
            )
        if self.first_member and self.members is None:
            raise ValueError(f"--first-member {self.first_member} numbers an ensemble's members; add "
                             f"--members N or leave it out")  # fmt: skip
        if self.perturb is not None and self.members is None:
            raise ValueError(
                f"--perturb {self.perturb.scheme} perturbs an ensemble's members; add --members N"
            )
        if self.scores is not None and self.score is None:
            raise ValueError("--scores is a scoring option; add --score (or leave it out)")
        if self.score is not None and self.score.regions:
            from ..metrics.regions import get_regions

            get_regions(list(self.score.regions))  # unknown names fail here, before any work
        if self.out is not None:
            from .bucket_output import check_bucket_format

            check_bucket_format(self.out, self.format)
        if self.out is None and self.score is None:
            raise ValueError(
                "nothing to do: give --out STORE to write the forecast, --score to score it, or both"
            )
        return self

    def _check_inits(self) -> None:
        """``init`` chooses its own times; the period, ``every_hours`` and ``max_inits`` select
        data.store's."""
        if self.init is not None:
            given = [option_of(f) for f, v in (("first_init", self.first_init), ("last_init", self.last_init),
                     ("max_inits", self.max_inits), ("every_hours", self.every_hours != EVERY_HOURS))
                     if v]  # fmt: skip
            if given:
                raise ValueError(
                    f"{given[0]} selects inits of data.store; with --init choose its times with --time"
                )
        elif self.init_times:
            raise ValueError("--time chooses the times of an --init analysis; add --init SOURCE (or use "
                             "--first-init and --last-init)")  # fmt: skip
        if self.first_init is not None and self.last_init is not None:
            check_period(self.first_init, self.last_init)

    def period(self, val_period: list[str] | None) -> tuple[str, str]:
        """The first and last init of data.store (``val_period``: the config's default), checked; with
        ``init`` none (``("", "")``)."""
        if self.init is not None:
            return "", ""
        default = val_period or ["", ""]
        first, last = self.first_init or default[0], self.last_init or default[-1]
        if not first or not last:
            raise ValueError(
                "give --first-init and --last-init (the config has no data.val_period to default to)"
            )
        check_period(first, last)
        return first, last


def option_of(field: str) -> str:
    """The option of ``predict`` that sets ``field`` (``first_init``: ``--first-init``)."""
    extra = PredictRequest.model_fields[field].json_schema_extra
    return str(extra["option"]) if isinstance(extra, dict) else field


def _one_line(err: ValidationError) -> str:
    """A request's first fault as one line: a rule's own message (it names the option, the value and
    the fix), or ``predict request FIELD=VALUE: what is wrong; the fix``."""
    first = err.errors(include_url=False)[0]
    if first["type"] == "value_error":
        return str(first["ctx"]["error"])
    return one_line(err, PredictRequest, what="predict request")
