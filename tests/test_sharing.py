"""Sharing a trained model: ``model export`` on a 2 × 2 mesh, then the folder used everywhere else.

A tiny WeatherMixer is trained 3 steps on a synthetic 12 × 24 store and exported from 2 × 2 ranks
(``spawn``). The folder's weights are the checkpoint's tensors bit for bit (read by
``safetensors`` itself); ``predict --model`` on one rank writes the store ``predict`` writes from the
run, on 1 × 4 ranks the same within float32 rounding (the weights loaded there bit for bit);
``jigsaw_earth.load_model`` forecasts the same in plain PyTorch; ``model verify`` passes on a copy
elsewhere and names the file and the fields when one weight changes; a missing or truncated file, a
changed contract and weights of another shape are refused naming the file; the contract refuses a
store without a variable, with other levels, flipped latitudes, another grid or other declared
units (one message each) and warns of a temperature in °C; export never replaces a folder that is
not an earlier export; ``training.init_from`` starts from the folder's weights.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import xarray as xr
from jigsaw_earth.data.synth import SynthConfig, synth_store
from safetensors.torch import load_file, save_file

import jigsaw_earth
from jigsaw_earth.checkpoint import latest_checkpoint, load_full_tensors, read_meta
from jigsaw_earth.checkpoint.planner import Block
from jigsaw_earth.checkpoint.safetensors_files import (
    SafetensorsFiles,
    create_files,
    plan_files,
    read_header,
    write_block,
)
from jigsaw_earth.cli import main
from jigsaw_earth.config import parse_config
from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.inference.predict import PredictRequest, run_prediction
from jigsaw_earth.sharing.export import ExportRequest, export_model
from jigsaw_earth.sharing.folder import ModelFolder
from jigsaw_earth.sharing.use import check_store
from jigsaw_earth.training import run_training

from .train_helpers import merge_sections, mixer_config

SYNTH = SynthConfig(
    n_lat=12, n_lon=24, start="2020-01-01", end="2020-01-16", levels=(500, 850),
    upper_air=("geopotential", "temperature"), surface=("2m_temperature",),
)  # fmt: skip
CHANNELS = ["geopotential@500", "geopotential@850", "temperature@500", "temperature@850", "2m_temperature"]
PERIOD = ["--first-init", "2020-01-11", "--last-init", "2020-01-13", "--steps", "3", "--max-inits", "3"]


def _config(tmp: Path, mesh: tuple[int, int] = (1, 1), **extra: Any) -> dict[str, Any]:
    """The tiny run of these tests; a section in ``extra`` replaces the config's."""
    raw = merge_sections(mixer_config(tmp, 3, "2020-01-14"), {"mesh": {"lat": mesh[0], "lon": mesh[1]}})
    raw["run"]["name"] = "tiny"
    return {**raw, **extra}


def _export_on_mesh(mesh: DomainMesh, raw: dict[str, Any], ckpt: str, out: str, scores: str) -> str:
    request = ExportRequest(Path(out), "apache-2.0", scores=Path(scores), datasets=("synthetic",))
    export_model(parse_config(raw), Path(ckpt), request, mesh=mesh)
    return out


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _error(code: int, text: str, *fragments: str) -> str:
    """The one error line of a refused command, holding ``fragments``."""
    assert code == 2 and "Traceback" not in text, text[-3000:]
    errors = [ln for ln in text.splitlines() if ": error: " in ln]
    assert len(errors) == 1, text[-3000:]
    for frag in fragments:
        assert frag in errors[0], f"{frag!r} not in {errors[0]!r}"
    return errors[0]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("sharing")
    synth_store(tmp / "data.zarr", SYNTH)
    raw = _config(tmp)
    run_training(parse_config(raw))
    ckpt = latest_checkpoint(tmp / "run")
    assert ckpt is not None
    fc = tmp / "fc-run.zarr"
    run_prediction(
        parse_config(raw),
        PredictRequest(out=fc, first_init="2020-01-11", last_init="2020-01-13", steps=3, max_inits=3),
    )
    clim = str(tmp / "data-climatology.zarr")
    assert main(["score", str(fc), "--truth", str(tmp / "data.zarr"), "--climatology", clim, "--out",
                 str(tmp / "scores")]) == 0  # fmt: skip
    spawn(MeshShape(1, 2, 2), _export_on_mesh, _config(tmp, (2, 2)), str(ckpt), str(tmp / "model"),
          str(tmp / "scores.json"))  # fmt: skip
    return {"tmp": tmp, "store": tmp / "data.zarr", "run": tmp / "run", "ckpt": ckpt, "model": tmp / "model",
            "fc": fc}  # fmt: skip


# ------------------------------------------------------------------------------ the folder
def test_export_from_2x2_writes_the_checkpoints_tensors_as_safetensors(world: dict[str, Path]) -> None:
    folder = world["model"]
    names = {p.name for p in folder.iterdir()}
    assert names == {"README.md", "contract.json", "model.safetensors", "model.safetensors.index.json",
                     "static.safetensors", "reference.safetensors", "reference.json",
                     "jigsaw_earth.json"}  # fmt: skip
    weights, saved = load_file(folder / "model.safetensors"), load_full_tensors(world["ckpt"])
    assert set(weights) == set(saved) and all(torch.equal(weights[k], saved[k]) for k in saved)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(saved)
    card = (folder / "README.md").read_text()
    assert card.startswith("---\nlicense: apache-2.0\nlibrary_name: jigsaw-earth\n")
    assert (
        "\ndatasets:\n- synthetic\n---\n" in card
        and "## Limits" in card
        and "trained on synthetic data" in card
    )
    scores = card[card.index("## Validation scores") : card.index("## Reference forecast")]
    assert "global · geopotential @ 500 hPa [m2/s2]" in scores and "±" in scores  # score's table, intervals
    assert "forecast against persistence: relative difference" in scores
    contract = json.loads((folder / "contract.json").read_text())
    assert contract["channels"]["inputs"]["state"] == CHANNELS and contract["levels"] == [500, 850]
    assert contract["variables"]["surface"] == [{"name": "2m_temperature", "units": "K"}]
    assert contract["grid"]["training_store_latitude_order"] == "north_to_south"
    assert contract["training"]["step"] == 3 and contract["precision"] == "fp32"


def test_predict_model_writes_the_store_predict_writes_from_the_run(
    world: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out = world["tmp"] / "fc-model.zarr"
    code, text = _cli(["predict", "--model", str(world["model"]), "--out", str(out), *PERIOD], capsys)
    assert code == 0, text[-3000:]
    a, b = xr.open_zarr(world["fc"]), xr.open_zarr(out)
    assert list(a.data_vars) == list(b.data_vars) and (a.time.values == b.time.values).all()
    for name in a.data_vars:
        assert np.abs(a[name].values - b[name].values).max() <= 1e-6 * np.abs(a[name].values).max(), name


def _on_1x4(mesh: DomainMesh, model: str, out: str) -> bool:
    """Predict with the folder on 1 × 4 ranks; and whether the loaded blocks are its tensors exactly."""
    from jigsaw_earth.data.sources import build_data
    from jigsaw_earth.models.run import build_run_model

    from jigsaw_earth.checkpoint.state import model_blocks
    from jigsaw_earth.sharing.use import model_config

    folder = ModelFolder.open(model)
    cfg = model_config(folder, ["mesh.lat=1", "mesh.lon=4"], 4)
    run_prediction(
        cfg,
        PredictRequest(
            out=out, first_init="2020-01-11", last_init="2020-01-13", steps=3, max_inits=3, model=model
        ),
        mesh,
    )
    net = build_run_model(cfg, mesh, build_data(cfg, mesh, training=False))
    folder.load(net)
    full = load_file(Path(model) / "model.safetensors")
    equal = True
    for key, (block, _) in model_blocks(net).items():
        where = tuple(slice(o, o + n) for o, n in zip(block.offsets, block.tensor.shape, strict=True))
        equal &= torch.equal(full[key.removeprefix("model/")][where], block.tensor)
    return bool(equal)


def test_the_2x2_export_loads_on_1x4_bit_for_bit_and_forecasts_the_same(world: dict[str, Path]) -> None:
    out = world["tmp"] / "fc-1x4.zarr"
    equal = spawn(MeshShape(1, 1, 4), _on_1x4, str(world["model"]), str(out))
    assert all(equal), "a rank's blocks differ from the exported tensors"
    a, b = xr.open_zarr(world["fc"]), xr.open_zarr(out)
    for name in a.data_vars:
        assert np.abs(a[name].values - b[name].values).max() <= 1e-5 * np.abs(a[name].values).max(), name


def test_load_model_is_plain_pytorch_and_forecasts_as_predict(world: dict[str, Path]) -> None:
    model = jigsaw_earth.load_model(world["model"])
    assert isinstance(model, torch.nn.Module) and model.channels == CHANNELS
    assert not [m for m in model.modules() if getattr(m, "jigsaw_layer", False)], "a jigsaw layer is left"
    truth, fc = xr.open_zarr(world["store"]), xr.open_zarr(world["fc"])
    init = np.datetime64("2020-01-11T00", "ns")
    at = truth.sel(time=init)
    fields = [at[n.split("@")[0]].sel(level=int(n.split("@")[1])) if "@" in n else at[n] for n in CHANNELS]
    state = torch.from_numpy(np.stack([f.values for f in fields]).astype(np.float32))[None]
    steps = model.forecast(state, init, 3)  # (3, 1, C, H, W)
    for c, name in enumerate(CHANNELS):
        var, _, lev = name.partition("@")
        want = fc[var].sel(time=init)
        want = (want.sel(level=int(lev)) if lev else want).values  # (lead, H, W)
        got = steps[:, 0, c].numpy()
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), name


# ---------------------------------------------------------------------------- verify, integrity
def _copy(world: dict[str, Path], tmp_path: Path, name: str = "copy") -> Path:
    dst = tmp_path / "elsewhere" / name
    shutil.copytree(world["model"], dst)
    return dst


def _bump(file: Path, tensor: str, by: float) -> None:
    """Add ``by`` to the first element of float32 ``tensor`` of a safetensors file, in place."""
    raw = bytearray(file.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    at = 8 + n + json.loads(raw[8 : 8 + n])[tensor]["data_offsets"][0]
    value = np.frombuffer(bytes(raw[at : at + 4]), np.float32) + np.float32(by)
    raw[at : at + 4] = value.tobytes()
    file.write_bytes(bytes(raw))


def test_verify_passes_on_a_copy_and_names_the_fields_a_changed_weight_moves(
    world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = _copy(world, tmp_path)
    code, text = _cli(["model", "verify", str(copy)], capsys)
    assert code == 0 and "matches" in text and "DIFFERS" not in text, text[-3000:]
    _bump(
        copy / "model.safetensors", "recover.bias", 0.5
    )  # one weight: geopotential@500's, one pixel a patch
    code, text = _cli(["model", "verify", str(copy)], capsys)
    assert code == 1 and "does NOT match" in text, text[-3000:]
    assert "DIFFERS  model.safetensors: its SHA-256 differs" in text
    assert "DIFFERS  geopotential@500 at +6 h: mean" in text, text[-3000:]


def test_a_missing_truncated_changed_or_misshapen_file_is_refused_naming_it(
    world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = _copy(world, tmp_path, "missing")
    (missing / "static.safetensors").unlink()
    _error(*_cli(["model", "verify", str(missing)], capsys), "lacks static.safetensors")
    truncated = _copy(world, tmp_path, "truncated")
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ValueError, match=r"model.safetensors is \d+ bytes, the export wrote \d+: truncated"):
        jigsaw_earth.load_model(truncated)
    changed = _copy(world, tmp_path, "changed")
    contract = json.loads((changed / "contract.json").read_text())
    contract["levels"] = [500]
    (changed / "contract.json").write_text(json.dumps(contract, indent=1) + "\n")
    out = tmp_path / "fc.zarr"
    code, text = _cli(["predict", "--model", str(changed), "--out", str(out), *PERIOD], capsys)
    _error(code, text, "contract.json was changed after the export")
    assert not out.exists()
    misshapen = _copy(world, tmp_path, "misshapen")
    tensors = load_file(misshapen / "model.safetensors")
    name = next(n for n, t in tensors.items() if t.dim() == 1 and t.numel() % 2 == 0)
    tensors[name] = tensors[name].reshape(2, -1)
    header, _, _ = read_header(misshapen / "model.safetensors")
    save_file(tensors, misshapen / "model.safetensors", metadata=header["__metadata__"])
    record = json.loads((misshapen / "jigsaw_earth.json").read_text())
    record["jigsaw_earth"]["files"]["model.safetensors"]["bytes"] = (
        (misshapen / "model.safetensors").stat().st_size
    )
    (misshapen / "jigsaw_earth.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=rf"model.safetensors: {name} has shape \(2, \d+\), the model"):
        jigsaw_earth.load_model(misshapen)


# ------------------------------------------------------------------------------- the contract
def _variant(world: dict[str, Path], tmp_path: Path, name: str, change: Any) -> str:
    ds = xr.open_zarr(world["store"]).load()
    for var in ds.variables.values():
        var.encoding = {}  # the training store's chunks and shards: not the variant's
    out = tmp_path / f"{name}.zarr"
    change(ds).to_zarr(out, mode="w", consolidated=False)
    return str(out)


def _drop_t2m(ds: xr.Dataset) -> xr.Dataset:
    return ds.drop_vars("2m_temperature")


def _in_celsius(ds: xr.Dataset) -> xr.Dataset:
    return ds.assign({"2m_temperature": ds["2m_temperature"] - 273.15})


def _declared_celsius(ds: xr.Dataset) -> xr.Dataset:
    out = _in_celsius(ds)
    out["2m_temperature"].attrs["units"] = "degC"
    return out


REFUSED = {
    "no-variable": (_drop_t2m, "lacks 2m_temperature (surface), which the model reads"),
    "other-levels": (lambda ds: ds.sel(level=[500]), "holds geopotential on levels [500] hPa, not on [850]"),
    "flipped": (lambda ds: ds.isel(latitude=slice(None, None, -1)), "flipped latitude order"),
    "other-grid": (lambda ds: ds.isel(latitude=slice(0, None, 2), longitude=slice(0, None, 2)),
                   "is on another grid than the model: 6x12"),
    "declared-celsius": (_declared_celsius, "holds 2m_temperature in degC (its units attribute)"),
}  # fmt: skip


def test_the_contract_refuses_each_difference_with_one_message_and_warns_of_celsius(
    world: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = ModelFolder.open(world["model"])
    check_store(folder, str(world["store"]))  # the training store fits
    for name, (change, message) in REFUSED.items():
        with pytest.raises(ValueError, match="^store .*" + re.escape(message)):
            check_store(folder, _variant(world, tmp_path, name, change))
    with caplog.at_level(logging.WARNING):
        check_store(folder, _variant(world, tmp_path, "celsius", _in_celsius))
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and warned[0].startswith("2m_temperature of store "), warned
    assert "is it in °C? The model reads K" in warned[0]


def test_predict_model_stops_before_the_model_loads_on_a_store_or_analysis_that_breaks_it(
    world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "fc.zarr"
    bad = _variant(world, tmp_path, "no-variable", _drop_t2m)
    code, text = _cli(["predict", "--model", str(world["model"]), f"data.store={bad}", "--out", str(out),
                       *PERIOD], capsys)  # fmt: skip
    _error(code, text, "lacks 2m_temperature")
    assert "loaded" not in text and not out.exists()
    argv = ["predict", "--model", str(world["model"]), "model.overrides.patch=4", "--out", str(out), *PERIOD]
    code, text = _cli(argv, capsys)
    _error(
        code, text, "model.overrides.patch=4 differs from 2 in", "drop the override of model.overrides.patch"
    )
    flipped = tmp_path / "analysis.nc"
    ds = xr.open_zarr(world["store"]).isel(time=[40]).load()
    ds.attrs = {}  # the store's record: not for a netCDF file
    ds.isel(latitude=slice(None, None, -1)).to_netcdf(flipped)
    code, text = _cli(["predict", "--model", str(world["model"]), "--init", str(flipped), "--out", str(out),
                       "--steps", "1"], capsys)  # fmt: skip
    _error(code, text, f"--init {flipped} holds its latitudes south → north", "flipped latitude order")
    assert not out.exists()


# ------------------------------------------------------------------- export's own folder only
def test_export_replaces_only_an_earlier_export(
    world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    argv = ["model", "export", str(world["run"]), "--license", "mit"]
    _error(*_cli([*argv, "--out", str(mine), "--overwrite"], capsys), "not a jigsaw-earth model store")
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    inside = world["run"] / "checkpoints" / "model"
    _error(*_cli([*argv, "--out", str(inside)], capsys), "lies inside the checkpoints of run.dir")
    again = _copy(world, tmp_path)
    _error(*_cli([*argv, "--out", str(again)], capsys), "already exists; pass --overwrite")
    code, text = _cli([*argv, "--out", str(again), "--overwrite"], capsys)
    assert code == 0, text[-3000:]
    assert (again / "README.md").read_text().startswith("---\nlicense: mit\n")
    assert not list(again.parent.glob("copy.tmp-*")), "no temporary folder left"


def test_init_from_a_model_folder_starts_from_its_weights(world: dict[str, Path], tmp_path: Path) -> None:
    raw = _config(world["tmp"], run={"dir": str(tmp_path / "child"), "seed": 7, "name": "child"})
    raw["training"] = {"steps": 1, "batch_size": 2, "init_from": str(world["model"])}
    raw["optim"] = {"lr": 1e-30, "min_lr": 0.0, "warmup_steps": 0, "weight_decay": 0.0}
    run_training(parse_config(raw))
    child = load_full_tensors(latest_checkpoint(tmp_path / "child"))
    parent = load_file(world["model"] / "model.safetensors")
    assert all(torch.equal(child[k], parent[k]) for k in parent)
    lineage = read_meta(latest_checkpoint(tmp_path / "child"))["state"]["init_from"]
    assert lineage["checkpoint"] == str(world["model"].resolve()) and lineage["step"] == 3


# ---------------------------------------------------------------------- the files themselves
def test_blocks_written_in_place_make_consolidated_files_of_bounded_size(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "a.weight": torch.randn(7, 5, 3, generator=gen),
        "b.bias": torch.randn(11, generator=gen).to(torch.bfloat16),
        "c.count": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "d.scale": torch.tensor(1.5),
    }
    shapes = {k: (tuple(v.shape), v.dtype) for k, v in tensors.items()}
    layouts = plan_files(shapes, 100, "model", {"format": "pt"})  # a.weight (420 bytes) alone, then the rest
    assert [lay.name for lay in layouts] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    assert list(layouts[0].tensors) == ["a.weight"] and list(layouts[1].tensors) == [
        "b.bias",
        "c.count",
        "d.scale",
    ]
    create_files(tmp_path, layouts)
    where = {n: lay for lay in layouts for n in lay.tensors}
    # uneven blocks, split along every dimension, as ranks of several meshes hold them
    for name, t in tensors.items():
        cuts = [sorted({0, s, *torch.randint(0, s + 1, (2,), generator=gen).tolist()}) for s in t.shape]
        for box in itertools.product(*[list(itertools.pairwise(c)) for c in cuts]):
            part = t[tuple(slice(a, b) for a, b in box)]
            write_block(tmp_path, where[name], name, Block(part, tuple(t.shape), tuple(a for a, _ in box)))
    read = {k: v for lay in layouts for k, v in load_file(tmp_path / lay.name).items()}
    assert set(read) == set(tensors) and all(torch.equal(read[k], tensors[k]) for k in tensors)
    assert all(lay.size == (tmp_path / lay.name).stat().st_size for lay in layouts)
    with SafetensorsFiles(tmp_path) as files:  # blocks read back straight into a rank's tensors
        part = torch.empty(3, 2, 3)
        files.fill({"a.weight": layouts[0].name}, {"model/a.weight": Block(part, (7, 5, 3), (4, 1, 0))})
        assert torch.equal(part, tensors["a.weight"][4:7, 1:3])
        assert torch.equal(files.read(layouts[1].name, "b.bias", (2,), (5,)), tensors["b.bias"][2:7])


@pytest.mark.slow
def test_paper_1p1b_exports_from_2x2_within_its_share_and_loads_on_1x4_bit_for_bit(tmp_path: Path) -> None:
    """The Jigsaw paper's 1.1 B WeatherMixer (random weights) at 720 × 1440: no export rank grows past
    its resident share by more than a weight file's bound; every block reads back equal on 1 × 4."""
    import subprocess
    import sys

    script = Path(__file__).parents[1] / "scripts" / "export_memory.py"
    figures = tmp_path / "figures.json"
    argv = [sys.executable, str(script), "--out", str(tmp_path / "weights"), "--json", str(figures)]
    done = subprocess.run([*argv, "--max-file-size", "2GB"], capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(figures.read_text())
    assert sum(r["share"] for r in result["export"]) > 4.4e9  # 1.1 B float32 parameters over the ranks
    for r in result["export"]:
        assert r["peak"] - r["before"] <= 2e9, r
    assert all(not r["differ"] and r["blocks"] for r in result["load"]), result["load"]
