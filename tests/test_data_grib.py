"""GRIB 2 as centres publish it, into ``data prepare``: IFS-open-data-like and GFS-like files written with
ecCodes from the demo grid's synthetic fields (``grib_helpers``) become the same store as the fields
themselves, to GRIB's packing precision; what a selection lacks is named with the message keys found;
nothing is written beside the user's files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from jigsaw_earth.data.prepare import prepare_store
from jigsaw_earth.data.synth import SynthConfig, synth_store

from .grib_helpers import packing_error, write_centre_file

pytest.importorskip("eccodes", reason="GRIB needs the grib extra: pip install -e '.[grib]'")

LEVELS = [500, 850]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> xr.Dataset:
    root = tmp_path_factory.mktemp("grib")
    synth_store(root / "data.zarr", SynthConfig(start="2020-01-01", end="2020-01-01T18"))  # the demo's grid
    return xr.open_zarr(root / "data.zarr")


def _assert_fields_equal(prepared: Path, store: xr.Dataset, times: np.ndarray) -> None:
    got = xr.open_zarr(prepared)
    assert np.array_equal(got["latitude"], store["latitude"]) and np.array_equal(
        got["longitude"], store["longitude"]
    )
    assert np.array_equal(got["time"].values, times)
    names = sorted(v for v in store.data_vars if v not in ("land_sea_mask", "geopotential_at_surface"))
    assert sorted(got.data_vars) == names
    for name in names:
        want = store[name].sel(time=times)
        if "level" in want.dims:
            assert got["level"].values.tolist() == LEVELS
            want = want.sel(level=LEVELS)
        want, have = want.values, got[name].values
        for index in np.ndindex(want.shape[:-2]):  # each message: within its own packing bound
            error = float(np.abs(have[index] - want[index]).max())
            assert error <= packing_error(want[index]), (name, index, error)


@pytest.mark.parametrize("style", ["ifs", "gfs"])
def test_centre_grib_prepares_to_the_same_fields(store: xr.Dataset, tmp_path: Path, style: str) -> None:
    """IFS open data's layout (z, msl, 0…360, north first) and GFS's (gh, prmsl, −180…180, south first)."""
    folder = tmp_path / "user"
    folder.mkdir()
    times = store["time"].values[:2]
    source = write_centre_file(folder / f"{style}.grib2", store, times, LEVELS, style)
    prepare_store(source, tmp_path / "out.zarr", progress=False)
    _assert_fields_equal(tmp_path / "out.zarr", store, times)
    assert sorted(p.name for p in folder.iterdir()) == [source.name], "no .idx or other file beside the data"


def test_files_split_by_time_and_level_type_make_one_store(store: xr.Dataset, tmp_path: Path) -> None:
    """A folder as a download may split it: levels and surface, and each time, in files of their own."""
    folder = tmp_path / "download"
    folder.mkdir()
    times = store["time"].values[:3]
    upper = store[["geopotential", "temperature", "u_component_of_wind", "v_component_of_wind",
                   "specific_humidity"]]  # fmt: skip
    surface = store[["2m_temperature", "10m_u_component_of_wind", "10m_v_component_of_wind",
                     "mean_sea_level_pressure"]]  # fmt: skip
    for k, t in enumerate(times):
        write_centre_file(folder / f"pl_{k}.grib2", upper, [t], LEVELS)
        write_centre_file(folder / f"sfc_{k}.grb2", surface, [t], LEVELS)
    prepare_store(folder, tmp_path / "out.zarr", progress=False)
    _assert_fields_equal(tmp_path / "out.zarr", store, times)
    assert not list(folder.glob("*.idx"))


def test_a_missing_level_is_refused_naming_it_and_the_keys_found(store: xr.Dataset, tmp_path: Path) -> None:
    source = write_centre_file(tmp_path / "gfs.grib2", store, store["time"].values[:2], LEVELS, "gfs",
                               skip=(("t", 850),))  # fmt: skip
    out = tmp_path / "out.zarr"
    with pytest.raises(ValueError) as err:
        prepare_store(source, out, progress=False)
    text = str(err.value)
    assert "lacks temperature (t isobaricInhPa) level 850 hPa" in text, text
    assert "t isobaricInhPa 500;" in text and "gh isobaricInhPa 500,850" in text, text  # the keys found
    assert "prmsl meanSea 0" in text and "Choose --levels among [500]" in text, text
    assert not out.exists() and not list(tmp_path.glob("out.zarr*"))
    prepare_store(source, out, levels=[500], progress=False)  # the fix it names
    assert xr.open_zarr(out)["temperature"].sizes["level"] == 1


def test_a_missing_variable_or_time_is_refused_with_the_keys_found(store: xr.Dataset, tmp_path: Path) -> None:
    times = store["time"].values[:2]
    source = write_centre_file(tmp_path / "ifs.grib2", store, times, LEVELS, skip=(("msl", None),))
    with pytest.raises(ValueError, match=r"variable 'mean_sea_level_pressure' .* is not in store .*2t "
                       r"heightAboveGround 2; 10u"):  # fmt: skip
        prepare_store(source, tmp_path / "a.zarr", surface=["mean_sea_level_pressure"], progress=False)
    folder = tmp_path / "two"
    folder.mkdir()
    write_centre_file(folder / "a.grib2", store, times[:1], LEVELS)
    write_centre_file(folder / "b.grib2", store[["temperature"]], times[1:], LEVELS)
    lacking = (
        r"lacks geopotential \(z isobaricInhPa\) level 500 hPa at 1 of 2 times \(first at 2020-01-01T06:00\)"
    )
    with pytest.raises(ValueError, match=lacking):
        prepare_store(folder, tmp_path / "b.zarr", progress=False)


def test_fields_on_two_grids_are_refused_naming_them(store: xr.Dataset, tmp_path: Path) -> None:
    folder = tmp_path / "mixed"
    folder.mkdir()
    times = store["time"].values[:2]
    write_centre_file(folder / "a.grib2", store[["temperature"]], times, LEVELS)
    coarse = store[["2m_temperature"]].isel(latitude=slice(0, None, 2), longitude=slice(0, None, 2))
    write_centre_file(folder / "b.grib2", coarse, times, LEVELS)
    with pytest.raises(ValueError, match=r"on 2 grids: .*2t on regular_ll 16x32"):
        prepare_store(folder, tmp_path / "c.zarr", progress=False)
