"""The one table of variables (``data/variables.py``): every entry complete and consistent (its GRIB keys
checked against ecCodes), and a variable added to it at run time reaching every reader: the naming
table, a store's variables, scoring's renames, units and CF attributes, the headline levels and the
maps' colours of the pictures, and a GRIB message written and read back (the validation tables' short
names and the planner's headline fields are checked to be the table's)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from jigsaw_earth.data.variables import LEVEL_TYPES, VARIABLES, headline_channels


def test_every_entry_is_complete() -> None:
    import matplotlib

    names = [v.name for v in VARIABLES]
    assert len(set(names)) == len(names), Counter(names).most_common(3)
    for v in VARIABLES:
        assert v.level in LEVEL_TYPES, v
        assert all((v.short, v.units, v.standard_name, v.long_name)), v
        assert (v.grib_param is None) == (v.packing_bound is None), f"{v.name}: GRIB parameter, bound"
        assert v.grib_param is None or v.grib_name, f"{v.name}: written to GRIB, so it needs its shortName"
        assert v.packing_bound is None or v.packing_bound > 0, v
        assert v.accumulation_hours is None or v.accumulation_hours > 0, v
        assert (v.headline_level is not None) == (v.headline and v.upper_air), f"{v.name}: headline level"
        assert v.cmap in matplotlib.colormaps, f"{v.name}: no colour map {v.cmap!r}"
    # a name in a file means one variable of its kind (upper air: with a level dimension; else without)
    for upper in (True, False):
        claimed = Counter(n for v in VARIABLES if v.upper_air == upper for n in (v.name, *v.names))
        assert not [n for n, k in claimed.items() if k > 1], claimed.most_common(3)


def test_the_grib_keys_are_what_eccodes_says() -> None:
    """Each paramId gives the entry's shortName, on pressure levels exactly for the upper-air entries."""
    ec = pytest.importorskip("eccodes")
    for v in (v for v in VARIABLES if v.grib_param is not None):
        h = ec.codes_grib_new_from_samples("regular_ll_pl_grib2" if v.upper_air else "regular_ll_sfc_grib2")
        try:
            ec.codes_set(h, "paramId", v.grib_param)
            short, level = ec.codes_get(h, "shortName"), ec.codes_get(h, "typeOfLevel")
        finally:
            ec.codes_release(h)
        assert short == v.grib_name, (v.name, v.grib_param, short)
        assert (level == "isobaricInhPa") == v.upper_air, (v.name, level)


def test_the_short_names_and_headline_fields_are_the_tables() -> None:
    """The validation tables' short names and ``plan --evaluate``'s headline fields are made from the
    table, nothing else (the trainer's and the planner's modules are too slow to import for the test
    below)."""
    from jigsaw_earth.models.plan_eval import HEADLINE

    from jigsaw_earth.training.evaluate import SHORT_NAMES, short_name

    assert {v.name: v.short for v in VARIABLES} == SHORT_NAMES
    assert short_name("geopotential@500") == "z500" and short_name("2m_temperature") == "t2m"
    assert headline_channels() == HEADLINE and len(HEADLINE) == 9 and "specific_humidity@700" in HEADLINE


ADDED = """
import json, sys
import numpy as np
import xarray as xr
import jigsaw_earth.data.variables as table

rh = table.Variable("relative_humidity", "r", "pressure", "%", "relative_humidity", "Relative humidity",
                    aliases=("hur",), grib_name="r", grib_param=157, packing_bound=0.01, headline=True,
                    headline_level=850, cmap="Blues")
table.VARIABLES = (*table.VARIABLES, rh)  # the one edit

from jigsaw_earth.data.grib import GribMessages
from jigsaw_earth.data.store import ALIASES, UPPER_AIR_VARIABLES, StoreView, canonical_dataset
from jigsaw_earth.inference.write_grib import PACKING_BOUND, GribField, check_grib, encode
from jigsaw_earth.metrics.evaluate import normalise
from jigsaw_earth.metrics.plots import CMAPS, HEADLINE_LEVELS
from jigsaw_earth.metrics.units import CF_ATTRS, unit_of

lat, lon = np.linspace(60.0, -60.0, 5), np.arange(0.0, 360.0, 45.0)
values = np.random.default_rng(0).uniform(0, 100, (1, 2, 5, 8)).astype(np.float32)
ds = xr.Dataset({"hur": (("time", "level", "latitude", "longitude"), values)},
                coords={"time": np.array(["2020-01-01T00"], "datetime64[ns]"), "level": [500, 850],
                        "latitude": lat, "longitude": lon})
view = StoreView.from_dataset(ds, "memory")
path = sys.argv[1]
field = GribField("relative_humidity", 850, np.datetime64("2020-01-01T00"), 6)
check_grib(["relative_humidity"], lat, lon)
with open(path, "wb") as f:
    f.write(encode(field, values[0, 1], lat, lon))
back = GribMessages([path]).dataset()
print(json.dumps({
    "upper_air": "relative_humidity" in UPPER_AIR_VARIABLES,
    "aliases": ALIASES["relative_humidity"],
    "store": view.known_variables()[0],
    "canonical": sorted(canonical_dataset(ds, "memory").data_vars),
    "scored": sorted(normalise(ds.rename(hur="r")).data_vars),
    "units": unit_of("relative_humidity"),
    "cf": CF_ATTRS["relative_humidity"],
    "headline": HEADLINE_LEVELS["relative_humidity"],
    "cmap": CMAPS["relative_humidity"],
    "grib": sorted(back.data_vars),
    "grib_error": float(np.abs(back["relative_humidity"].values[0, 0] - values[0, 1]).max()),
    "bound": PACKING_BOUND["relative_humidity"],
}))
"""


def test_a_variable_added_to_the_table_reaches_every_reader(tmp_path: Path) -> None:
    """One entry appended to the table (before anything reads it, in a process of its own) is known
    everywhere a variable is: nothing else to edit."""
    pytest.importorskip("eccodes")
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(ADDED), str(tmp_path / "rh.grib2")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["upper_air"] and got["aliases"] == ["r", "hur"], got
    assert got["store"] == ["relative_humidity"] and got["canonical"] == ["relative_humidity"], got
    assert got["scored"] == ["relative_humidity"], got
    assert got["units"] == "%" and got["cf"]["standard_name"] == "relative_humidity", got
    assert got["headline"] == 850 and got["cmap"] == "Blues", got
    assert got["grib"] == ["relative_humidity"] and got["grib_error"] <= got["bound"], got
