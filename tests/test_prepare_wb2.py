"""``data prepare`` on stores written the way WeatherBench 2 publishes ERA5: Zarr v2, numcodecs
compressors (xarray's default Blosc, or Zstd), consolidated metadata, latitude ascending; read
locally and through an fsspec URL, written with jigsaw-earth's own codecs, and trained on."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml
from jigsaw_earth.data.prepare import prepare_store

from jigsaw_earth.cli import main

from .train_helpers import TINY_YAML, merge_sections


def wb2_dataset() -> xr.Dataset:
    """16 × 32 grid, ascending latitude (WB2's 1.5° and 0.25° stores), two levels, 6-hourly."""
    t = pd.date_range("2020-01-01", "2020-02-12T18", freq="6h")
    lat, lon = np.linspace(-90, 90, 16), np.arange(32) * 11.25
    rng = np.random.default_rng(0)

    def field(*shape: int, mean: float, scale: float) -> np.ndarray:
        return (mean + scale * rng.standard_normal((len(t), *shape, 16, 32))).astype(np.float32)

    dims4, dims3 = ("time", "level", "latitude", "longitude"), ("time", "latitude", "longitude")
    return xr.Dataset(
        {
            "geopotential": (dims4, field(2, mean=5.0e4, scale=300.0)),
            "temperature": (dims4, field(2, mean=260.0, scale=5.0)),
            "2m_temperature": (dims3, field(mean=280.0, scale=5.0)),
            # WB2's static fields have no time dimension
            "land_sea_mask": (dims3[1:], (rng.random((16, 32)) > 0.6).astype(np.float32)),
            "geopotential_at_surface": (dims3[1:], (3000 * rng.random((16, 32))).astype(np.float32)),
        },
        coords={"time": t, "latitude": lat, "longitude": lon, "level": np.array([500, 850])},
    )


def write_wb2(ds: xr.Dataset, where: str, compressor: str) -> str:
    """``to_zarr(zarr_format=2)`` with xarray's default compression (Blosc), or numcodecs Zstd."""
    encoding = None
    if compressor == "zstd":
        from numcodecs import Zstd

        encoding = {v: {"compressors": Zstd(level=3)} for v in ds.data_vars}
    local = where.removeprefix("file://")  # fsspec's local writer makes no folders: write it as a path
    ds.to_zarr(local, zarr_format=2, mode="w", consolidated=True, encoding=encoding)
    return where


@pytest.fixture(scope="module")
def source() -> xr.Dataset:
    return wb2_dataset()


@pytest.mark.parametrize("compressor", ["blosc", "zstd"])
@pytest.mark.parametrize("where", ["local", "memory", "file-url"])
def test_prepare_reads_wb2_v2_stores(source: xr.Dataset, tmp_path: Path, where: str, compressor: str) -> None:
    path = {"local": str(tmp_path / "wb2.zarr"), "memory": f"memory://wb2-{compressor}/era5.zarr",
            "file-url": f"file://{tmp_path / 'wb2.zarr'}"}[where]  # fmt: skip
    write_wb2(source, path, compressor)
    if where != "memory":
        meta = json.loads((tmp_path / "wb2.zarr" / "temperature" / ".zarray").read_text())
        assert meta["zarr_format"] == 2 and meta["compressor"]["id"] == compressor
        assert (tmp_path / "wb2.zarr" / ".zmetadata").is_file()
    out = tmp_path / "train.zarr"
    prepare_store(path, out, progress=False)
    got = xr.open_zarr(out)
    np.testing.assert_array_equal(got["temperature"].values, source["temperature"].values[:, :, ::-1])
    np.testing.assert_array_equal(got["2m_temperature"].values, source["2m_temperature"].values[:, ::-1])
    meta = json.loads((out / "temperature" / "zarr.json").read_text())
    assert meta["zarr_format"] == 3
    codecs = json.dumps(meta["codecs"])
    assert "blosc" not in codecs.lower() and "numcodecs" not in codecs, codecs  # ours, not the source's


def test_out_inside_the_source_is_refused(source: xr.Dataset, tmp_path: Path, capsys) -> None:
    src = Path(write_wb2(source, str(tmp_path / "wb2.zarr"), "blosc"))
    before = sorted(str(p.relative_to(src)) for p in src.rglob("*"))
    for out in (src / "train.zarr", src, tmp_path):
        code = main(["data", "prepare", str(src), "--out", str(out), "--no-progress", "--overwrite"])
        err = capsys.readouterr().err
        assert code == 2 and "source of the prepare" in err and "nothing was written or deleted" in err, err
    assert sorted(str(p.relative_to(src)) for p in src.rglob("*")) == before


def test_training_runs_on_a_prepared_wb2_store(source: xr.Dataset, tmp_path: Path, capsys) -> None:
    src = write_wb2(source, f"file://{tmp_path / 'wb2.zarr'}", "blosc")
    store = tmp_path / "train.zarr"
    assert main(["data", "prepare", src, "--out", str(store), "--no-progress"]) == 0, capsys.readouterr().err
    raw = merge_sections(TINY_YAML, {"training": {"steps": 2}, "checkpoint": {"every": 2}})
    raw["run"]["dir"], raw["data"]["store"] = str(tmp_path / "run"), str(store)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    assert main(["train", str(cfg)]) == 0, capsys.readouterr().err
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if r["kind"] == "train"]
    assert len(losses) == 2 and all(np.isfinite(losses))
