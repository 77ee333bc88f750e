"""A newcomer's probe of the newest commands (issue 49), each case through the real command line.

Each case runs ``cli.main`` in process on the world of ``test_bad_inputs`` (a 16 × 32 store, a finished
4-step run, a 3-init forecast and its scores) or on files made from it in ``tmp_path``:

* refusals: one line naming the item and the fix, exit 2, nothing written in the world or in
  ``tmp_path`` (statistics against another truth or climatology, compared or joined; statistics with a
  repeated or shuffled init; a missing ``-stats.nc``, a netCDF forecast or a statistics file given as
  what it is not; a GRIB folder given to ``data inspect``; a folder of two grids to ``data prepare``; a
  ``--template`` naming files of another kind; URLs, printed as given; ``bench compile --device cuda``
  without a GPU; an ``--init`` lacking a variable, with advice predict can follow);
* resumes that must not go on: ``--format`` switched, or the ``--init`` file replaced;
* answers that must not be wrong: identical forecasts are not significantly different, leads and
  fields left out of a comparison are named, an interval method with too few inits falls back to one
  that holds; netCDF output is the same bytes whatever order the store lists its variables in;
  ``--unfinished`` suggests removing only what ``--remove-unfinished`` removes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr

from . import test_bad_inputs as base
from .grib_helpers import write_centre_file
from .test_bad_inputs import PR, P, _assert_clean_error, _cli, _refused_cleanly, _snapshot
from .test_bad_inputs_reruns import NO_GPU, _out, _stop_after_first_batch

store, finished_run, world = base.store, base.finished_run, base.world  # quiet_signals: conftest.py
ELSEWHERE = "/elsewhere/era5.zarr"


def _stats(w: dict) -> Path:
    return w["root"] / "scores-stats.nc"


def _stats_copy(w: dict, t: Path, name: str, change: Any) -> Path:
    """A copy of the world's statistics file, changed (``change(ds) -> ds``)."""
    with xr.open_dataset(_stats(w)) as ds:
        changed = change(ds.load())
    path = t / name
    changed.to_netcdf(path)
    return path


def _attrs(**attrs: Any) -> Any:
    return lambda ds: ds.assign_attrs(**attrs)


def _later(ds: xr.Dataset, **attrs: Any) -> xr.Dataset:
    """The same statistics ten days later (another campaign)."""
    return ds.assign_coords(time=ds["time"] + np.timedelta64(10, "D")).assign_attrs(**attrs)


def _grib_folder(w: dict, t: Path) -> Path:
    folder = t / "analysis"
    folder.mkdir()
    ds = xr.open_zarr(w["store"])
    write_centre_file(folder / "a.grib2", ds[["temperature"]], ds["time"].values[:1], [500, 850])
    return folder


def _two_grids(w: dict, t: Path) -> Path:
    """The same field on two grids, in two files (one analysis at two resolutions)."""
    folder = _grib_folder(w, t)
    ds = xr.open_zarr(w["store"])
    coarse = ds[["temperature"]].isel(latitude=slice(0, None, 2), longitude=slice(0, None, 2))
    write_centre_file(folder / "b.grib2", coarse, ds["time"].values[:1], [500, 850])
    return folder


def _netcdf_forecast(w: dict, t: Path) -> Path:
    xr.open_zarr(w["fc"]).load().drop_attrs().to_netcdf(t / "fc.nc")
    return t / "fc.nc"


def _analysis(w: dict, path: Path, drop: tuple[str, ...] = (), warmer: float = 0.0) -> Path:
    """The store's state at two inits of the forecast period as a netCDF analysis (``warmer``: K added
    to 2m_temperature, another analysis of the same times)."""
    ds = xr.open_zarr(w["store"]).sel(time=["2020-02-01T00", "2020-02-01T12"])
    ds = ds.drop_vars(["land_sea_mask", "geopotential_at_surface", *drop], errors="ignore").load()
    if warmer:
        ds["2m_temperature"] = ds["2m_temperature"] + warmer
    ds.drop_attrs().to_netcdf(path)
    return path


# (id, argv(world, tmp), fragments): refused with one line, nothing written in the world or tmp
PROBE_CASES: list[Any] = [
    (
        "against-another-truth",
        lambda w, t: [
            "score",
            str(_stats(w)),
            "--against",
            str(_stats_copy(w, t, "b-stats.nc", _attrs(truth=ELSEWHERE))),
            "--out",
            str(t / "x"),
        ],
        [f"was scored against the truth {ELSEWHERE}", "cannot be compared", "against the same --truth"],
    ),
    (
        "join-another-truth",
        lambda w, t: [
            "score",
            str(_stats(w)),
            str(_stats_copy(w, t, "b-stats.nc", lambda d: _later(d, truth=ELSEWHERE))),
            "--out",
            str(t / "x"),
        ],
        [f"was scored against the truth {ELSEWHERE}", "cannot be joined"],
    ),
    (
        "against-another-climatology",
        lambda w, t: [
            "score",
            str(_stats_copy(w, t, "a-stats.nc", _attrs(climatology="/c/one.zarr"))),
            "--against",
            str(_stats_copy(w, t, "b-stats.nc", _attrs(climatology="/c/two.zarr"))),
            "--out",
            str(t / "x"),
        ],
        ["against the climatology /c/two.zarr", "/c/one.zarr", "--climatology"],
    ),
    (
        "stats-duplicated-init",
        lambda w, t: [
            "score",
            str(_stats_copy(w, t, "d-stats.nc", lambda d: d.isel(time=[0, 1, 1, 2]))),
            "--out",
            str(t / "x"),
        ],
        ["d-stats.nc: its init times repeat ['2020-02-02T00']", "counted twice"],
    ),
    (
        "stats-shuffled-inits",
        lambda w, t: [
            "score",
            str(_stats_copy(w, t, "s-stats.nc", lambda d: d.isel(time=[2, 0, 1]))),
            "--out",
            str(t / "x"),
        ],
        ["s-stats.nc: its init times are not sorted", "sortby"],
    ),
    (
        "stats-missing",
        lambda w, t: ["score", str(t / "none-stats.nc"), "--out", str(t / "x")],
        ["statistics file", "none-stats.nc not found", "PREFIX-stats.nc"],
    ),
    (
        "netcdf-forecast-as-stats",
        lambda w, t: ["score", str(_netcdf_forecast(w, t)), "--out", str(t / "x")],
        ["fc.nc is a forecast in netCDF", "not statistics", "--format zarr"],
    ),
    (
        "plot-a-stats-file",
        lambda w, t: ["plot", str(_stats(w)), "--out", str(t / "p")],
        ["scores-stats.nc is a netCDF file", "not a score file", "scores.json"],
    ),
    (
        "inspect-a-grib-folder",
        lambda w, t: ["data", "inspect", str(_grib_folder(w, t))],
        ["no Zarr store at", "it holds .grib2 files", "jigsaw-earth data prepare"],
    ),
    (
        "prepare-two-grids",
        lambda w, t: PR(w, _two_grids(w, t), t / "p.zarr"),
        ["are on 2 grids", "t on regular_ll 16x32", "in a.grib2", "t on regular_ll 8x16", "in b.grib2"],
    ),
    (
        "template-of-another-format",
        lambda w, t: _out(P(w, "--format", "grib2", "--template", "{date}{time}_{step:03d}.nc"), t / "g"),
        ["--template '{date}{time}_{step:03d}.nc' gives '202002010000_006.nc'", "end in .grib"],
    ),
    (
        "score-out-s3",
        lambda w, t: ["score", str(w["fc"]), "--truth", str(w["store"]), "--out", "s3://bars/scores"],
        ["--out 's3://bars/scores' must be a local path"],
    ),
    pytest.param(
        "bench-compile-cuda",
        lambda w, t: ["bench", "compile", str(w["cfg"]), "--device", "cuda", "--meshes", "1x1"],
        ["--device cuda", "CPU-only build", "use --device cpu"],
        marks=NO_GPU,
    ),
    (
        "init-lacks-a-variable",
        lambda w, t: _out(
            [
                *P(w)[:2],
                "--init",
                str(_analysis(w, t / "a.nc", drop=("2m_temperature",))),
                "--steps",
                "1",
                "--out",
                "x",
            ],
            t / "fc.zarr",
        ),
        ["'2m_temperature'", "Rename it to '2m_temperature' in the source", "ncrename"],
    ),
]


@pytest.mark.parametrize(
    ("case", "argv", "fragments"), PROBE_CASES, ids=[getattr(c, "values", c)[0] for c in PROBE_CASES]
)
def test_probe_refusals(case: str, argv: Any, fragments: list[str], world: dict, tmp_path: Path,
                        capsys: Any) -> None:  # fmt: skip
    _refused_cleanly(argv, fragments, world, tmp_path, capsys)


# ---------------------------------------------------------------- resumes that must not go on
def _stopped(argv: list[str], folder: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    _stop_after_first_batch(monkeypatch)
    code, text = _cli(argv, capsys)
    monkeypatch.undo()
    assert code == 75 and folder.is_dir(), text[-3000:]
    return _snapshot(folder)


@pytest.mark.usefixtures("quiet_signals")
def test_a_resume_with_another_format_is_refused(
    world: dict, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "fc"
    argv = [*_out(P(world), out), "--batch-size", "1", "--max-inits", "2"]
    before = _stopped(argv, Path(f"{out}.in-progress"), capsys, monkeypatch)
    for fmt in ("grib2", "netcdf"):
        code, text = _cli([*argv, "--format", fmt], capsys)
        recorded = f'output format (--format): "{fmt}" (recorded: "zarr")'
        _assert_clean_error(code, text, 2, ["holds an unfinished forecast of another request", recorded])
        assert _snapshot(Path(f"{out}.in-progress")) == before and not out.exists()
    code, text = _cli(argv, capsys)  # the command as recorded resumes it
    assert code == 0 and out.is_dir(), text[-3000:]


@pytest.mark.usefixtures("quiet_signals")
def test_a_resume_from_a_replaced_init_file_is_refused(
    world: dict, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    analysis = _analysis(world, tmp_path / "latest.nc")
    out = tmp_path / "fc.zarr"
    argv = [*P(world)[:2], "--init", str(analysis), "--steps", "1", "--batch-size", "1", "--out", str(out)]
    before = _stopped(argv, Path(f"{out}.in-progress"), capsys, monkeypatch)
    original = analysis.read_bytes()
    _analysis(world, analysis, warmer=7.1)  # another analysis of the same times, under the same name
    code, text = _cli(argv, capsys)
    _assert_clean_error(code, text, 2, ["holds an unfinished forecast of another request",
                                        "content of the initial conditions (--init)"])  # fmt: skip
    assert _snapshot(Path(f"{out}.in-progress")) == before and not out.exists()
    analysis.write_bytes(original)  # the analysis it started from: it resumes
    code, text = _cli(argv, capsys)
    assert code == 0 and out.is_dir(), text[-3000:]


# ---------------------------------------------------------------- answers that must not be wrong
def _rows(prefix: Path) -> dict:
    return json.loads(Path(f"{prefix}.json").read_text())


def _last_bits(ds: xr.Dataset) -> xr.Dataset:
    """The same statistics summed in another order: every value one or two ulps away; the leads beyond
    the first and the last field left out (a forecast of fewer leads and variables)."""
    out = ds.isel(lead=[0], field=slice(0, -1)).copy()
    for name in out.data_vars:
        out[name] = out[name] * (1 + 3e-16)
    return out


def test_identical_forecasts_are_not_significantly_different_and_left_out_leads_are_named(
    world: dict, tmp_path: Path, capsys: Any, caplog: pytest.LogCaptureFixture
) -> None:
    same = _stats_copy(world, tmp_path, "c-stats.nc", _last_bits)
    code, text = _cli(["score", str(_stats(world)), "--against", str(same), "--method", "iid", "--out",
                       str(tmp_path / "x")], capsys)  # fmt: skip
    assert code == 0, text[-3000:]
    against = [r for r in _rows(tmp_path / "x")["comparisons"] if r["against"] == "c"]
    assert against and all(r["value"] == 0 and r["p_value"] == 1 and not r["significant"] for r in against)
    assert "scores-stats.nc's lead hours [12.0] are not in the other forecast's statistics" in caplog.text
    with xr.open_dataset(_stats(world)) as ds:
        last = str(ds["field"].values[-1])
    assert f"scores-stats.nc's fields [{last!r}] are not in the other" in caplog.text


def test_too_few_inits_for_a_method_fall_back_to_one_that_holds(
    world: dict, tmp_path: Path, capsys: Any, caplog: pytest.LogCaptureFixture
) -> None:
    for method in ("ar2", "dm", "bootstrap"):
        code, text = _cli(["score", str(_stats(world)), "--method", method, "--out", str(tmp_path / method)],
                          capsys)  # fmt: skip
        assert code == 0, text[-3000:]
        assert f"3 inits are too few for --method {method}" in caplog.text
        interval = _rows(tmp_path / method)["interval"]
        assert interval["method"] == "ewc" and interval["requested"] == method and interval["inits"] == 3
    rows = [r for r in _rows(tmp_path / "ar2")["scores"] if r["metric"] == "rmse"]
    assert rows and all(np.isfinite(r["lower"]) and r["lower"] < r["value"] < r["upper"] for r in rows)


def test_netcdf_output_is_the_same_bytes_whatever_order_the_store_lists_its_variables(
    world: dict, tmp_path: Path
) -> None:
    from jigsaw_earth.inference.write_netcdf import write_netcdf

    ds = xr.open_zarr(world["fc"]).isel(time=[0])
    write_netcdf(tmp_path / "a.nc", ds)
    write_netcdf(tmp_path / "b.nc", ds[list(ds.data_vars)[::-1]])
    assert (tmp_path / "a.nc").read_bytes() == (tmp_path / "b.nc").read_bytes()


@pytest.mark.usefixtures("quiet_signals")
def test_unfinished_suggests_removing_only_what_remove_unfinished_removes(
    world: dict, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "a.zarr"
    folder = Path(f"{out}.in-progress")
    _stopped([*_out(P(world), out), "--batch-size", "1", "--max-inits", "2"], folder, capsys, monkeypatch)
    (folder / "notes.txt").write_text("mine")  # a user's file: --remove-unfinished refuses this folder
    code, text = _cli(["predict", "--unfinished", str(tmp_path)], capsys)
    assert code == 0 and "1 unfinished forecast of predict" in text, text
    assert "notes.txt, which predict did not write: move your files out before removing it" in text
    assert f"--remove-unfinished {folder}" not in text and "none can be removed now" in text, text
    shutil.rmtree(folder)
