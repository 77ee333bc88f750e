"""notebooks/explore_predictions.ipynb finds the demo's stores under the repository root wherever its
kernel starts (``jupyter-execute`` from the root, Jupyter opened in notebooks/), and the ``JIGSAW_*``
environment variables still override them. Only the first code cell runs (it opens the stores);
tests/test_predict.py runs the whole notebook on a real forecast."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "explore_predictions.ipynb"
ENV = ("JIGSAW_FORECAST", "JIGSAW_TRUTH", "JIGSAW_CLIMATOLOGY", "JIGSAW_PLOTS", "JIGSAW_VARIABLE")


def _store(path: Path) -> Path:
    ds = xr.Dataset({"t2m": (("latitude", "longitude"), np.zeros((2, 3), np.float32))})
    ds.to_zarr(path, zarr_format=3, consolidated=False)
    return path


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository's layout: configs/demo.yaml, notebooks/, and the demo's stores in runs/demo/."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    root = tmp_path / "repo"
    (root / "configs").mkdir(parents=True)
    (root / "configs" / "demo.yaml").write_text("")
    (root / "notebooks").mkdir()
    (root / "runs" / "demo").mkdir(parents=True)
    for name in ("forecast.zarr", "data.zarr"):
        _store(root / "runs" / "demo" / name)
    return root


def _first_cell(cwd: Path) -> str:
    """The text the notebook's first code cell prints, run by a real kernel started in ``cwd``."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells = nb.cells[: 1 + next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")]
    nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": cwd}}
    ).execute()
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)


@pytest.mark.parametrize("start", [".", "notebooks"])
def test_the_demo_stores_are_found_from_the_root_and_from_notebooks(repo, start):
    text = _first_cell(repo / start)
    demo = repo.resolve() / "runs" / "demo"
    assert f"forecast: {demo / 'forecast.zarr'}" in text and f"truth: {demo / 'data.zarr'}" in text
    assert f"plots: {demo / 'plots'}" in text


def test_environment_variables_override_and_a_missing_store_says_what_to_run(repo, tmp_path, monkeypatch):
    other = _store(tmp_path / "elsewhere.zarr")
    monkeypatch.setenv("JIGSAW_FORECAST", str(other))
    assert f"forecast: {other}" in _first_cell(repo / "notebooks")
    monkeypatch.delenv("JIGSAW_FORECAST")
    nbclient = pytest.importorskip("nbclient")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="run the README's demo and predict"):
        _first_cell(empty)
