"""Sharded inference: train briefly, forecast on 1 rank and on a 2×2 mesh, compare the stores,
then run the notebook's code on them (so the notebook cannot drift from the API)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml
from jigsaw_earth.data.synth import SynthConfig, synth_store

from jigsaw_earth.config import parse_config
from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.inference.predict import PredictRequest, run_prediction
from jigsaw_earth.training import run_training

NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "explore_predictions.ipynb"


def _config(tmp: Path, mesh: tuple[int, int], **extra) -> dict:
    return {
        "run": {"dir": str(tmp / "run"), "seed": 1},
        "mesh": {"data": 1, "lat": mesh[0], "lon": mesh[1]},
        "data": {
            "store": str(tmp / "data.zarr"),
            "upper_air": ["geopotential", "temperature"],
            "levels": [500],
            "surface": ["2m_temperature"],
            "train_period": ["2020-01-01", "2020-01-10"],
            "val_period": ["2020-01-11", "2020-01-14"],
        },
        "model": {"name": "weathermixer", "preset": "tiny", "overrides": {"patch": 2}},
        "training": {"steps": 3, "batch_size": 2},
        "validation": {
            "lead_hours": [6],
            "max_samples": 2,
            "variables": ["geopotential@500", "2m_temperature"],
        },
        "checkpoint": {"every": 0, "resume": "auto"},
        "logging": {"progress": False, "wandb": {"mode": "disabled"}},
        **extra,
    }


def _predict_on_mesh(mesh: DomainMesh, raw: dict, out: str) -> str:
    cfg = parse_config(raw)
    run_prediction(
        cfg, PredictRequest(out=out, first_init="2020-01-11", last_init="2020-01-13", steps=3, max_inits=3)
    )
    return out


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("predict")
    synth_store(
        tmp / "data.zarr",
        SynthConfig(
            n_lat=12,
            n_lon=24,
            start="2020-01-01",
            end="2020-01-16",
            levels=(500,),
            upper_air=("geopotential", "temperature"),
            surface=("2m_temperature",),
        ),
    )
    run_training(parse_config(_config(tmp, (1, 1))))
    one = tmp / "forecast_1x1.zarr"
    run_prediction(
        parse_config(_config(tmp, (1, 1))),
        PredictRequest(out=one, first_init="2020-01-11", last_init="2020-01-13", steps=3, max_inits=3),
    )
    four = spawn(MeshShape(1, 2, 2), _predict_on_mesh, _config(tmp, (2, 2)), str(tmp / "forecast_2x2.zarr"))[
        0
    ]
    return {"1x1": one, "2x2": Path(four), "truth": tmp / "data.zarr", "clim": tmp / "data-climatology.zarr"}


def test_forecast_store_is_wb2_layout_and_complete(stores: dict[str, Path]) -> None:
    ds = xr.open_zarr(stores["2x2"])
    assert ds["geopotential"].dims == ("time", "prediction_timedelta", "level", "latitude", "longitude")
    assert ds["2m_temperature"].dims == ("time", "prediction_timedelta", "latitude", "longitude")
    assert ds.sizes["time"] == 3 and ds.sizes["prediction_timedelta"] == 3
    assert list(ds.prediction_timedelta.values // np.timedelta64(1, "h")) == [6, 12, 18]
    assert ds.attrs["jigsaw_earth"]["complete"] is True
    assert not np.isnan(ds["geopotential"].values).any(), "every rank must have written its tile"
    assert ds["geopotential"].encoding["chunks"][-2:] == (6, 12), "chunks follow the 2x2 tiles"
    assert not list(stores["2x2"].parent.glob("forecast_2x2.zarr.*")), "no in-progress store left"


def test_forecast_is_the_same_on_every_mesh(stores: dict[str, Path]) -> None:
    a, b = xr.open_zarr(stores["1x1"]), xr.open_zarr(stores["2x2"])
    for name in a.data_vars:
        x, y = a[name].values, b[name].values
        assert np.abs(x - y).max() <= 1e-5 * np.abs(x).max(), name


def test_forecast_differs_from_persistence(stores: dict[str, Path]) -> None:
    fc, truth = xr.open_zarr(stores["1x1"]), xr.open_zarr(stores["truth"])
    init = fc.time.values[0]
    z = fc["geopotential"].sel(time=init, level=500).values
    z0 = truth["geopotential"].sel(time=init, level=500).values
    assert np.abs(z - z0[None]).max() > 0, "the model must move the state"


def test_existing_store_is_not_overwritten(stores: dict[str, Path], tmp_path: Path) -> None:
    cfg = parse_config(_config(stores["truth"].parent, (1, 1)))
    with pytest.raises(ValueError, match="holds a complete forecast of another request; it differs in"):
        run_prediction(
            cfg, PredictRequest(out=stores["1x1"], first_init="2020-01-11", last_init="2020-01-13", steps=1)
        )


def test_no_checkpoint_is_a_clear_error(stores: dict[str, Path], tmp_path: Path) -> None:
    raw = _config(stores["truth"].parent, (1, 1))
    raw["run"]["dir"] = str(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no checkpoint in run directory"):
        run_prediction(
            parse_config(raw),
            PredictRequest(out=tmp_path / "x.zarr", first_init="2020-01-11", last_init="2020-01-13", steps=1),
        )


def test_notebook_runs_in_a_jupyter_kernel(
    stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The notebook, executed cell by cell by a real IPython kernel (nbclient), on the forecast."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("JIGSAW_FORECAST", str(stores["2x2"]))
    monkeypatch.setenv("JIGSAW_TRUTH", str(stores["truth"]))
    monkeypatch.setenv("JIGSAW_CLIMATOLOGY", str(stores["clim"]))
    monkeypatch.setenv("JIGSAW_PLOTS", str(tmp_path / "plots"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "strip outputs"
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()  # raises CellExecutionError naming the cell on any error
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "global · geopotential @ 500 hPa [m2/s2]" in text and "tropics ·" in text
    assert "inits ?" not in text and "2020-01-11T00 … 2020-01-13T00, 3 inits" in text  # the header's period
    images = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})
    ]
    assert len(images) == 4  # scorecards of 3 regions and the map of the first variable
    first = next(iter(xr.open_zarr(stores["2x2"]).data_vars))  # the notebook maps the store's first variable
    assert sorted(p.name for p in (tmp_path / "plots").glob("*.png")) == sorted(
        [f"map-{first}.png", "scorecard-extra-tropics.png", "scorecard-global.png", "scorecard-tropics.png"]
    )


# ---------------------------------------------------------------- nothing lost (issue 19)
def _snapshot(root: Path) -> dict[str, bytes]:
    if root.is_file():
        return {".": root.read_bytes()}
    return {str(p.relative_to(root)): (b"<dir>" if p.is_dir() else p.read_bytes()) for p in root.rglob("*")}


def _predict(stores: dict[str, Path], out: Path, **kw) -> Path:
    cfg = parse_config(_config(stores["truth"].parent, (1, 1)))
    return run_prediction(
        cfg,
        PredictRequest(out=out, first_init="2020-01-11", last_init="2020-01-12", steps=1, max_inits=1, **kw),
    )


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _user_folder(tmp: Path) -> Path:
    folder = tmp / "my-results"
    (folder / "sub").mkdir(parents=True)
    (folder / "notes.txt").write_text("mine")
    (folder / "sub" / "plot.png").write_bytes(b"\x89PNG")
    return folder


@pytest.mark.parametrize(
    ("case", "target", "fragment"),
    [
        ("truth-store", lambda s, t: s["truth"], "is the truth/training store"),
        ("climatology", lambda s, t: s["clim"], "is the climatology"),
        ("inside-truth", lambda s, t: s["truth"] / "geopotential", "lies inside the truth/training store"),
        ("user-folder", lambda s, t: _user_folder(t), "not a jigsaw-earth forecast store"),
        ("run-dir", lambda s, t: s["truth"].parent / "run", "is the run directory"),
        ("contains-run-dir", lambda s, t: s["truth"].parent, "contains the run directory"),
        ("checkpoints", lambda s, t: s["truth"].parent / "run" / "checkpoints", "is the checkpoint folder"),
        ("other-store", lambda s, t: _copy(s["truth"], t / "other.zarr"), "of another kind"),
    ],
)
def test_overwrite_never_deletes_what_predict_did_not_write(
    stores: dict[str, Path], tmp_path: Path, case: str, target, fragment: str
) -> None:
    path = target(stores, tmp_path)
    watched = [path, stores["truth"], stores["truth"].parent / "run"]
    before = [_snapshot(p) for p in watched]
    with pytest.raises(ValueError, match=fragment):
        _predict(stores, path, overwrite=True)
    assert [_snapshot(p) for p in watched] == before, "--overwrite deleted or changed something"
    assert not list(path.parent.glob(f"{path.name}.*")), "no in-progress store left"


def test_overwrite_replaces_an_empty_folder_and_its_own_store(
    stores: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "fc.zarr"
    out.mkdir()
    _predict(stores, out, overwrite=True)
    marker = xr.open_zarr(out).attrs["jigsaw_earth"]
    assert (marker["kind"], marker["complete"], marker["request"]["model steps (--steps)"]) == (
        "forecast",
        True,
        1,
    )
    (out / "extra").write_text("x")  # still predict's own store (the marker decides)
    _predict(stores, out, overwrite=True)
    assert not (out / "extra").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fc.zarr"], "no temporary or replaced store left"


def test_a_failed_predict_leaves_nothing_and_touches_no_other_temp(
    stores: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jigsaw_earth.inference import forecast_store

    out = tmp_path / "fc.zarr"
    other = tmp_path / "fc.zarr.tmp-local"  # another predict's temporary store (main's fixed name)
    other.mkdir()
    (other / "zarr.json").write_text("{}")

    def broken(*args, **kwargs) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(forecast_store.ForecastWriter, "write", broken)
    with pytest.raises(RuntimeError, match="disk on fire"):
        _predict(stores, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fc.zarr.tmp-local"]
    assert (other / "zarr.json").read_text() == "{}"


def test_predict_is_read_only_on_the_run(stores: dict[str, Path], tmp_path: Path, capsys) -> None:
    """Overrides of training items do not rewrite config.yaml; no history entry; nothing else changes."""
    from jigsaw_earth.cli import main

    run = stores["truth"].parent / "run"
    before = _snapshot(run)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(_config(stores["truth"].parent, (1, 1))))
    argv = ["predict", str(cfg), "optim.lr=0.5", "training.steps=1000", "--out", str(tmp_path / "fc.zarr")]
    argv += ["--start", "2020-01-11", "--end", "2020-01-12", "--steps", "1", "--max-inits", "1"]
    assert main(argv) == 0, capsys.readouterr().err
    assert _snapshot(run) == before, "predict changed the run directory"
    # a fresh run.dir with --checkpoint: no run directory is made
    fresh = tmp_path / "fresh-run"
    ckpt = sorted((run / "checkpoints").glob("step_*"))[-1]
    argv2 = [*argv[:4], f"run.dir={fresh}", "--checkpoint", str(ckpt), *argv[4:]]
    argv2[argv2.index("--out") + 1] = str(tmp_path / "fc2.zarr")
    assert main(argv2) == 0, capsys.readouterr().err
    assert not fresh.exists()


def test_a_notebooks_request_scores_as_the_command_does(stores: dict[str, Path], tmp_path: Path,
                                                        capsys) -> None:  # fmt: skip
    """``run_prediction`` with ``score`` and ``scores`` writes the score files and the scorecard that
    ``predict --score --scores`` prints and writes: the command adds nothing of its own."""
    import json

    from jigsaw_earth.cli import main
    from jigsaw_earth.inference import ScoreRequest, prediction_config

    raw = _config(stores["truth"].parent, (1, 1))
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(yaml.safe_dump(raw))
    period = {"first_init": "2020-01-11", "last_init": "2020-01-12", "steps": 2}
    cfg = prediction_config(str(cfg_file), ["training.steps=1000"])  # the warmup fits
    result = run_prediction(cfg, PredictRequest(**period, score=ScoreRequest(), scores=tmp_path / "lib"))
    assert [p.name for p in result.score_files] == ["lib.json", "lib.csv", "lib-stats.nc"]
    assert result.scorecard is not None and "RMSE" in result.scorecard
    argv = ["predict", str(cfg_file), "training.steps=1000", "--start", "2020-01-11", "--end", "2020-01-12"]
    argv += ["--steps", "2"]
    assert main([*argv, "--score", "--scores", str(tmp_path / "cli")]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert result.scorecard in printed
    for name in ("cli.json", "cli.csv", "cli-stats.nc"):
        assert f"wrote {tmp_path / name}" in printed
    assert (tmp_path / "cli.csv").read_bytes() == (tmp_path / "lib.csv").read_bytes()
    lib, cli = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("lib", "cli"))
    assert lib == cli
    with pytest.raises(ValueError, match=r"--scores .*lib\.json exists and is not an earlier score file"):
        (tmp_path / "lib.json").write_text("mine")
        run_prediction(cfg, PredictRequest(**period, score=ScoreRequest(), scores=tmp_path / "lib"))


def test_shape_override_is_refused_naming_the_key(stores: dict[str, Path], tmp_path: Path) -> None:
    raw = _config(stores["truth"].parent, (1, 1))
    raw["model"]["overrides"]["embed_dim"] = 24
    with pytest.raises(ValueError, match=r"model\.overrides\.embed_dim=24 differs from"):
        run_prediction(
            parse_config(raw),
            PredictRequest(out=tmp_path / "x.zarr", first_init="2020-01-11", last_init="2020-01-12", steps=1),
        )
    raw = _config(stores["truth"].parent, (1, 1))
    raw["data"]["surface"] = []
    raw["validation"]["variables"] = ["geopotential@500"]
    with pytest.raises(ValueError, match=r"data\.surface=\[\] differs from \['2m_temperature'\]"):
        run_prediction(
            parse_config(raw),
            PredictRequest(out=tmp_path / "x.zarr", first_init="2020-01-11", last_init="2020-01-12", steps=1),
        )
    assert not (tmp_path / "x.zarr").exists()


def test_a_pinned_checkpoint_is_not_pruned(tmp_path: Path) -> None:
    import json
    import subprocess

    from jigsaw_earth.checkpoint import pinned
    from jigsaw_earth.checkpoint.manager import FORMAT, VERSION, _prunable, _remove_unpinned

    root = tmp_path / "checkpoints"
    for step in (2, 4, 6):
        d = root / f"step_{step:09d}"
        d.mkdir(parents=True)
        (d / "meta.json").write_text(json.dumps({"format": FORMAT, "version": VERSION, "step": step}))
    (root / "latest").write_text("step_000000006\n")
    two = root / "step_000000002"
    with pinned(two):
        assert [p.name for p in _prunable(root, 1)] == ["step_000000004"]
        _remove_unpinned(two)  # a prune that decided before the pin: renamed back
        assert (two / "meta.json").is_file()
    assert [p.name for p in _prunable(root, 1)] == ["step_000000002", "step_000000004"]
    assert not list(two.glob(".pin-*"))
    # a pin left by a process that died on this host is stale
    import socket

    dead = subprocess.Popen(["true"])
    dead.wait()

    (two / f".pin-x-{dead.pid}").write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid}))
    assert [p.name for p in _prunable(root, 1)] == ["step_000000002", "step_000000004"]


# ---------------------------------------------------------------- score never drops or double-counts
def _score(argv: list[str], capsys) -> tuple[int, str]:
    from jigsaw_earth.cli import main

    code = main(["score", *argv])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_score_refuses_a_variable_missing_from_truth(
    stores: dict[str, Path], tmp_path: Path, capsys, caplog: pytest.LogCaptureFixture
) -> None:
    truth = tmp_path / "truth.zarr"
    ds = xr.open_zarr(stores["truth"]).drop_vars("temperature").load()
    for v in ds.variables.values():
        v.encoding = {}
    ds.to_zarr(truth, zarr_format=3, consolidated=False)
    code, text = _score([str(stores["1x1"]), "--truth", str(truth), "--out", str(tmp_path / "s")], capsys)
    assert code == 2 and "forecast variable 'temperature' cannot be scored" in text, text
    assert "--variables without it" in text and not list(tmp_path.glob("s.*"))
    argv = [str(stores["1x1"]), "--truth", str(truth), "--variables", "geopotential", "temperature"]
    code, text = _score([*argv, "--out", str(tmp_path / "s")], capsys)
    assert code == 0, text
    assert "skipped temperature: the truth store has no 'temperature'" in caplog.text
    rows = __import__("json").loads((tmp_path / "s.json").read_text())["scores"]
    assert {r["variable"] for r in rows} == {"geopotential"}


@pytest.mark.parametrize("fault", ["duplicated", "unsorted"])
def test_score_refuses_duplicated_or_unsorted_inits(
    stores: dict[str, Path], tmp_path: Path, fault: str, capsys
) -> None:
    fc = xr.open_zarr(stores["1x1"])
    bad = xr.concat([fc, fc.isel(time=[0])], "time") if fault == "duplicated" else fc.isel(time=[1, 0, 2])
    path = tmp_path / "bad.zarr"
    bad.to_zarr(path, zarr_format=3, consolidated=False)
    code, text = _score([str(path), "--truth", str(stores["truth"]), "--out", str(tmp_path / "s")], capsys)
    want = "repeat ['2020-01-11T00']" if fault == "duplicated" else "not sorted: 2020-01-12T00 comes before"
    assert code == 2 and want in text, text
    assert not list(tmp_path.glob("s.*"))


def test_score_refuses_an_unfinished_store(stores: dict[str, Path], tmp_path: Path, capsys) -> None:
    import shutil

    import zarr

    tmp_store = tmp_path / "fc.zarr.tmp-0123"
    shutil.copytree(stores["1x1"], tmp_store)
    code, text = _score([str(tmp_store), "--truth", str(stores["truth"])], capsys)
    assert code == 2 and "did not finish" in text, text
    marked = tmp_path / "fc.zarr"
    tmp_store.rename(marked)
    zarr.open_group(marked, mode="r+").attrs["jigsaw_earth"] = {"kind": "forecast", "complete": False}
    code, text = _score([str(marked), "--truth", str(stores["truth"])], capsys)
    assert code == 2 and "marked unfinished" in text, text
