"""More meshes on four fake GPUs (``tests/fakegpu/``, NCCL's rules on every call), each run compared with
one CPU process: a UNet on 1 × 4 (7-column tiles: its convolutions and down-sampling cross every
edge), resumed on data × domain 2 × 1 × 2 from the 1 × 4 run's checkpoint, an ensemble over the
mesh's ensemble axis (1 × 2 × 1 × 2, fair CRPS, noise channels) forecast with ``predict --members
--score``, and a fine-tune on 2 × 2 (a variable added, the down-sampling frozen). In CI's default run
beside ``test_device_guard_ranks.py``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from jigsaw_earth.device import PLUGIN_ENV
from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.selftest import GRID, tiny_config

from .test_device_guard_ranks import FAKE

FIELDS = dict(levels=(500, 850), upper_air=("geopotential", "temperature"),
              surface=("2m_temperature", "mean_sea_level_pressure"))  # fmt: skip


def _configs(root: Path, device: str, on_cpu: bool) -> dict[str, dict[str, Any]]:
    """The cases' configs on ``device`` (one process, mesh 1 × 1, when ``on_cpu``)."""
    tag = "cpu" if on_cpu else "device"

    def config(run: str, model: str, mesh: MeshShape) -> dict[str, Any]:
        raw = tiny_config(root, f"{tag}-{run}", device, 1, model, MeshShape() if on_cpu else mesh)
        raw["validation"]["max_samples"] = 2
        return raw

    out = {"unet": config("unet", "unet", MeshShape(1, 1, 4))}
    resume = config("resume", "unet", MeshShape(2, 1, 2))
    resume["checkpoint"]["resume"] = str(root / "device-unet" / "checkpoints" / "step_000000004")
    out["resume"] = resume
    ens = config("ensemble", "vit", MeshShape(1, 1, 2, ensemble=2))
    ens["model"]["noise_channels"] = 2
    ens["training"]["members"] = 2
    ens["loss"] = {"kind": "fair_crps"}
    out["ensemble"] = ens
    child = config("finetune", "unet", MeshShape(1, 2, 2))
    child["data"]["surface"] = list(FIELDS["surface"])
    child["training"].update(steps=4, init_from=str(root / f"{tag}-unet"), freeze=["down"])
    child["checkpoint"]["every"] = 0
    out["finetune"] = child
    return out


def _run(mesh: DomainMesh | None, raw: dict[str, Any], forecast: str | None, members: int | None) -> dict:
    from jigsaw_earth.config import parse_config
    from jigsaw_earth.inference.predict import PredictRequest, run_prediction
    from jigsaw_earth.inference.scoring import ScoreRequest
    from jigsaw_earth.mesh_setup import setup_mesh
    from jigsaw_earth.training.loop import Trainer

    cfg = parse_config(raw)
    mesh = setup_mesh(cfg)
    trainer = Trainer(cfg, mesh)
    summary = trainer.fit()
    history = trainer.history
    out = {"steps": [int(h["step"]) for h in history], "losses": [float(h["loss"]) for h in history],
           "validation": {k: float(v) for k, v in summary["validation"].items()}}  # fmt: skip
    if forecast is not None:
        result = run_prediction(
            cfg,
            PredictRequest(
                out=forecast,
                first_init="2020-01-11",
                last_init="2020-01-13",
                steps=2,
                max_inits=2,
                score=ScoreRequest(),
                overwrite=True,
                members=members,
            ),
            mesh,
        )
        out["scores"] = sorted((_key(r), [float(r.get(k, np.nan)) for k in NUMBERS]) for r in result.rows)
    return out


NUMBERS = ("value", "se", "lower", "upper")  # a score row's figures (the interval's too), compared as numbers


def _key(row: dict[str, Any]) -> str:
    return str(sorted((k, str(v)) for k, v in row.items() if k not in NUMBERS))


def _cases(mesh: DomainMesh | None, raws: dict[str, dict[str, Any]], root: str) -> dict[str, dict]:
    tag = "cpu" if raws["unet"]["distributed"]["device"] == "cpu" else "device"
    return {
        "unet": _run(mesh, raws["unet"], f"{root}/{tag}-unet.zarr", None),
        "resume": _run(mesh, raws["resume"], None, None),
        "ensemble": _run(mesh, raws["ensemble"], f"{root}/{tag}-ensemble.zarr", 2),
        "finetune": _run(mesh, raws["finetune"], None, None),
    }


def _close(a: Any, b: Any, tol: float = 1e-4) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= tol * np.maximum(np.abs(b), 1e-6)))


@pytest.mark.slow
def test_meshes_ensembles_and_a_fine_tune_on_fake_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jigsaw_earth.data.synth import SynthConfig, synth_store

    synth_store(tmp_path / "data.zarr", SynthConfig(n_lat=GRID[0], n_lon=GRID[1], start="2020-01-01",
                                                    end="2020-01-16", **FIELDS))  # fmt: skip
    monkeypatch.setenv(PLUGIN_ENV, FAKE)
    device = spawn(MeshShape(1, 1, 4), _cases, _configs(tmp_path, "fakegpu", False), str(tmp_path),
                   device="fakegpu", timeout_s=3000)[0]  # fmt: skip
    monkeypatch.delenv(PLUGIN_ENV)
    cpu_raws = _configs(tmp_path, "cpu", True)
    cpu_raws["resume"]["checkpoint"]["resume"] = copy.deepcopy(
        _configs(tmp_path, "fakegpu", False)["resume"]["checkpoint"]["resume"]
    )  # the device's 1 x 4 checkpoint, on the CPU
    cpu = _cases(None, cpu_raws, str(tmp_path))
    for case in ("unet", "ensemble", "finetune"):
        assert _close(device[case]["losses"], cpu[case]["losses"]), (case, device[case], cpu[case])
        keys = sorted(cpu[case]["validation"])
        got = [device[case]["validation"][k] for k in keys]
        assert _close(got, [cpu[case]["validation"][k] for k in keys]), case
    assert device["resume"]["steps"] == cpu["resume"]["steps"] == [5, 6, 7, 8]
    later = dict(zip(cpu["unet"]["steps"], cpu["unet"]["losses"]))
    assert _close(device["resume"]["losses"], [later[s] for s in (5, 6, 7, 8)]), device["resume"]
    assert _close(cpu["resume"]["losses"], [later[s] for s in (5, 6, 7, 8)]), cpu["resume"]
    for case in ("unet", "ensemble"):
        names = [k for k, _ in device[case]["scores"]]
        assert names == [k for k, _ in cpu[case]["scores"]], case
        got = np.array([v for _, v in device[case]["scores"]])
        want = np.array([v for _, v in cpu[case]["scores"]])
        assert np.array_equal(np.isnan(got), np.isnan(want)), case
        # the interval's figures within the tolerance of the score they bound (its scale, not theirs)
        scale = np.maximum(np.abs(want[:, :1]), 1e-6)
        assert np.all(np.abs(np.nan_to_num(got - want)) <= 1e-4 * scale), case
    assert any("crps" in k.lower() for k, _ in device["ensemble"]["scores"]), device["ensemble"]["scores"][:3]
