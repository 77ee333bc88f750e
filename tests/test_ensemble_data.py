"""``data synth --stochastic SIGMA``: an unpredictable red-noise stream an ensemble can learn."""

from __future__ import annotations

import numpy as np
import pytest
from jigsaw_earth.data.dynamics import Dynamics

from jigsaw_earth.cli import main

TIMES = (np.datetime64("2020-01-01T00", "h") + 6 * np.arange(400)).astype("datetime64[ns]")
LEVELS = np.array([500, 850])


def _z500(dyn: Dynamics) -> np.ndarray:
    return dyn.fields(TIMES, LEVELS, ["geopotential"])["geopotential"][:, 0].astype(np.float64)


def test_off_is_the_default_and_on_adds_red_noise_of_the_given_amplitude() -> None:
    base = _z500(Dynamics(16, 32, seed=2))
    assert np.array_equal(base, _z500(Dynamics(16, 32, seed=2, stochastic=0.0)))
    extra = _z500(Dynamics(16, 32, seed=2, stochastic=1.5)) - base  # 1.5 x 200 x the stream (f = 1 at 500)
    assert 0.8 * 300 < extra.std() < 1.2 * 300
    # 6-hourly correlation 0.9: after 4 steps (24 h) about 0.9^4 = 0.66 of it is left to persist
    flat = extra.reshape(len(TIMES), -1)
    lag4 = np.mean([np.corrcoef(flat[:-4, k], flat[4:, k])[0, 1] for k in range(flat.shape[1])])
    assert 0.5 < lag4 < 0.8
    with pytest.raises(ValueError, match="use a number >= 0"):
        Dynamics(8, 16, stochastic=-1.0)


def test_cli_writes_and_refuses(tmp_path, capsys) -> None:
    import zarr

    out = tmp_path / "s.zarr"
    argv = [
        "data",
        "synth",
        "--out",
        str(out),
        "--grid",
        "8x16",
        "--start",
        "2020-01-01",
        "--end",
        "2020-01-03",
    ]
    assert main([*argv, "--stochastic", "0.5", "--no-climatology"]) == 0
    attrs = dict(zarr.open_group(str(out), mode="r").attrs)
    assert any(isinstance(v, dict) and v.get("stochastic") == 0.5 for v in attrs.values())
    assert main([*argv, "--stochastic", "-1", "--overwrite"]) != 0
    assert "--stochastic -1.0: use an amplitude >= 0" in capsys.readouterr().err
