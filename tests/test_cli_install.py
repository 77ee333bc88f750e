"""``python -m jigsaw_earth`` from a checkout that is not the installed one: one line saying what to run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

MAIN = Path(__file__).resolve().parents[1] / "jigsaw_earth" / "__main__.py"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A checkout's layout: jigsaw_earth/ with the real __main__.py, models/ and data/ beside it."""
    (tmp_path / "jigsaw_earth").mkdir()
    (tmp_path / "jigsaw_earth" / "__init__.py").write_text("")
    shutil.copy(MAIN, tmp_path / "jigsaw_earth" / "__main__.py")
    for sub in ("models", "data"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "__init__.py").write_text("")
    return tmp_path


def _run(cwd: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *flags, "-m", "jigsaw_earth", "--help"], cwd=cwd, capture_output=True, text=True
    )


def test_a_checkout_without_install_says_to_install(checkout):
    out = _run(checkout, "-S")  # no site-packages: nothing is installed
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "jigsaw_earth.models is not installed" in lines[0]
    assert f"run `pip install -e .` in {checkout.resolve()}" in lines[0]


def test_another_installed_checkout_is_named(checkout):
    out = _run(checkout)  # this environment's install is the repository under test, not `checkout`
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "jigsaw_earth.models is installed from" in lines[0]
    assert f"{checkout.resolve() / 'jigsaw_earth'}" in lines[0]
