"""The device guard: the real commands on an accelerator that is not the CPU, without a GPU.

``tests/fakegpu/`` gives a CPU-only torch a device ``fakegpu`` that refuses what CUDA refuses
(tensors of two devices in one operator). Each case runs in its own process (the fake device is
registered process-wide). ``selftest --device fakegpu`` trains with validation and checkpoints,
resumes on the CPU, and runs ``predict --score`` there and on the CPU: a tensor made on the CPU in
any of those paths fails it, as it would on a GPU (the two crashes of the first GPU run included).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jigsaw_earth import device

ROOT = Path(__file__).resolve().parents[1]
# the package ``tests.fakegpu`` importable from any working folder
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd, capture_output=True, text=True, timeout=600, env=ENV,
    )  # fmt: skip


PLUGIN = """
ACTIVATED = []


def activate():
    ACTIVATED.append(1)
"""


@pytest.mark.parametrize("form", ["module", "file", "folder"])
def test_a_device_plugin_by_module_file_or_folder(form: str, tmp_path: Path, monkeypatch) -> None:
    """``JIGSAW_DEVICE_PLUGIN`` names a module, a ``.py`` file or a package's folder (relative imports
    inside it work); it is activated once however often ranks ask; a name that loads nothing is refused."""
    package = tmp_path / f"plugin_{form}"
    package.mkdir()
    (package / f"{package.name}_hook.py").write_text(PLUGIN)
    (package / "__init__.py").write_text(f"from .{package.name}_hook import ACTIVATED, activate\n")
    spec, name = {
        "module": (package.name, package.name),
        "file": (str(package / f"{package.name}_hook.py"), f"{package.name}_hook"),
        "folder": (str(package), package.name),
    }[form]
    monkeypatch.syspath_prepend(str(tmp_path))  # the module form imports it by its name
    monkeypatch.setattr(device, "_plugins", set())
    monkeypatch.setenv(device.PLUGIN_ENV, spec)
    device.load_device_plugin()
    device.load_device_plugin()
    assert sys.modules.pop(name).ACTIVATED == [1]
    monkeypatch.setenv(device.PLUGIN_ENV, str(tmp_path / "absent"))
    with pytest.raises(ValueError, match=r"cannot activate it.*a package's folder that defines activate"):
        device.load_device_plugin()


def test_selftest_runs_every_command_on_an_accelerator(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "tests.fakegpu", "selftest", "--device", "fakegpu", "--workdir",
         str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=900, env=ENV,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    assert "PASS: fakegpu (mesh 1x1" in run.stdout
    rows = [line for line in run.stdout.splitlines() if line.endswith(("PASS", "FAIL"))]
    assert len(rows) == 5 and all(r.endswith("PASS") for r in rows), run.stdout


def test_the_guard_refuses_what_cuda_refuses(tmp_path: Path) -> None:
    run = _python(
        """
        import sys, torch
        from tests.fakegpu import DeviceMixing, fake_gpu
        with fake_gpu() as mode:
            x = torch.randn(3, 4).to("fakegpu")
            w = torch.nn.Linear(4, 2).to("fakegpu")
            cases = {
                "cpu scalar absorbs a device sum": lambda: torch.zeros((), dtype=torch.float64).add_(x.sum()),
                "cpu input to a device layer": lambda: w(torch.randn(3, 4)),
                "cpu matrix with a device matrix": lambda: torch.cat([x, torch.randn(3, 4)]),
            }
            for name, case in cases.items():
                try:
                    case()
                except DeviceMixing:
                    continue
                sys.exit(f"not refused: {name}")
            # what CUDA allows: a cpu scalar read by a device operator, copies, cpu index tensors
            y = x * torch.tensor(2.0) + x[torch.tensor([0, 2])].sum()
            assert y.device.type == "fakegpu" and x.cpu().device.type == "cpu"
            float(y.sum())
            assert len(mode.host_reads) == 1
            try:
                x.numpy()
            except (TypeError, RuntimeError):
                pass
            else:
                sys.exit(".numpy() of a device tensor was allowed")
        print("ok")
        """,
        tmp_path,
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr[-4000:]


def test_a_training_step_reads_the_host_once(tmp_path: Path) -> None:
    """Loss and gradient norm come to the host together, once per step (the NaN policy needs them);
    nothing else in a step waits for the device."""
    run = _python(
        f"""
        import sys
        from pathlib import Path
        from tests.fakegpu import fake_gpu
        from jigsaw_earth.config import parse_config
        from jigsaw_earth.selftest import tiny_config, tiny_store
        from jigsaw_earth.training.loop import Trainer
        from jigsaw_earth.mesh_setup import setup_mesh

        root = Path({str(tmp_path)!r})
        tiny_store(root / "data.zarr")
        with fake_gpu() as mode:
            cfg = parse_config(tiny_config(root, "run", "fakegpu", 1))
            trainer = Trainer(cfg, setup_mesh(cfg))
            trainer.train_step(1)
            before = len(mode.host_reads)
            for step in (2, 3, 4):
                trainer.train_step(step)
            reads = len(mode.host_reads) - before
        print("reads", reads)
        if reads > 3:
            places = "\\n----\\n".join(mode.host_reads[before:])
            sys.exit(f"host reads in 3 steps: {{reads}}\\n{{places}}")
        """,
        tmp_path,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-6000:]


def test_a_fine_tune_runs_on_an_accelerator(tmp_path: Path) -> None:
    """``training.init_from`` with a variable added and the blocks frozen: the parent's weights are
    read into device tensors (the new channels' entries zeroed there) and the fine-tune trains and
    validates on the device."""
    run = _python(
        f"""
        import sys
        from pathlib import Path
        from tests.fakegpu import fake_gpu
        from jigsaw_earth.config import parse_config
        from jigsaw_earth.data.synth import SynthConfig, synth_store
        from jigsaw_earth.selftest import tiny_config
        from jigsaw_earth.training.loop import Trainer
        from jigsaw_earth.mesh_setup import setup_mesh

        root = Path({str(tmp_path)!r})
        fields = dict(levels=(500, 850), upper_air=("geopotential", "temperature"),
                      surface=("2m_temperature", "mean_sea_level_pressure"))
        days = dict(start="2020-01-01", end="2020-01-16")
        synth_store(root / "data.zarr", SynthConfig(n_lat=12, n_lon=24, **days, **fields))
        with fake_gpu():
            raw = tiny_config(root, "parent", "fakegpu", 1)
            raw["training"]["steps"], raw["checkpoint"]["every"] = 2, 0
            Trainer(parse_config(raw), setup_mesh(parse_config(raw))).fit()
            raw = tiny_config(root, "child", "fakegpu", 1)
            raw["data"]["surface"] = ["2m_temperature", "mean_sea_level_pressure"]
            raw["training"].update(steps=2, init_from=str(root / "parent"), freeze=["blocks"])
            raw["checkpoint"]["every"] = 0
            cfg = parse_config(raw)
            trainer = Trainer(cfg, setup_mesh(cfg))
            assert trainer.lineage["added"] == ["mean_sea_level_pressure"], trainer.lineage
            assert next(trainer.model.parameters()).device.type == "fakegpu"
            trainer.fit()
        print("ok")
        """,
        tmp_path,
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout[-2000:] + run.stderr[-6000:]
