"""CI smoke case of ``jigsaw-earth bench``: small sizes run, the JSON is complete, the report
renders it. No timing is asserted (only that figures exist and are positive)."""

from __future__ import annotations

import json
import math

import pytest

from jigsaw_earth.cli import main


def _bench(tmp_path, *argv: str) -> dict:
    out = tmp_path / f"{argv[0]}.json"
    assert main(["bench", *argv, "--quick", "--repeats", "2", "--json", str(out)]) == 0
    return json.loads(out.read_text())


def _check(data: dict, names: list[str], meshes: list[str]) -> None:
    assert [r["name"] for r in data["results"]] == names
    assert data["meta"]["threads"] == 1 and data["meta"]["command"].startswith("jigsaw-earth bench")
    for r in data["results"]:
        assert r["max_error"] <= 1e-4
        for key in ("ratio", "cpu_ratio"):
            assert all(math.isfinite(v) and v > 0 for v in r[key].values()), r[key]
        assert r["jigsaw_ms"] > 0 and r["twin_ms"] > 0
        assert r["memory"]["jigsaw_bytes"] > 0 and r["memory"]["ratio"] > 0
        assert sorted(r["meshes"]) == sorted(meshes)
        for m in meshes:
            fig = r["meshes"][m]
            # each rank holds half the field and half the weights: its peak is below one rank's
            assert 0 < fig["peak_fraction"] < 1, fig
            assert fig["bytes_sent_total"] > 0


@pytest.fixture(scope="module")
def layer_json(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    return tmp, _bench(tmp, "layers", "--only", "conv2d,group_norm", "--meshes", "1x2")


def test_bench_layers_smoke(layer_json):
    _check(layer_json[1], ["conv2d_zeros", "conv2d_pole", "group_norm"], ["1x2"])


def test_bench_models_smoke(tmp_path):
    _check(_bench(tmp_path, "models", "--only", "unet", "--meshes", "none"), ["unet"], [])


def test_bench_report_renders(layer_json, tmp_path):
    tmp, _ = layer_json
    out = tmp_path / "benchmarks.md"
    assert main(["bench", "report", str(tmp / "layers.json"), "--out", str(out)]) == 0
    text = out.read_text()
    assert "`conv2d_pole`" in text and "jigsaw-earth bench layers" in text and "1x2" in text


def test_bench_errors_are_clear(tmp_path, capsys):
    assert main(["bench", "layers", "--quick", "--only", "nonesuch", "--meshes", "none"]) == 2
    assert "no such case" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["bench", "report", str(bad)]) == 2
    assert "holds no bench results" in capsys.readouterr().err
    for kind, what in [("io", "store"), ("scaling", "CONFIG file"), ("forecast", "CONFIG file"),
                       ("strategies", "CONFIG file"), ("compile", "CONFIG file")]:  # fmt: skip
        assert main(["bench", kind, "a.yaml", "b.yaml"]) == 2
        assert f"bench {kind} takes one {what}, got 2: " in capsys.readouterr().err


def test_bench_models_parts_time_each_layer(tmp_path, capsys):
    data = _bench(tmp_path, "models", "--only", "weathermixer", "--meshes", "1x2", "--parts")
    parts = data["results"][0]["parts"]
    assert list(parts) == ["jigsaw", "twin", "1x2 rank 0"]
    for column in parts.values():
        fwd = column["forward"]
        assert {"embed", "blocks.*.token_mixing", "blocks.*.channel_mixing", "recover", "other"} <= set(fwd)
        assert fwd["total"] > 0 and column["backward"]["total"] > 0
        assert sum(v for k, v in fwd.items() if k != "total") == pytest.approx(fwd["total"])
    capsys.readouterr()
    assert main(["bench", "layers", "--quick", "--parts", "--meshes", "none"]) == 2
    assert "--parts times the layers of a model" in capsys.readouterr().err


def test_bench_report_renders_bench_io_runs(tmp_path):
    method = {"ms": 20.0, "x_raw": 0.62, "x_tensorstore": 0.29}
    result = {"rank": 0, "read_threads": 2, "methods": {"reader": method}}
    runs = [{"store": "rows.zarr", "mesh": "2x2", "ranks": "0", "cache": "warm", "read_threads": 2,
             "repeats": 7, "results": [result]}]  # fmt: skip
    path = tmp_path / "io.json"
    path.write_text(json.dumps(runs))
    out = tmp_path / "benchmarks.md"
    assert main(["bench", "report", str(path), "--out", str(out)]) == 0
    assert "| `rows.zarr` | 2x2 | 0 | warm | 2/2 | 7 | 0 | 20.0 | - |" in out.read_text()
