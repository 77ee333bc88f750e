"""Fine-tuning (``training.init_from``, ``training.freeze``): the demo's model on a small in-memory set.

A parent WeatherMixer (the demo's overrides) is trained 4 steps on the demo's variables (z, t, u,
v at 500/850 hPa and t2m) on one rank. Its children:

* two variables added (mean sea-level pressure; specific humidity at both levels) and one removed
  (v wind): at step 0 the kept channels' forecast equals the parent's given the removed input at
  its mean (0 in normalised units) within float32 rounding; with additions only, the parent's
  forecast itself;
* the same with the mixer blocks frozen: trained 6 steps, the frozen weights are bit-identical,
  have no gradient and no optimizer state, the loss falls, and the run's records name the parent;
* the same fine-tune on a 2 × 2 mesh follows the 1-rank one within 1e-5 over 6 steps;
* a parent of another model, another model size or another grid is refused, naming what differs.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from jigsaw_earth.data.batch import STATIC_GEOMETRY, channel_names
from jigsaw_earth.data.samples import MemorySource, TrainData

from jigsaw_earth.checkpoint import latest_checkpoint
from jigsaw_earth.checkpoint.transfer import checkpoint_sha256
from jigsaw_earth.config import parse_config
from jigsaw_earth.config.schema import TrainConfig
from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.distributed.tiles import TileGrid
from jigsaw_earth.training import Trainer

N_LAT, N_LON, N_TIMES = 8, 12, 80
DEMO = {"upper_air": ["geopotential", "temperature", "u_component_of_wind", "v_component_of_wind"]}
CHILD = {
    "upper_air": ["geopotential", "temperature", "u_component_of_wind", "specific_humidity"],
    "surface": ["2m_temperature", "mean_sea_level_pressure"],
}
ADDED_ONLY = {"surface": ["2m_temperature", "mean_sea_level_pressure"]}
FROZEN = {"training": {"freeze": ["blocks"], "steps": 6}}
STATIC = ["land_sea_mask"]
DEMO_MODEL = {
    "name": "weathermixer",
    "preset": "tiny",
    "overrides": {"embed_dim": 96, "channel_hidden": 192, "token_hidden": 64, "patch": 2},
}
MODELS: dict[str, dict[str, Any]] = {
    "demo": DEMO_MODEL,
    "vit": {"name": "vit", "preset": "tiny", "overrides": {"patch": 2}},
    "unet": {"name": "unet", "preset": "tiny", "overrides": {}},
    "convnet": {"name": "jigsaw_examples.convnet:ConvNet", "preset": "tiny", "overrides": {}},
    "transformer": {
        "name": "jigsaw_examples.transformer:Transformer",
        "preset": "tiny",
        "overrides": {"patch": 2},
    },
}
# the Jigsaw paper's arrangement (presets paper-*) at the demo's size
PAPER_LIKE = {
    "concat": True,
    "linear_residual": True,
    "residual": False,
    "final_norm": True,
    "coord_channels": False,
}
EXAMPLES = Path(__file__).parents[1] / "examples"


def fields(names: list[str], n_lat: int = N_LAT) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(T, C, H, W)`` eastward-travelling waves, each channel a function of its name only (so a
    channel kept by a child has the parent's data and statistics), the static fields, times, lat."""
    lat = np.linspace(80, -80, n_lat)
    lon = np.arange(N_LON) * 360 / N_LON
    times = np.datetime64("2020-01-01T00", "h") + np.arange(N_TIMES) * 6
    t = np.arange(N_TIMES)[:, None, None]
    la, lo = np.deg2rad(lat)[None, :, None], np.deg2rad(lon)[None, None, :]
    out = []
    for name in names:
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        mean, scale, k, phase = rng.uniform(-5, 5), rng.uniform(0.5, 3), rng.integers(1, 4), rng.uniform(0, 6)
        wave = np.cos(la) * np.sin(k * lo - 0.4 * t + phase) + 0.3 * np.cos(2 * la)
        out.append(mean + scale * (wave + rng.normal(0, 0.05, wave.shape)))
    static = np.stack([np.cos(la[0]) * np.ones_like(lo[0])] + [np.ones((n_lat, N_LON))] * 4)
    return np.stack(out, axis=1).astype(np.float32), static.astype(np.float32), times, lat


def config(
    run_dir: str | Path, mesh: tuple[int, int] = (1, 1), data: dict | None = None, **sections: Any
) -> TrainConfig:
    raw: dict[str, Any] = {
        "run": {"dir": str(run_dir), "seed": 5, "name": Path(run_dir).name},
        "mesh": {"data": 1, "lat": mesh[0], "lon": mesh[1]},
        "data": {
            "store": "memory",
            **DEMO,
            "levels": [500, 850],
            "surface": ["2m_temperature"],
            "static": STATIC,
            "train_period": ["2020-01-01", "2020-01-15"],
            "val_period": ["2020-01-16", "2020-01-20T18"],
            **(data or {}),
        },
        "model": DEMO_MODEL,
        "optim": {"lr": 3e-3, "warmup_steps": 1, "grad_clip": 1.0},
        "training": {"steps": 4, "batch_size": 4},
        "validation": {"lead_hours": [6], "max_samples": 2, "variables": ["temperature@850"]},
        "checkpoint": {"every": 0, "resume": "auto"},
        "logging": {"progress": False, "wandb": {"mode": "disabled"}},
    }
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value}
    return parse_config(raw)


MODELS_ALL = {**MODELS, "paper-like": {**DEMO_MODEL, "overrides": {**DEMO_MODEL["overrides"], **PAPER_LIKE}}}


def memory_data(cfg: TrainConfig, mesh: DomainMesh, n_lat: int = N_LAT) -> TrainData:
    d = cfg.data
    names = channel_names(d.upper_air, d.levels, d.surface)
    x, static, times, lat = fields(names, n_lat)
    grid = TileGrid(n_lat, N_LON, mesh.shape.lat, mesh.shape.lon)
    source = MemorySource(
        x, static, times, lat, names, [*STATIC, *STATIC_GEOMETRY], grid.tile_of(mesh.domain.index)
    )
    flat = x.transpose(1, 0, 2, 3).reshape(len(names), -1)
    return TrainData(
        source, mesh, grid, mean=flat.mean(1), std=flat.std(1), diff_std=np.diff(x, axis=0).std((0, 2, 3)),
        global_batch=cfg.training.batch_size, seed=cfg.run.seed, step_hours=6, train_period=d.train_period,
        val_period=d.val_period, rollout_steps=1, prefetch=0,
    )  # fmt: skip


def trainer(cfg: TrainConfig, mesh: DomainMesh | None = None, n_lat: int = N_LAT) -> Trainer:
    mesh = mesh or DomainMesh(MeshShape())
    return Trainer(cfg, mesh, data=memory_data(cfg, mesh, n_lat))


@pytest.fixture(scope="module")
def parents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Trainer]]:
    """``parents(model)``: a parent of ``MODELS[model]`` trained 4 steps (made once per module)."""
    made: dict[str, Trainer] = {}

    def make(name: str) -> Trainer:
        if name not in made:
            run = tmp_path_factory.mktemp("runs") / "parent"
            made[name] = trainer(config(run, model=MODELS_ALL[name]))
            made[name].fit()
        return made[name]

    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(EXAMPLES))  # the example conv net with a channel_dims hook
        yield make


@pytest.fixture(scope="module")
def parent(parents: Callable[[str], Trainer]) -> Trainer:
    return parents("demo")


def forecast(t: Trainer, state: torch.Tensor, batch: Any) -> torch.Tensor:
    with torch.no_grad():
        return t.forward(state, batch.static, batch.time_features)


def step_zero(parent: Trainer, child: Trainer) -> tuple[float, float, list[str]]:
    """The child's step-0 forecast against the parent's on the same batch, the parent's removed
    inputs at their mean (0): the largest difference on the kept channels, on the added ones
    against persistence, and the kept channels."""
    batch = next(child.data.val_batches(1, 2, 2))
    p_ch, c_ch = parent.data.channels, child.data.channels
    p_state = torch.zeros(batch.inputs.shape[0], len(p_ch), N_LAT, N_LON)
    for i, ch in enumerate(p_ch):
        if ch in c_ch:
            p_state[:, i] = batch.inputs[:, c_ch.index(ch)]
    mine, theirs = forecast(child, batch.inputs, batch), forecast(parent, p_state, batch)
    kept = [ch for ch in c_ch if ch in p_ch]
    a = mine[:, [c_ch.index(c) for c in kept]]
    b = theirs[:, [p_ch.index(c) for c in kept]]
    new = [c_ch.index(c) for c in c_ch if c not in p_ch]
    return float((a - b).abs().max()), float((mine[:, new] - batch.inputs[:, new]).abs().max()), kept


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("change", ["added-removed", "added"])
def test_step_zero_keeps_the_parents_forecast(
    parents: Callable[[str], Trainer], model: str, change: str, tmp_path: Path
) -> None:
    """Two variables added, one removed: the kept channels' forecast is the parent's given the
    removed input at its mean; with additions only it is the parent's on the parent's input. The
    added channels' forecast starts as persistence (zero weights to the new outputs)."""
    parent = parents(model)
    data = CHILD if change == "added-removed" else ADDED_ONLY
    cfg = config(
        tmp_path / "child", data=data, model=MODELS[model], training={"init_from": str(parent.run_dir)}
    )
    child = trainer(cfg)
    kept_gap, new_gap, kept = step_zero(parent, child)
    assert len(kept) == (7 if change == "added-removed" else 9)
    assert kept_gap < 1e-5 and new_gap == 0.0, (kept_gap, new_gap)
    added = [c for c in child.data.channels if c not in parent.data.channels]
    assert child.lineage["added"][: len(added)] == added


def test_a_deterministic_parent_becomes_a_stochastic_model(parent: Trainer, tmp_path: Path) -> None:
    """``model.noise_channels`` adds inputs named ``noise:K``: they start at zero weight, so the
    member's step-0 forecast is the parent's whatever the noise."""
    model = {**DEMO_MODEL, "noise_channels": 2}
    cfg = config(tmp_path / "child", model=model, training={"init_from": str(parent.run_dir)})
    child = trainer(cfg)
    assert child.lineage["added"] == ["noise:0", "noise:1"]
    batch = next(child.data.val_batches(1, 2, 2))
    noise = torch.randn(batch.inputs.shape[0], 2, N_LAT, N_LON)
    with torch.no_grad():
        mine = child.forward(batch.inputs, batch.static, batch.time_features, noise)
    torch.testing.assert_close(mine, forecast(parent, batch.inputs, batch), rtol=1e-5, atol=1e-5)


def test_a_norm_across_channels_only_starts_near_the_parent(
    parents: Callable[[str], Trainer], tmp_path: Path
) -> None:
    """The paper's arrangement normalises [LN(recovered), state] across channels (its linear
    residual): with channels added the kept channels' forecast starts near the parent's, not at it."""
    parent = parents("paper-like")
    cfg = config(
        tmp_path / "child",
        data=ADDED_ONLY,
        model=MODELS_ALL["paper-like"],
        training={"init_from": str(parent.run_dir)},
    )
    kept_gap, _, _ = step_zero(parent, trainer(cfg))
    print(f"paper-like step-0 gap on the kept channels: {kept_gap:.3g} (normalised units)")
    assert 1e-4 < kept_gap < 1.0, kept_gap


def test_frozen_blocks_stay_bit_identical_and_the_records_name_the_parent(
    parent: Trainer, tmp_path: Path
) -> None:
    cfg = config(
        tmp_path / "child", data=CHILD, training={"init_from": str(parent.run_dir), **FROZEN["training"]}
    )
    child = trainer(cfg)
    frozen = {n: p.detach().clone() for n, p in child.model.named_parameters() if n.startswith("blocks.")}
    trained = {
        n: p.detach().clone() for n, p in child.model.named_parameters() if not n.startswith("blocks.")
    }
    assert frozen and trained and child.frozen == sorted(frozen)
    summary = child.fit()
    params = dict(child.model.named_parameters())
    for name, before in frozen.items():
        assert torch.equal(params[name], before), name
        assert params[name].grad is None and params[name] not in child.optimizer.state, name
    assert all(not torch.equal(params[n], before) for n, before in trained.items() if "bias" not in n)
    loss = [h["loss"] for h in child.history]
    assert loss[-1] < loss[0], loss
    ckpt = latest_checkpoint(parent.run_dir)
    sha = checkpoint_sha256(ckpt)
    assert summary["init_from"]["sha256"] == sha and summary["init_from"]["step"] == 4
    on_disk = json.loads((Path(cfg.run.dir) / "summary.json").read_text())
    assert on_disk["init_from"]["checkpoint"] == str(ckpt.resolve())
    text = (Path(cfg.run.dir) / "config.yaml").read_text()
    assert text.startswith(f"# fine-tuned from {ckpt.resolve()} (step 4 of run 'parent', sha256 {sha})")
    assert yaml.safe_load(text)["training"]["init_from"] == str(parent.run_dir)
    history = [json.loads(x) for x in (Path(cfg.run.dir) / "history.jsonl").read_text().splitlines()]
    assert history[-1]["init_from"]["sha256"] == sha
    meta = json.loads((latest_checkpoint(cfg.run.dir) / "meta.json").read_text())
    assert meta["state"]["init_from"]["sha256"] == sha
    assert meta["state"]["run_record"]["channels"]["state"] == child.data.channels
    # a resume continues from the run's own checkpoint and keeps the lineage (the parent is not read
    # again), and a run keeps its parent: another init_from is refused, naming the recorded one
    with pytest.raises(ValueError, match=r"was fine-tuned from .*step_000000004.*a run keeps its parent"):
        trainer(config(tmp_path / "child", data=CHILD, training={"init_from": "/gone", "steps": 7}))
    # the blocks may be unfrozen then: they train from a fresh optimizer state
    more = trainer(
        config(tmp_path / "child", data=CHILD, training={"init_from": str(parent.run_dir), "steps": 7})
    )
    assert more.step == 6 and more.lineage["sha256"] == sha and not more.frozen
    more.fit()
    assert not torch.equal(
        dict(more.model.named_parameters())["blocks.0.channel_mixing.fc1.weight"],
        frozen["blocks.0.channel_mixing.fc1.weight"],
    )


def test_parent_without_a_run_record_is_described_by_its_config_yaml(parent: Trainer, tmp_path: Path) -> None:
    """Checkpoints written before runs recorded their channels: the run's config.yaml names them."""
    old = tmp_path / "old-parent"
    shutil.copytree(parent.run_dir, old)
    meta_file = latest_checkpoint(old) / "meta.json"
    meta = json.loads(meta_file.read_text())
    del meta["state"]["run_record"]
    meta_file.write_text(json.dumps(meta))
    child = trainer(config(tmp_path / "child", data=CHILD, training={"init_from": str(old)}))
    reference = trainer(
        config(tmp_path / "child-ref", data=CHILD, training={"init_from": str(parent.run_dir)})
    )
    for (name, a), b in zip(child.model.named_parameters(), reference.model.parameters(), strict=True):
        assert torch.equal(a, b), name


def _refusal(parent: Trainer, run_dir: Path, n_lat: int = N_LAT, **sections: Any) -> str:
    sections["training"] = {"init_from": str(parent.run_dir), **sections.get("training", {})}
    cfg = config(run_dir, **sections)
    with pytest.raises(ValueError) as err:
        trainer(cfg, n_lat=n_lat)
    return str(err.value)


def test_another_model_or_grid_is_refused_naming_what_differs(parent: Trainer, tmp_path: Path) -> None:
    msg = _refusal(parent, tmp_path / "a", model={"name": "vit", "preset": "tiny", "overrides": {"patch": 2}})
    assert "holds model 'weathermixer'" in msg and "'vit'" in msg, msg
    msg = _refusal(parent, tmp_path / "b", model={"overrides": {"embed_dim": 64, "patch": 2}})
    assert (
        "embed.weight has global shape" in msg
        and "model.overrides.embed_dim is 96 in the parent, 64 here" in msg
    )
    msg = _refusal(parent, tmp_path / "c", n_lat=10)
    assert "trained on a 8x12 grid, this store is 10x12" in msg, msg
    msg = _refusal(parent, tmp_path / "d", training={"init_from": str(tmp_path / "nothing")})
    assert "does not exist" in msg, msg
    with pytest.raises(ValueError, match=r"'blokcs' matches no module .*did you mean 'blocks'"):
        trainer(config(tmp_path / "e", training={"freeze": ["blokcs"]}))
    with pytest.raises(ValueError, match=r"init_from=.* and checkpoint.resume=.* both name weights"):
        config(tmp_path / "f", training={"init_from": "x"}, checkpoint={"resume": "runs/x/step_1"}).check()


# ------------------------------------------------------------------------------ on every mesh
def _finetune(mesh: DomainMesh, run_dir: str, parent_dir: str) -> dict:
    cfg = config(
        run_dir,
        (mesh.shape.lat, mesh.shape.lon),
        data=CHILD,
        training={"init_from": parent_dir, **FROZEN["training"]},
    )
    t = Trainer(cfg, mesh, data=memory_data(cfg, mesh))
    t.fit()
    return {"loss": [h["loss"] for h in t.history], "grad_norm": [h["grad_norm"] for h in t.history]}


def test_a_one_rank_parent_fine_tuned_on_2x2_follows_the_one_rank_fine_tune(parent: Trainer) -> None:
    with tempfile.TemporaryDirectory(prefix="jigsaw-finetune-") as base:
        one = _finetune(DomainMesh(MeshShape()), f"{base}/1x1", str(parent.run_dir))
        four = spawn(MeshShape(1, 2, 2), _finetune, f"{base}/2x2", str(parent.run_dir))
    assert len(one["loss"]) == 6
    for r, rank in enumerate(four):
        for key in ("loss", "grad_norm"):
            a, b = np.asarray(rank[key]), np.asarray(one[key])
            gap = float(np.max(np.abs(a - b) / np.abs(b)))
            assert gap < 1e-5, (key, a, b)
            print(f"rank {r} {key}: largest relative difference 2x2 vs 1 rank {gap:.2e}")
