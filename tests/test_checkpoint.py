"""Checkpoints: cross-mesh loading (2×2 → 1×4, 1×1), exact resume, atomic saves, clear errors.

One spawn per mesh; the ranks share a tmp run directory. The 2×2 spawn trains, saves (also from a
background thread while training goes on), resumes and records every saved block; the 1×4 and 1×1
spawns load the checkpoint and return theirs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from jigsaw_earth.checkpoint import (
    SaveRequest,
    export_full_state_dict,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from jigsaw_earth.checkpoint import manager as ckpt_manager
from jigsaw_earth.checkpoint.background import BackgroundSaver
from jigsaw_earth.checkpoint.state import model_blocks, optimizer_blocks
from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.layers import MLP, Domain, LayerNorm, Linear, init_model

N_LAT, N_LON, C, B = 7, 10, 5, 2


class Tiny(nn.Module):
    def __init__(self, domain: Domain, width: int = 18):
        super().__init__()
        self.inp = Linear(domain, C, width)
        self.norm = LayerNorm(domain, width)
        self.mlp = MLP(domain, width, 30)
        self.out = Linear(domain, width, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        return self.out(h + self.mlp(self.norm(h)))


def _build(mesh: DomainMesh, seed: int = 0, width: int = 18):
    domain = Domain.create(mesh, N_LAT, N_LON)
    model = init_model(Tiny(domain, width), seed)
    return domain, model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def _step(domain: Domain, model: nn.Module, opt: torch.optim.Optimizer, step: int) -> float:
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(B, N_LAT, N_LON, C, generator=g)
    y = torch.randn(B, N_LAT, N_LON, C, generator=g)
    ls, lo = domain.tile.slices
    local = ((model(x[:, ls, lo]) - y[:, ls, lo]) ** 2).sum() / y.numel()
    opt.zero_grad()
    local.backward()
    opt.step()
    total = local.detach().clone()
    if domain.axis.group is not None:
        dist.all_reduce(total, group=domain.axis.group)
    return total.item()


def _blocks(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    tensors = {**model_blocks(model), **optimizer_blocks(model, opt)}
    return {
        k: {"offsets": list(b.offsets), "shape": list(b.tensor.shape), "values": b.tensor.flatten().tolist()}
        for k, (b, _) in tensors.items()
    }


def _fail_commit(*args, **kwargs):
    raise RuntimeError("simulated crash before commit")


def _run_2x2(mesh: DomainMesh, run_dir: str) -> dict:
    domain, model, opt = _build(mesh)
    full = [_step(domain, model, opt, s) for s in range(6)]
    # Resume: 3 steps, save, a fresh (differently initialised) model loads and trains 3 more.
    domain, model, opt = _build(mesh)
    first = [_step(domain, model, opt, s) for s in range(3)]
    t0 = time.perf_counter()
    path = save_checkpoint(
        SaveRequest(run_dir, 3, model, opt, mesh, {"loader": 3}, rank_state={"rank": mesh.rank})
    )
    full_save_s = time.perf_counter() - t0
    saved = _blocks(model, opt)
    domain, model, opt = _build(mesh, seed=7)
    info = load_checkpoint(latest_checkpoint(run_dir), model, opt, mesh)
    resumed = first + [_step(domain, model, opt, s) for s in range(info["step"], 6)]
    # The same save from a thread while training goes on (its steps change every block meanwhile).
    bg_dir = Path(run_dir) / "background"
    domain, model, opt = _build(mesh)
    for s in range(3):
        _step(domain, model, opt, s)
    saver = BackgroundSaver()
    saver.save(SaveRequest(bg_dir, 3, model, opt, mesh, {"loader": 3}, rank_state={"rank": mesh.rank}))
    during = [_step(domain, model, opt, s) for s in range(3, 6)]
    bg_path = saver.wait()
    domain, model, opt = _build(mesh, seed=7)
    bg_info = load_checkpoint(bg_path, model, opt, mesh)
    bg_blocks = _blocks(model, opt)
    bg_resumed = first + [_step(domain, model, opt, s) for s in range(bg_info["step"], 6)]
    stall = {"stall_s": saver.stall_s, "write_s": saver.write_s, "full_s": full_save_s}
    # A crash after every rank wrote its shards but before the commit keeps step 3 as latest.
    original, ckpt_manager._commit = ckpt_manager._commit, _fail_commit
    try:
        save_checkpoint(SaveRequest(run_dir, 6, model, opt, mesh))
        crashed = False
    except RuntimeError:
        crashed = True
    finally:
        ckpt_manager._commit = original
    dist.barrier()
    after_crash = str(latest_checkpoint(run_dir))
    domain, model, opt = _build(mesh, seed=9)
    load_checkpoint(after_crash, model, opt, mesh)
    reload_equal = _blocks(model, opt) == saved
    return {
        "full": full,
        "resumed": resumed,
        "info": info,
        "path": str(path),
        "saved": saved,
        "crashed": crashed,
        "after_crash": after_crash,
        "reload_equal": reload_equal,
        "bg": {"during": during, "resumed": bg_resumed, "info": bg_info, "equal": bg_blocks == saved},
        "stall": stall,
    }


def _load_on(mesh: DomainMesh, path: str) -> dict:
    domain, model, opt = _build(mesh, seed=5)
    info = load_checkpoint(path, model, opt, mesh)
    blocks = _blocks(model, opt)
    losses = [_step(domain, model, opt, s) for s in range(info["step"], 6)]
    return {"blocks": blocks, "losses": losses}


def _assemble(per_rank: list[dict]) -> dict[str, torch.Tensor]:
    """Global tensors from the ranks' blocks (replicated blocks simply overwrite)."""
    out: dict[str, torch.Tensor] = {}
    shapes = {}
    for blocks in per_rank:
        for k, b in blocks.items():
            end = [o + n for o, n in zip(b["offsets"], b["shape"])]
            shapes[k] = [max(e, s) for e, s in zip(end, shapes.get(k, end))]
    for k, shape in shapes.items():
        out[k] = torch.full(shape, float("nan"))
    for blocks in per_rank:
        for k, b in blocks.items():
            idx = tuple(slice(o, o + n) for o, n in zip(b["offsets"], b["shape"]))
            out[k][idx] = torch.tensor(b["values"]).reshape(b["shape"])
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ckpt_run")
    r22 = spawn(MeshShape(1, 2, 2), _run_2x2, str(run_dir))
    path = r22[0]["path"]
    return {
        "run_dir": run_dir,
        "2x2": r22,
        "1x4": spawn(MeshShape(1, 1, 4), _load_on, path),
        "1x1": spawn(MeshShape(1, 1, 1), _load_on, path),
    }


def test_exact_resume(runs):
    r = runs["2x2"][0]
    assert r["resumed"] == r["full"], (r["resumed"], r["full"])  # bitwise
    assert r["info"]["state"] == {"loader": 3} and r["info"]["rank_state"] == {"rank": 0}


def test_background_save_while_training_resumes_exactly(runs):
    """Written by a thread while three more steps change every block: the checkpoint holds the
    step it was called at, training meanwhile is unchanged, and resuming from it is bitwise exact."""
    for r in runs["2x2"]:
        bg = r["bg"]
        assert bg["during"] == r["full"][3:]  # training went on, unchanged, while the thread wrote
        assert bg["equal"]  # the blocks of step 3 on every rank, as the synchronous save wrote them
        assert bg["resumed"] == r["full"]  # bitwise
        assert bg["info"]["state"] == {"loader": 3} and bg["info"]["rank_state"] == {
            "rank": r["info"]["rank_state"]["rank"]
        }
    s = runs["2x2"][0]["stall"]  # reported, never asserted: a timing on a shared machine
    print(
        f"background save on 2x2: training stalled {s['stall_s'] * 1e3:.1f} ms, the thread wrote for "
        f"{s['write_s'] * 1e3:.1f} ms; the synchronous save took {s['full_s'] * 1e3:.1f} ms"
    )


KILLED_WRITER = """
import json, sys, threading, time
from pathlib import Path
from torch.distributed.checkpoint import filesystem
from jigsaw_earth.checkpoint import SaveRequest
from jigsaw_earth.checkpoint.background import BackgroundSaver
from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from tests.test_checkpoint import _blocks, _build, _step

run, marker = Path(sys.argv[1]), Path(sys.argv[2])
mesh = DomainMesh(MeshShape())
domain, model, opt = _build(mesh)
_step(domain, model, opt, 0)
(run / "step1.json").write_text(json.dumps(_blocks(model, opt)))  # this process's threads, its sums
saver = BackgroundSaver()
saver.save(SaveRequest(run, 1, model, opt, mesh))
saver.wait()
real = filesystem._write_item
printed = threading.Event()  # the marker only once the caller has gone on (a loaded machine included)

def stalled(*args, **kwargs):
    out = real(*args, **kwargs)  # one tensor of step 2 written, then the process is killed
    printed.wait(120)
    marker.write_text("writing")
    time.sleep(600)
    return out

filesystem._write_item = stalled
_step(domain, model, opt, 1)
saver.save(SaveRequest(run, 2, model, opt, mesh))
print("saving in the background", flush=True)
printed.set()
_step(domain, model, opt, 2)  # training goes on while the thread writes
time.sleep(600)
"""


def test_kill_during_background_write_keeps_previous(tmp_path):
    """SIGKILL while the thread writes step 2: step 1 stays ``latest`` and loads bit-exactly, the
    half-written ``.tmp`` folder is never loaded and the next save removes it."""
    marker = tmp_path / "marker"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(tmp_path), str(marker)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=Path(__file__).parents[1],
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        out = proc.communicate(timeout=60)[0]
    finally:
        proc.kill()
    assert "saving in the background" in out  # the caller had gone on before the write ended
    root = tmp_path / "checkpoints"
    assert (root / "step_000000002.tmp").is_dir() and any((root / "step_000000002.tmp").iterdir())
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000000001"]
    assert latest_checkpoint(tmp_path).name == "step_000000001"
    expected = json.loads((tmp_path / "step1.json").read_text())  # what the killed process saved
    mesh = DomainMesh(MeshShape())
    _, model, opt = _build(mesh, seed=7)
    assert load_checkpoint(latest_checkpoint(tmp_path), model, opt, mesh)["step"] == 1
    assert _blocks(model, opt) == expected
    saver = BackgroundSaver()
    saver.save(SaveRequest(tmp_path, 2, model, opt, mesh))
    assert saver.wait() == root / "step_000000002"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000000001", "step_000000002"]


@pytest.mark.parametrize("mesh", ["1x4", "1x1"])
def test_cross_mesh_load(runs, mesh):
    saved = _assemble([r["saved"] for r in runs["2x2"]])
    loaded = [r["blocks"] for r in runs[mesh]]
    assert set(saved) == set(loaded[0]) and any(k.startswith("optim/") for k in saved)
    for blocks in loaded:
        for k, b in blocks.items():
            idx = tuple(slice(o, o + n) for o, n in zip(b["offsets"], b["shape"]))
            assert torch.equal(torch.tensor(b["values"]).reshape(b["shape"]), saved[k][idx]), (mesh, k)
    # Training continues on the new mesh with the same losses up to float reassociation.
    expected = runs["2x2"][0]["full"][3:]
    got = runs[mesh][0]["losses"]
    assert max(abs(a - b) / abs(b) for a, b in zip(got, expected)) < 1e-5, (got, expected)


def test_export_full_state_dict(runs, tmp_path):
    saved = _assemble([r["saved"] for r in runs["2x2"]])
    out = export_full_state_dict(runs["2x2"][0]["path"], tmp_path / "full.pt")
    full = torch.load(out, weights_only=True)
    assert set(full) == {k.removeprefix("model/") for k in saved if k.startswith("model/")}
    for k, t in full.items():
        assert torch.equal(t, saved[f"model/{k}"]), k


def test_crash_during_save_keeps_previous(runs):
    r = runs["2x2"][0]
    assert r["crashed"] and r["after_crash"] == r["path"] and r["reload_equal"]
    root = Path(runs["run_dir"]) / "checkpoints"
    assert [p.name for p in list_checkpoints(runs["run_dir"])] == ["step_000000003"]
    assert (root / "step_000000006.tmp").is_dir()  # left by the crash, ignored, removed by the next save


def test_keep_last_and_stale_tmp(tmp_path):
    mesh = DomainMesh(MeshShape())
    domain, model, opt = _build(mesh)
    (tmp_path / "checkpoints" / "step_000000009.tmp").mkdir(parents=True)  # a killed save
    for s in range(1, 5):
        _step(domain, model, opt, s)
        save_checkpoint(SaveRequest(tmp_path, s, model, opt, mesh, keep_last=2))
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["latest", "step_000000003", "step_000000004"], names
    assert latest_checkpoint(tmp_path).name == "step_000000004"
    # A stale pointer (e.g. to a deleted folder) falls back to the newest complete checkpoint.
    (tmp_path / "checkpoints" / "latest").write_text("step_000000099\n")
    assert latest_checkpoint(tmp_path).name == "step_000000004"
    assert latest_checkpoint(tmp_path / "nothing") is None


def test_errors(tmp_path):
    mesh = DomainMesh(MeshShape())
    domain, model, opt = _build(mesh)
    _step(domain, model, opt, 0)
    path = save_checkpoint(SaveRequest(tmp_path, 1, model, opt, mesh))
    # Different global shapes → names the tensor, both shapes and the fix.
    _, other, other_opt = _build(mesh, width=20)
    with pytest.raises(ValueError, match=r"model/inp.weight has global shape \(5, 18\).*\(5, 20\)"):
        load_checkpoint(path, other, other_opt, mesh)
    # Missing meta.json → FileNotFoundError naming the file.
    with pytest.raises(FileNotFoundError, match=r"meta\.json"):
        load_checkpoint(tmp_path / "checkpoints" / "step_000000002", model, opt, mesh)
    # Corrupted / missing data file → names the checkpoint and says what to do.
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    data = next(bad.glob("*.distcp"))
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"cannot read checkpoint .*bad.*delete"):
        load_checkpoint(bad, model, opt, mesh)
    data.unlink()
    with pytest.raises(ValueError, match=r"cannot read checkpoint .*bad"):
        load_checkpoint(bad, model, opt, mesh)
    # meta.json from elsewhere
    (bad / "meta.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="format"):
        load_checkpoint(bad, model, opt, mesh)


def test_metadata_unpickler_refuses_foreign_objects(tmp_path):
    import pickle

    from jigsaw_earth.checkpoint.planner import safe_load_metadata

    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        safe_load_metadata(pickle.dumps(shutil.rmtree))
