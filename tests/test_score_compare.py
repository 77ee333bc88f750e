"""``score --against``, ``--method`` and the statistics files, end to end on small stores of 730 inits."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from jigsaw_earth.cli import main
from jigsaw_earth.metrics.statistics import Statistics

N_INITS = 730  # a year of inits 12 h apart
PHI = (
    0.69  # the error's lag-1 autocorrelation at each point: its MSE's is PHI² ≈ 0.48, the demo's t2m at 24 h
)
LAT = -84.375 + 11.25 * np.arange(16)
LON = 11.25 * np.arange(32)


def _write(ds: xr.Dataset, path: Path) -> Path:
    ds.to_zarr(path, mode="w")
    return path


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Truth, a forecast whose error is AR(1) in init time, the same forecast with its error scaled by
    1.01, and a forecast of other inits."""
    tmp = tmp_path_factory.mktemp("compare")
    rng = np.random.default_rng(0)
    times = pd.date_range("2020-01-01", periods=N_INITS + 2, freq="12h").values
    grid = {"latitude": LAT, "longitude": LON}
    field = 280 + 5 * rng.standard_normal((times.size, LAT.size, LON.size))
    truth = xr.Dataset(
        {"2m_temperature": (("time", "latitude", "longitude"), field)}, coords={"time": times, **grid}
    )
    error = np.zeros((N_INITS, LAT.size, LON.size))
    error[0] = rng.standard_normal(error.shape[1:])
    for t in range(1, N_INITS):
        error[t] = PHI * error[t - 1] + np.sqrt(1 - PHI**2) * rng.standard_normal(error.shape[1:])
    valid = field[2:][:, None]  # the truth 24 h after each init

    def forecast(scale: float, inits: slice = slice(None)) -> xr.Dataset:
        values = (valid + scale * error[:, None])[inits]
        coords = {"time": times[:N_INITS][inits], "prediction_timedelta": pd.to_timedelta([24], "h").values}
        dims = ("time", "prediction_timedelta", "latitude", "longitude")
        return xr.Dataset({"2m_temperature": (dims, values)}, coords={**coords, **grid})

    return {
        "truth": _write(truth, tmp / "truth.zarr"),
        "fc": _write(forecast(1.0), tmp / "fc.zarr"),
        "copy": _write(forecast(1.0), tmp / "copy.zarr"),
        "scaled": _write(forecast(1.01), tmp / "scaled.zarr"),
        "first": _write(forecast(1.0, slice(0, 100)), tmp / "first.zarr"),
        "later": _write(forecast(1.0, slice(200, 300)), tmp / "later.zarr"),
    }


def _score(argv: list, capsys) -> tuple[int, dict, str]:
    """Exit code, the written PREFIX.json (``--out PREFIX``) and what was printed."""
    code = main(["score", *map(str, argv)])
    captured = capsys.readouterr()
    prefix = Path(argv[argv.index("--out") + 1])
    data = json.loads(prefix.with_name(prefix.name + ".json").read_text()) if code == 0 else {}
    return code, data, captured.out + captured.err


def _rmse_against(data: dict, against: str) -> dict:
    (row,) = [r for r in data["comparisons"] if r["against"] == against and r["metric"] == "rmse"]
    return row


def test_an_error_scaled_by_1_01_is_significant_by_ar2(
    stores: dict[str, Path], tmp_path: Path, capsys
) -> None:
    code, data, text = _score([stores["fc"], "--truth", stores["truth"], "--against", stores["scaled"],
                               "--out", tmp_path / "s"], capsys)  # fmt: skip
    assert code == 0, text
    se = Statistics.read(tmp_path / "s-stats.nc").series("forecast")["se"][:, 0, 0, 0]
    d = se - se.mean()
    assert abs((d[:-1] * d[1:]).sum() / (d * d).sum() - PHI**2) < 0.1, (
        "the MSE's autocorrelation is the demo's"
    )
    row = _rmse_against(data, "scaled")
    assert data["interval"] == {"method": "ar2", "confidence": 0.95, "inits": N_INITS, "correction": "holm"}
    assert row["relative"] == pytest.approx(1 / 1.01 - 1, rel=1e-9)
    assert row["upper"] < 0 and row["significant"] and row["better"] and row["p_adjusted"] < 0.05, row
    assert "forecast against scaled" in text


def test_a_forecast_against_itself_or_a_copy(stores: dict[str, Path], tmp_path: Path, capsys) -> None:
    for other in ("fc", "copy"):
        code, data, text = _score([stores["fc"], "--truth", stores["truth"], "--against", stores[other],
                                   "--out", tmp_path / other], capsys)  # fmt: skip
        assert code == 0, text
        row = _rmse_against(data, other)
        assert row["value"] == 0 and row["p_value"] == 1 and not row["significant"], row


def test_statistics_rescore_join_and_compare(stores: dict[str, Path], tmp_path: Path, capsys) -> None:
    """A statistics file is scored with another method as its store is; campaigns join; --against
    takes a statistics file; stores sharing no init are refused."""
    truth = ["--truth", stores["truth"]]
    assert _score([stores["fc"], *truth, "--method", "ewc", "--out", tmp_path / "store"], capsys)[0] == 0
    assert _score([stores["fc"], *truth, "--out", tmp_path / "all"], capsys)[0] == 0
    code, again, text = _score(
        [tmp_path / "all-stats.nc", "--method", "ewc", "--out", tmp_path / "again"], capsys
    )
    assert code == 0, text
    direct = json.loads((tmp_path / "store.json").read_text())
    assert again["scores"] == direct["scores"] and again["interval"]["method"] == "ewc"
    for part, (start, end) in {"a": ("2020-01-01", "2020-06-30T12"), "b": ("2020-07-01", None)}.items():
        argv = [
            stores["fc"],
            *truth,
            "--start",
            start,
            *(["--end", end] if end else []),
            "--out",
            tmp_path / part,
        ]
        assert _score(argv, capsys)[0] == 0
    code, joined, text = _score(
        [tmp_path / "b-stats.nc", tmp_path / "a-stats.nc", "--out", tmp_path / "j"], capsys
    )
    assert code == 0, text
    for mine, whole in zip(joined["scores"], json.loads((tmp_path / "all.json").read_text())["scores"]):
        assert mine["value"] == pytest.approx(whole["value"], rel=1e-12), (mine, whole)
    code, _, text = _score(
        [tmp_path / "a-stats.nc", tmp_path / "all-stats.nc", "--out", tmp_path / "x"], capsys
    )
    assert code == 2 and "would count twice" in text, text
    argv = [stores["fc"], *truth, "--against", tmp_path / "all-stats.nc", "--out", tmp_path / "k"]
    code, data, text = _score(argv, capsys)
    assert code == 0 and _rmse_against(data, "all")["p_value"] == 1, text
    argv = [tmp_path / "all-stats.nc", *truth, "--against", stores["scaled"], "--out", tmp_path / "z"]
    code, data, text = _score([*argv, "--plot", tmp_path / "png"], capsys)  # statistics against a store
    assert code == 0 and _rmse_against(data, "scaled")["significant"], text
    assert (tmp_path / "png" / "significance-scaled.png").is_file()
    code, _, text = _score([tmp_path / "all-stats.nc", *truth, "--out", tmp_path / "y"], capsys)
    assert code == 2 and "--truth applies to a forecast store" in text, text
    code, _, text = _score(
        [stores["first"], *truth, "--against", stores["later"], "--out", tmp_path / "n"], capsys
    )
    assert code == 2 and "share no init time" in text, text
