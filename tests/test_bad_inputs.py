"""A table of bad inputs and faults, each through the real command line (``cli.main``, in process).

Every case asserts the exit code, that the one error line names the item, the value and the fix,
that no traceback is printed, and that nothing on disk changed that should not have (the config
file, an earlier run's directory, no half-made run directory). Config cases go through
``config validate`` and, for a sample, ``train``; run-directory, checkpoint and filesystem cases
through ``train`` on a run made once per module (a 4-step tiny WeatherMixer on a 16 × 32 store).
Real signals are in ``tests/test_train_signals.py``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from jigsaw_earth.cli import main

from .train_helpers import TINY_YAML as BASE
from .train_helpers import merge_sections


def _snapshot(root: Path) -> dict[str, str]:
    """Relative path → content hash of every file under ``root`` (directories as '<dir>')."""
    if not root.exists():
        return {}
    if root.is_file():
        return {".": hashlib.sha256(root.read_bytes()).hexdigest()}
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = "<dir>" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _assert_clean_error(code: int, text: str, want_code: int, fragments: list[str]) -> None:
    assert code == want_code, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    errors = [ln for ln in text.splitlines() if ": error: " in ln]
    assert len(errors) == 1, text[-3000:]
    for frag in fragments:
        assert frag in errors[0], f"{frag!r} not in {errors[0]!r}"


# ---------------------------------------------------------------- config: (id, change, fragments)
# ``change`` is merged into BASE section by section; the fragments name the item, value and fix.
CONFIG_CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("unknown-top", {"trainig": {"steps": 3}}, ["'trainig'", "did you mean 'training'"]),
    ("unknown-run", {"run": {"dri": "x"}}, ["'run.dri'", "did you mean 'dir'"]),
    ("unknown-mesh", {"mesh": {"lom": 2}}, ["'mesh.lom'", "did you mean 'lon'"]),
    ("unknown-data", {"data": {"stor": "x"}}, ["'data.stor'", "did you mean 'store'"]),
    ("unknown-model", {"model": {"nme": "vit"}}, ["'model.nme'", "did you mean 'name'"]),
    ("unknown-optim", {"optim": {"lrr": 1e-3}}, ["'optim.lrr'", "did you mean 'lr'"]),
    ("unknown-loss", {"loss": {"tendency_scalin": True}}, ["'loss.tendency_scalin'", "tendency_scaling"]),
    ("unknown-training", {"training": {"step": 3}}, ["'training.step'", "did you mean 'steps'"]),
    ("unknown-validation", {"validation": {"evry": 3}}, ["'validation.evry'", "did you mean 'every'"]),
    ("unknown-checkpoint", {"checkpoint": {"kep": 3}}, ["'checkpoint.kep'", "did you mean 'keep'"]),
    ("unknown-logging", {"logging": {"evry": 3}}, ["'logging.evry'", "did you mean 'every'"]),
    ("unknown-wandb", {"logging": {"wandb": {"mod": "offline"}}}, ["'logging.wandb.mod'", "'mode'"]),
    ("unknown-distributed", {"distributed": {"backnd": "gloo"}}, ["'distributed.backnd'", "'backend'"]),
    ("lr-text", {"optim": {"lr": "fast"}}, ["optim.lr", "'fast'", "expected a number"]),
    ("lr-nan", {"optim": {"lr": float("nan")}}, ["optim.lr", "nan", "finite"]),
    ("lr-inf", {"optim": {"lr": float("inf")}}, ["optim.lr", "inf", "finite"]),
    ("lr-nan-text", {"optim": {"lr": "nan"}}, ["optim.lr='nan'", "expected a number"]),
    ("grad-clip-nan", {"optim": {"grad_clip": float("nan")}}, ["optim.grad_clip", "nan", "finite"]),
    ("min-lr-nan", {"optim": {"min_lr": float("nan")}}, ["optim.min_lr", "nan", "finite"]),
    ("weight-decay-inf", {"optim": {"weight_decay": float("-inf")}}, ["optim.weight_decay", "finite"]),
    ("eps-nan", {"optim": {"eps": float("nan")}}, ["optim.eps", "finite"]),
    ("betas-nan", {"optim": {"betas": [float("nan"), 0.9]}}, ["optim.betas[0]", "finite"]),
    ("timeout-nan", {"distributed": {"timeout_s": float("nan")}}, ["distributed.timeout_s", "finite"]),
    (
        "loss-weight-nan",
        {"loss": {"variable_weights": {"temperature": float("nan")}}},
        ["temperature", "finite"],
    ),
    ("lr-zero", {"optim": {"lr": 0.0}}, ["optim.lr=0.0", "positive", "> 0"]),
    ("min-lr-above-lr", {"optim": {"min_lr": 1.0}}, ["min_lr (1.0)", "<= lr"]),
    ("grad-clip-negative", {"optim": {"grad_clip": -1.0}}, ["optim.grad_clip=-1.0", ">= 0"]),
    ("betas-range", {"optim": {"betas": [0.9, 1.5]}}, ["optim.betas=[0.9, 1.5]", "[0, 1)"]),
    ("betas-three", {"optim": {"betas": [0.9, 0.95, 0.99]}}, ["optim.betas", "two numbers"]),
    ("warmup-too-long", {"optim": {"warmup_steps": 4}}, ["optim.warmup_steps=4", "training.steps=4"]),
    ("steps-float", {"training": {"steps": 1.5}}, ["training.steps", "1.5", "expected an integer"]),
    ("steps-text", {"training": {"steps": "ten"}}, ["training.steps", "'ten'", "integer"]),
    ("steps-negative", {"training": {"steps": -1}}, ["training.steps=-1", "positive"]),
    ("steps-zero", {"training": {"steps": 0}}, ["training.steps=0", "positive"]),
    ("batch-bool", {"training": {"batch_size": True}}, ["training.batch_size", "True", "integer"]),
    (
        "batch-split",
        {"training": {"batch_size": 3}, "mesh": {"data": 2}},
        ["training.batch_size=3", "mesh.data=2", "use a multiple of 2"],
    ),
    ("rollout-zero", {"training": {"rollout_steps": 0}}, ["training.rollout_steps=0", "positive"]),
    ("precision", {"training": {"precision": "fp16"}}, ["training.precision", "'fp16'", "'bf16'"]),
    ("nan-policy", {"training": {"nan_policy": "ignore"}}, ["training.nan_policy", "'ignore'", "'skip'"]),
    ("backend", {"distributed": {"backend": "mpi"}}, ["distributed.backend", "'mpi'", "'gloo'"]),
    ("wandb-mode", {"logging": {"wandb": {"mode": "cloud"}}}, ["logging.wandb.mode", "'cloud'", "'offline'"]),
    ("progress-text", {"logging": {"progress": "yes"}}, ["logging.progress", "'yes'", "true or false"]),
    ("logging-every-zero", {"logging": {"every": 0}}, ["logging.every=0", "positive"]),
    ("seed-float", {"run": {"seed": 1.5}}, ["run.seed", "1.5", "integer"]),
    ("mesh-zero", {"mesh": {"lat": 0}}, ["mesh.lat=0", "positive"]),
    ("mesh-text", {"mesh": {"lon": "two"}}, ["mesh.lon", "'two'", "integer"]),
    ("levels-text", {"data": {"levels": [500, "x"]}}, ["data.levels[1]", "'x'", "integer"]),
    ("upper-air-string", {"data": {"upper_air": "geopotential"}}, ["data.upper_air", "expected a list"]),
    ("step-hours-zero", {"data": {"step_hours": 0}}, ["data.step_hours=0", "positive"]),
    (
        "period-bad-month",
        {"data": {"train_period": ["2020-13-01", "2020-02-01"]}},
        ["data.train_period[0]", "'2020-13-01'", "YYYY-MM-DD"],
    ),
    (
        "period-bad-day",
        {"data": {"val_period": ["2020-02-01", "2020-02-30"]}},
        ["data.val_period[1]", "'2020-02-30'", "YYYY-MM-DD"],
    ),
    (
        "period-words",
        {"data": {"train_period": ["yesterday", "today"]}},
        ["data.train_period[0]", "'yesterday'"],
    ),
    (
        "period-reversed",
        {"data": {"train_period": ["2020-02-01", "2020-01-01"]}},
        ["data.train_period", "after the last", "swap"],
    ),
    (
        "period-three",
        {"data": {"train_period": ["2020-01-01", "2020-01-02", "2020-01-03"]}},
        ["data.train_period", "[first, last]"],
    ),
    ("period-not-list", {"data": {"train_period": "2020"}}, ["data.train_period", "expected a list"]),
    (
        "period-typo",
        {"data": {"val_period": ["2020-02-01", "2020-0l-10"]}},
        ["data.val_period[1]='2020-0l-10'", "not a date", "YYYY-MM-DD"],
    ),
    (
        "lead-not-multiple",
        {"validation": {"lead_hours": [10]}},
        ["validation.lead_hours", "10", "step_hours=6"],
    ),
    ("lead-negative", {"validation": {"lead_hours": [-6]}}, ["validation.lead_hours", "-6", "positive"]),
    (
        "val-variable",
        {"validation": {"variables": ["z500"]}},
        ["validation.variables", "'z500'", "choose from"],
    ),
    ("val-batch-zero", {"validation": {"batch_size": 0}}, ["validation.batch_size=0", "positive"]),
    (
        "loss-unknown-var",
        {"loss": {"variable_weights": {"humidity": 2.0}}},
        ["loss.variable_weights", "'humidity'", "choose from"],
    ),
    (
        "loss-unknown-level",
        {"loss": {"level_weights": {300: 2.0}}},
        ["loss.level_weights", "300", "data.levels"],
    ),
    ("keep-zero", {"checkpoint": {"keep": 0}}, ["checkpoint", "keep=0", ">= 1"]),
    ("every-negative", {"checkpoint": {"every": -1}}, ["checkpoint", "every=-1", ">= 0"]),
    (
        "model-preset-huge",
        {"model": {"preset": "huge"}},
        ["model.preset='huge'", "model.name='weathermixer'", "'tiny', 'small', '1b', '3b'"],
    ),
    (
        "model-name-typo",
        {"model": {"name": "weathermixr"}},
        ["model.name='weathermixr'", "did you mean 'weathermixer'", "'vit', 'unet'"],
    ),
    ("model-name-unknown", {"model": {"name": "graphcast"}}, ["model.name='graphcast'", "choose one of"]),
    (
        "model-unet-preset",
        {"model": {"name": "unet", "preset": "medium"}},
        ["model.preset='medium'", "model.name='unet'"],
    ),
    (
        "model-vit-preset-typo",
        {"model": {"name": "vit", "preset": "smal"}},
        ["model.preset='smal'", "model.name='vit'", "did you mean 'small'"],
    ),
    (
        "model-override-unknown",
        {"model": {"overrides": {"embed_dimm": 8}}},
        ["'model.overrides.embed_dimm'", "did you mean 'embed_dim'", "valid keys: embed_dim, depth"],
    ),
    (
        "model-override-type",
        {"model": {"overrides": {"embed_dim": "wide"}}},
        ["model.overrides.embed_dim='wide'", "expected an integer"],
    ),
    ("model-override-float", {"model": {"overrides": {"depth": 2.5}}}, ["model.overrides.depth=2.5", "int"]),
    (
        "model-override-unet-list",
        {"model": {"name": "unet", "overrides": {"channel_mults": [1, "x"]}}},
        ["model.overrides.channel_mults[1]='x'", "expected an integer"],
    ),
    (
        "model-override-bool",
        {"model": {"overrides": {"final_norm": "yes"}}},
        ["model.overrides.final_norm='yes'", "true or false"],
    ),
    (
        "model-override-nan",
        {"model": {"overrides": {"dropout": float("nan")}}},
        ["model.overrides.dropout=nan", "finite"],
    ),
    (
        "model-override-vit",
        {"model": {"name": "vit", "overrides": {"token_hidden": 8}}},
        ["'model.overrides.token_hidden'", "valid keys: embed_dim, depth, num_heads"],
    ),
    ("model-overrides-list", {"model": {"overrides": [1, 2]}}, ["model.overrides", "expected a mapping"]),
    ("section-not-mapping", {"optim": 3}, ["optim", "expected a mapping"]),
    ("store-missing-key", {"data": None}, ["data.store", "required"]),
]

# (id, raw YAML text (RUN/STORE substituted), fragments)
TEXT_CASES: list[tuple[str, str, list[str]]] = [
    (
        "duplicate-section",
        "data: {store: STORE}\nrun: {dir: RUN}\nrun: {seed: 2}\n",
        ["duplicate key 'run'", "line 2 and line 3", "keep one"],
    ),
    (
        "duplicate-nested",
        "data: {store: STORE}\nrun: {dir: RUN}\noptim:\n  lr: 1.0e-3\n  lr: 2.0e-3\n",
        ["duplicate key 'lr'", "line 4 and line 5"],
    ),
    ("yaml-syntax", "data: {store: STORE\nrun: [\n", ["not valid YAML"]),
    (
        "yaml-python-tag",
        "data: {store: STORE}\nrun: !!python/object/apply:os.system ['echo x']\n",
        ["not valid YAML", "python/object/apply"],
    ),
    ("top-level-list", "- data\n- run\n", ["top level must be a mapping", "list"]),
    ("top-level-scalar", "42\n", ["top level must be a mapping", "int"]),
    ("tab-indent", "data:\n\tstore: STORE\n", ["not valid YAML"]),
    (
        "unquoted-impossible-date",
        "data: {store: STORE, train_period: [2020-01-01, 2020-02-30]}\nrun: {dir: RUN}\n",
        ["data.train_period[1]='2020-02-30'", "not a date"],
    ),
]

# (id, overrides, fragments): KEY=VALUE on the command line
OVERRIDE_CASES: list[tuple[str, list[str], list[str]]] = [
    ("override-unknown", ["optim.lrr=1"], ["'optim.lrr'", "did you mean 'lr'"]),
    ("override-model-key", ["model.overrides.depht=3"], ["'model.overrides.depht'", "did you mean 'depth'"]),
    ("override-model-inf", ["model.overrides.dropout=.inf"], ["model.overrides.dropout=inf", "finite"]),
    ("override-unknown-section", ["optimm.lr=1"], ["'optimm'", "did you mean 'optim'"]),
    ("override-no-key", ["=3"], ["override '=3'", "KEY.SUB=VALUE"]),
    ("override-bad-yaml", ["optim.betas=[0.9"], ["override 'optim.betas=[0.9'", "cannot read value"]),
    ("override-nan", ["optim.lr=.nan"], ["optim.lr", "finite"]),
    ("override-into-scalar", ["optim.lr.x=1"], ["optim.lr is not a mapping", "write optim.lr=VALUE"]),
    ("override-duplicate", ["optim={lr: 1, lr: 2}"], ["duplicate key 'lr'"]),
    ("override-world-size", ["--world-size", "4"], ["= 1 ranks, but the job has 4", "mesh.*"]),
]


@pytest.fixture()
def config_paths(tmp_path: Path) -> tuple[Path, Path]:
    """(config file path, run dir) — the run dir must still not exist after a refused config."""
    return tmp_path / "config.yaml", tmp_path / "run"


def _write(path: Path, text: str, run_dir: Path) -> None:
    path.write_text(text.replace("RUN", str(run_dir)).replace("STORE", str(path.parent / "none.zarr")))


@pytest.mark.parametrize(("case", "change", "fragments"), CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_bad_config(
    case: str, change: dict, fragments: list[str], config_paths: tuple[Path, Path], capsys: Any
) -> None:
    cfg, run_dir = config_paths
    _write(cfg, yaml.safe_dump(merge_sections(BASE, change)), run_dir)
    before = _snapshot(cfg)
    code, text = _cli(["config", "validate", "--quiet", str(cfg)], capsys)
    _assert_clean_error(code, text, 2, fragments)
    assert _snapshot(cfg) == before and not run_dir.exists()


@pytest.mark.parametrize(("case", "text", "fragments"), TEXT_CASES, ids=[c[0] for c in TEXT_CASES])
def test_bad_config_text(
    case: str, text: str, fragments: list[str], config_paths: tuple[Path, Path], capsys: Any
) -> None:
    cfg, run_dir = config_paths
    _write(cfg, text, run_dir)
    code, out = _cli(["config", "validate", "--quiet", str(cfg)], capsys)
    _assert_clean_error(code, out, 2, fragments)
    assert not run_dir.exists()


@pytest.mark.parametrize(("case", "extra", "fragments"), OVERRIDE_CASES, ids=[c[0] for c in OVERRIDE_CASES])
def test_bad_override(
    case: str, extra: list[str], fragments: list[str], config_paths: tuple[Path, Path], capsys: Any
) -> None:
    cfg, run_dir = config_paths
    _write(cfg, yaml.safe_dump(BASE), run_dir)
    code, out = _cli(["config", "validate", "--quiet", str(cfg), *extra], capsys)
    _assert_clean_error(code, out, 2, fragments)
    assert not run_dir.exists()


FILE_CASES = [
    ("config-missing", lambda d: d / "missing.yaml", ["missing.yaml", "not found", "pass the path"]),
    ("config-is-dir", lambda d: d, ["not found", "pass the path of a YAML file"]),
    ("config-binary", lambda d: _binary(d / "c.bin"), ["c.bin", "not a UTF-8 text file"]),
]


def _binary(path: Path) -> Path:
    path.write_bytes(bytes(range(256)) * 4)
    return path


@pytest.mark.parametrize(("case", "make", "fragments"), FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_bad_config_file(case: str, make: Any, fragments: list[str], tmp_path: Path, capsys: Any) -> None:
    path = make(tmp_path)
    for command in (["config", "validate"], ["train"]):
        code, out = _cli([*command, str(path)], capsys)
        _assert_clean_error(code, out, 2, fragments)


def test_unquoted_yaml_date_is_a_date(config_paths: tuple[Path, Path], capsys: Any) -> None:
    cfg, run_dir = config_paths
    text = yaml.safe_dump(BASE).replace("'2020-01-01'", "2020-01-01").replace("'2020-02-01'", "2020-02-01")
    assert "- 2020-01-01\n" in text
    _write(cfg, text, run_dir)
    code, out = _cli(["config", "validate", str(cfg)], capsys)
    assert code == 0, out
    assert "- '2020-01-01'" in out  # read as the date, printed as ISO text


# ---------------------------------------------------------------- runs, checkpoints, filesystem
@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from jigsaw_earth.data.synth import SynthConfig, synth_store

    path = tmp_path_factory.mktemp("store") / "data.zarr"
    synth_store(path, SynthConfig(n_lat=16, n_lon=32, start="2020-01-01T00", end="2020-02-12T18"))
    return path


def _config_for(directory: Path, store: Path, run_dir: Path, change: dict | None = None) -> Path:
    raw = merge_sections(BASE, change or {})
    raw["run"]["dir"], raw["data"]["store"] = str(run_dir), str(store)
    path = directory / f"config-{run_dir.name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory, store: Path) -> tuple[Path, Path]:
    """A finished 4-step run (checkpoints at steps 2 and 4) and its config."""
    root = tmp_path_factory.mktemp("finished")
    run_dir = root / "run"
    cfg = _config_for(root, store, run_dir)
    assert main(["train", str(cfg)]) == 0
    return run_dir, cfg


@pytest.fixture()
def run_copy(finished_run: tuple[Path, Path], tmp_path: Path, store: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run[0], run_dir)
    return run_dir


def _corrupt_meta(run: Path) -> None:
    (run / "checkpoints" / "step_000000004" / "meta.json").write_text("{not json")


def _truncate_data(run: Path) -> None:
    for f in (run / "checkpoints" / "step_000000004").glob("*.distcp"):
        f.write_bytes(f.read_bytes()[:100])


def _wrong_format(run: Path) -> None:
    meta = run / "checkpoints" / "step_000000004" / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "version": 99}))


def _checkpoints_file(run: Path) -> None:
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").write_text("not a folder")


# (id, prepare(run_dir), config change, extra argv, fragments) — train refuses; the run dir is untouched
RUN_CASES: list[tuple[str, Any, dict, list[str], list[str]]] = [
    (
        "resume-never-over-checkpoints",
        None,
        {"checkpoint": {"resume": "never"}},
        [],
        [
            "holds checkpoints of an earlier run up to step 4",
            "checkpoint.resume=never",
            "--new-run",
            ".old-1",
        ],
    ),
    (
        "shorter-new-run",
        None,
        {"training": {"steps": 2}},
        [],
        ["up to step 4", "beyond training.steps=2", "training.steps >= 4", "--new-run"],
    ),
    (
        "other-model",
        None,
        {"model": {"overrides": {"embed_dim": 8}}},
        [],
        [
            "another model/data/loss/batch configuration",
            "model.overrides.embed_dim=8 (the run has None)",
            "config.yaml",
            "--new-run",
        ],
    ),
    (
        "other-batch",
        None,
        {"training": {"batch_size": 4}},
        [],
        ["another model/data/loss/batch", "training.batch_size=4 (the run has 2)"],
    ),
    (
        "other-variables",
        None,
        {"data": {"surface": []}, "validation": {"variables": ["temperature@850"]}},
        [],
        ["another model/data/loss/batch", "data.surface=[] (the run has ['2m_temperature'])"],
    ),
    (
        "resume-path-missing",
        None,
        {"checkpoint": {"resume": "/nonexistent/step_1"}},
        [],
        ["/nonexistent/step_1/meta.json not found", "not a complete jigsaw-earth checkpoint"],
    ),
    ("corrupt-meta", _corrupt_meta, {}, [], ["meta.json is corrupted", "delete", "older checkpoint"]),
    ("meta-other-version", _wrong_format, {}, [], ["version 99", "this code reads"]),
    (  # a resume reads the checkpoint (a finished run's rerun reads nothing)
        "truncated-shards",
        _truncate_data,
        {"training": {"steps": 6}},
        [],
        ["cannot read checkpoint", "step_000000004", "delete"],
    ),
    (
        "checkpoints-is-file",
        _checkpoints_file,
        {"checkpoint": {"resume": "never"}},
        [],
        ["not writable", "checkpoints", "File exists", "[EEXIST]", "move it aside"],
    ),
]


@pytest.mark.parametrize(
    ("case", "prepare", "change", "extra", "fragments"), RUN_CASES, ids=[c[0] for c in RUN_CASES]
)
def test_run_dir_refusals(
    case: str,
    prepare: Any,
    change: dict,
    extra: list[str],
    fragments: list[str],
    run_copy: Path,
    store: Path,
    tmp_path: Path,
    capsys: Any,
) -> None:
    if prepare is not None:
        prepare(run_copy)
    before = _snapshot(run_copy)
    cfg = _config_for(tmp_path, store, run_copy, change)
    code, out = _cli(["train", str(cfg), *extra], capsys)
    _assert_clean_error(code, out, 2, fragments)
    assert _snapshot(run_copy) == before, "a refused start changed the run directory"
    assert not list(tmp_path.glob("run.old-*"))


def test_other_resume_source_refused(
    run_copy: Path, finished_run: tuple[Path, Path], store: Path, tmp_path: Path, capsys: Any
) -> None:
    """``checkpoint.resume=PATH`` from another run while this run dir holds its own checkpoints."""
    other = tmp_path / "other"
    shutil.copytree(finished_run[0], other)
    before = _snapshot(run_copy)
    source = other / "checkpoints" / "step_000000002"
    cfg = _config_for(tmp_path, store, run_copy, {"checkpoint": {"resume": str(source)}})
    code, out = _cli(["train", str(cfg)], capsys)
    _assert_clean_error(code, out, 2, ["starts another run from outside it", "--new-run"])
    assert _snapshot(run_copy) == before


# (id, config change with PARENT for the finished run's directory, fragments): a fine-tune's start
# refuses before anything of the new run is written
FINETUNE_CASES: list[tuple[str, dict, list[str]]] = [
    (
        "init-from-missing",
        {"training": {"init_from": "/nonexistent/run"}},
        ["training.init_from='/nonexistent/run' does not exist", "run directory", "step_N"],
    ),
    (
        "init-from-other-model",
        {"model": {"overrides": {"embed_dim": 8}}},
        [
            "embed.weight has global shape",
            "in the parent",
            "model.overrides.embed_dim is None in the parent, 8",
        ],
    ),
    (
        "init-from-other-architecture",
        {"model": {"name": "vit"}},
        ["holds model 'weathermixer'", "builds 'vit'"],
    ),
    (
        "freeze-typo",
        {"training": {"freeze": ["blokcs"]}},
        ["'blokcs' matches no module", "did you mean 'blocks'"],
    ),
]


@pytest.mark.parametrize(("case", "change", "fragments"), FINETUNE_CASES, ids=[c[0] for c in FINETUNE_CASES])
def test_fine_tune_refusals(
    case: str,
    change: dict,
    fragments: list[str],
    finished_run: tuple[Path, Path],
    store: Path,
    tmp_path: Path,
    capsys: Any,
) -> None:
    parent = finished_run[0]
    before = _snapshot(parent)
    change = merge_sections({"training": {"init_from": str(parent)}}, change)
    child = tmp_path / "child"
    code, out = _cli(["train", str(_config_for(tmp_path, store, child, change))], capsys)
    _assert_clean_error(code, out, 2, fragments)
    assert _snapshot(parent) == before and not child.exists(), "a refused fine-tune wrote something"


def test_new_run_moves_the_old_run_aside(run_copy: Path, store: Path, tmp_path: Path, capsys: Any) -> None:
    before = _snapshot(run_copy)
    cfg = _config_for(
        tmp_path, store, run_copy, {"checkpoint": {"resume": "never"}, "training": {"steps": 2}}
    )
    code, out = _cli(["train", str(cfg), "--new-run"], capsys)
    assert code == 0, out
    aside = tmp_path / "run.old-1"
    assert f"aside to {aside}" in out
    assert _snapshot(aside) == before  # the earlier run, intact under the printed name
    history = [json.loads(x) for x in (run_copy / "history.jsonl").read_text().splitlines()]
    assert len(history) == 1 and history[0]["moved_aside"] == str(aside)
    assert history[0]["config"]["training"]["steps"] == 2


def test_resume_records_history_and_metrics_have_no_repeated_steps(
    run_copy: Path, store: Path, tmp_path: Path, capsys: Any
) -> None:
    # the run died after step 3 (its metrics have step 3), its newest checkpoint is step 2
    ckpts = run_copy / "checkpoints"
    shutil.rmtree(ckpts / "step_000000004")
    (ckpts / "latest").write_text("step_000000002\n")
    rows = [json.loads(x) for x in (run_copy / "metrics.jsonl").read_text().splitlines()]
    (run_copy / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["step"] <= 3))
    cfg = _config_for(tmp_path, store, run_copy)
    code, out = _cli(["train", str(cfg)], capsys)
    assert code == 0, out
    steps = [
        json.loads(x)["step"]
        for x in (run_copy / "metrics.jsonl").read_text().splitlines()
        if json.loads(x)["kind"] == "train"
    ]
    assert steps == [1, 2, 3, 4]
    history = [json.loads(x) for x in (run_copy / "history.jsonl").read_text().splitlines()]
    assert [h["start_step"] for h in history] == [0, 2]
    assert history[-1]["resumed_from"].endswith("step_000000002")


# (id, run.dir under tmp_path, fragments) — the run dir cannot be made or written
FS_PATH_CASES = [
    (
        "run-dir-blocked",
        lambda t: Path("/sys/jigsaw-earth-test/run"),
        ["/sys/jigsaw-earth-test", "[EPERM]", "choose another directory"],
    ),
    ("run-dir-under-file", lambda t: _file(t / "afile") / "run", ["afile", "[ENOTDIR]", "a file stands"]),
    ("run-dir-is-file", lambda t: _file(t / "runfile"), ["runfile", "a file stands"]),
]


def _file(path: Path) -> Path:
    path.write_text("x")
    return path


@pytest.mark.parametrize(("case", "where", "fragments"), FS_PATH_CASES, ids=[c[0] for c in FS_PATH_CASES])
@pytest.mark.parametrize("command", ["train", "validate"])
def test_unwritable_run_dir(
    case: str, where: Any, fragments: list[str], command: str, store: Path, tmp_path: Path, capsys: Any
) -> None:
    run_dir = where(tmp_path)
    cfg = _config_for(tmp_path, store, Path(run_dir))
    before = _snapshot(tmp_path)
    argv = ["train", str(cfg)] if command == "train" else ["config", "validate", "--quiet", str(cfg)]
    code, out = _cli(argv, capsys)
    _assert_clean_error(code, out, 2, ["not writable", *fragments])
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("command", ["train", "validate"])
def test_too_little_space(
    command: str, store: Path, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jigsaw_earth.training import preflight

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda p: usage._replace(free=1000))
    run_dir = tmp_path / "run"
    cfg = _config_for(tmp_path, store, run_dir)
    argv = ["train", str(cfg)] if command == "train" else ["config", "validate", "--quiet", str(cfg)]
    code, out = _cli(argv, capsys)
    _assert_clean_error(code, out, 2, [str(run_dir), "checkpoint.keep=2", "2 + 1 checkpoints", "free space"])
    assert not (run_dir / "config.yaml").exists() and not (run_dir / "history.jsonl").exists()


@pytest.mark.parametrize("code_", [errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES])
def test_save_fails_cleanly_and_a_retry_succeeds(
    code_: int, run_copy: Path, store: Path, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem error while writing the step-6 checkpoint: one line, .tmp removed, step 4 kept."""
    from torch.distributed.checkpoint import filesystem

    real = filesystem._write_item
    import os as _os

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise OSError(code_, _os.strerror(code_), str(run_copy / "checkpoints" / "step_000000006.tmp"))

    monkeypatch.setattr(filesystem, "_write_item", failing)
    cfg = _config_for(tmp_path, store, run_copy, {"training": {"steps": 6}})
    code, out = _cli(["train", str(cfg)], capsys)
    _assert_clean_error(code, out, 2, ["step_000000006.tmp", _os.strerror(code_), errno.errorcode[code_]])
    ckpts = run_copy / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_000000002", "step_000000004"]
    assert (ckpts / "latest").read_text().strip() == "step_000000004"
    monkeypatch.setattr(filesystem, "_write_item", real)
    code, out = _cli(["train", str(cfg)], capsys)
    assert code == 0, out
    assert (ckpts / "latest").read_text().strip() == "step_000000006"


def test_full_disk_prunes_before_saving_but_never_latest(
    run_copy: Path, store: Path, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jigsaw_earth.checkpoint import manager

    monkeypatch.setattr(manager, "_free_bytes", lambda p: 10)  # preflight passed; the disk filled since
    cfg = _config_for(tmp_path, store, run_copy, {"training": {"steps": 6}})
    code, out = _cli(["train", str(cfg)], capsys)
    assert code == 0, out
    ckpts = run_copy / "checkpoints"
    # step 2 went before the save (keep=2: it would have been pruned after it anyway); step 4,
    # which `latest` named during the save, stayed
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_000000004", "step_000000006"]


def test_prune_never_removes_latest(tmp_path: Path) -> None:
    from jigsaw_earth.checkpoint.manager import _prunable

    root = tmp_path / "checkpoints"
    for step in (2, 4, 8):
        (root / f"step_{step:09d}").mkdir(parents=True)
        (root / f"step_{step:09d}" / "meta.json").write_text("{}")
    (root / "latest").write_text("step_000000002\n")
    assert [p.name for p in _prunable(root, 1)] == ["step_000000004"]
    assert [p.name for p in _prunable(root, 5)] == []  # fewer than keep: nothing to prune


def test_ctrl_c_is_one_line(capsys: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from jigsaw_earth.commands import config as config_command

    def interrupted(args: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(config_command, "run_show", interrupted)
    code, out = _cli(["config", "show"], capsys)
    assert code == 130 and "Traceback" not in out
    assert out.strip().splitlines() == [
        "jigsaw-earth config: interrupted (Ctrl-C); nothing after the last message was kept "
        "(a training run resumes from its last checkpoint)"
    ]


# ---------------------------------------------------------------- data faults the trainer meets
@pytest.fixture(scope="module")
def other_grid_climatology(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from jigsaw_earth.data.synth import SynthConfig, synth_store

    path = tmp_path_factory.mktemp("other") / "d.zarr"
    synth_store(path, SynthConfig(n_lat=8, n_lon=16, start="2020-01-01T00", end="2020-01-03T18"))
    return path.with_name("d-climatology.zarr")


def test_climatology_on_another_grid(
    other_grid_climatology: Path, store: Path, tmp_path: Path, capsys: Any
) -> None:
    run_dir = tmp_path / "run"
    cfg = _config_for(tmp_path, store, run_dir, {"data": {"climatology": str(other_grid_climatology)}})
    code, out = _cli(["train", str(cfg)], capsys)
    fragments = [str(other_grid_climatology), "8x16", "16x32", "data.climatology", "regrid it"]
    _assert_clean_error(code, out, 2, fragments)
    assert not run_dir.exists()  # nothing of the run was written


@pytest.mark.parametrize("scan", ["sample", "full"])
def test_damaged_chunk_under_inspect_nans(scan: str, store: Path, tmp_path: Path, capsys: Any) -> None:
    damaged = tmp_path / "data.zarr"
    shutil.copytree(store, damaged)
    chunk = sorted((damaged / "temperature" / "c").rglob("*"))[-1]
    assert chunk.is_file()
    chunk.write_bytes(chunk.read_bytes()[:50])  # truncated
    code, out = _cli(["data", "inspect", str(damaged), "--nans", scan], capsys)
    _assert_clean_error(code, out, 2, [str(damaged), "'temperature'", "damaged or truncated", "re-write"])


def test_checkpoint_size_estimate_matches_a_real_checkpoint(
    finished_run: tuple[Path, Path], capsys: Any
) -> None:
    """The preflight's estimate (models.summary.checkpoint_bytes) against the files of step 4."""
    from jigsaw_earth.commands.config import _checkpoint_estimate
    from jigsaw_earth.config import load_config

    run_dir, cfg = finished_run
    estimate = _checkpoint_estimate(load_config(cfg))
    saved = sum(f.stat().st_size for f in (run_dir / "checkpoints" / "step_000000004").glob("*.distcp"))
    assert estimate is not None and abs(estimate - saved) < 0.1 * saved, (estimate, saved)


# ---------------------------------------------------------------- predict, score, plot, plan, data (issue 19)
# Each case: (id, argv builder taking the world ``w``, fragments of the one error line). The world
# (store, climatology, finished run, a forecast store, a user folder) is hashed before and after:
# a refused command changes nothing on disk. Everything runs in process (``cli.main``).
@pytest.fixture(scope="module")
def world(finished_run: tuple[Path, Path], store: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    run_dir, cfg = finished_run
    root = tmp_path_factory.mktemp("world")
    fc = root / "fc.zarr"
    argv = ["predict", str(cfg), "--out", str(fc), "--start", "2020-02-01", "--end", "2020-02-03"]
    assert main([*argv, "--steps", "2", "--max-inits", "3"]) == 0
    mine = root / "my-folder"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    (mine / "sub" / "a.png").write_bytes(b"\x89PNG")
    scores = root / "scores"
    assert main(["score", str(fc), "--truth", str(store), "--out", str(scores)]) == 0
    clim = store.with_name("data-climatology.zarr")
    ckpt = run_dir / "checkpoints" / "step_000000004"
    theirs = root / "theirs.zarr.in-progress"  # predict's in-progress name, but a user's folder
    theirs.mkdir()
    (theirs / "notes.txt").write_text("theirs")
    done = root / "done.zarr.in-progress"  # predict's in-progress name, but a complete forecast store
    shutil.copytree(fc, done)
    return {"run": run_dir, "cfg": cfg, "store": store, "clim": clim, "fc": fc, "mine": mine, "root": root,
            "ckpt": ckpt, "scores": root / "scores.json", "theirs": theirs, "done": done}  # fmt: skip


def _world_snapshot(w: dict) -> dict[str, dict[str, str]]:
    return {k: _snapshot(w[k]) for k in ("run", "store", "clim", "fc", "mine", "scores", "theirs", "done")}


def _predict(w: dict, *extra: str, out: str | None = None) -> list[str]:
    target = str(w["root"] / "new-fc.zarr") if out is None else out
    return ["predict", str(w["cfg"]), "--out", target, "--start", "2020-02-01", "--end", "2020-02-02",
            "--steps", "1", *extra]  # fmt: skip


P = _predict
PREDICT_CASES: list[tuple[str, Any, list[str]]] = [
    ("batch-size-zero", lambda w: P(w, "--batch-size", "0"), ["--batch-size 0", "at least 1"]),
    ("batch-size-negative", lambda w: P(w, "--batch-size", "-3"), ["--batch-size -3", "at least 1"]),
    ("max-inits-negative", lambda w: P(w, "--max-inits", "-1"), ["--max-inits -1", "0 (all) or more"]),
    ("max-inits-very-negative", lambda w: P(w, "--max-inits", "-99"), ["--max-inits -99", "0 (all)"]),
    ("every-hours-zero", lambda w: P(w, "--every-hours", "0"), ["--every-hours 0", "at least 1"]),
    ("every-hours-negative", lambda w: P(w, "--every-hours", "-6"), ["--every-hours -6", "at least 1"]),
    ("steps-zero", lambda w: P(w, "--steps", "0"), ["--steps 0", "at least 1"]),
    ("steps-negative", lambda w: P(w, "--steps", "-2"), ["--steps -2", "at least 1"]),
    ("out-empty", lambda w: P(w, out=""), ["--out '' is empty", "--out fc.zarr"]),
    ("lead-not-a-step", lambda w: P(w, "--lead-hours", "9"), ["--lead-hours [9]", "multiple of the model"]),
    ("lead-not-a-number", lambda w: P(w, "--lead-hours", "6h"), ["--lead-hours '6h' is not a whole number"]),
    ("level-unknown", lambda w: P(w, "--levels", "925"), ["--levels [925] not predicted", "it has levels"]),
    ("variable-unknown", lambda w: P(w, "--variables", "tp"), ["--variables 'tp' is not predicted"]),
    ("score-option-alone", lambda w: P(w, "--regions", "europe"), ["--regions is a scoring option"]),
    ("region-unknown", lambda w: P(w, "--score", "--regions", "europa"), ["did you mean 'europe'"]),
    ("out-blank", lambda w: P(w, out="  "), ["--out", "empty"]),
    ("out-url", lambda w: P(w, out="memory://fc.zarr"), ["--out 'memory://fc.zarr'", "must be local"]),
    (
        "out-s3-grib2",  # refused before the bucket is asked (the bucket's own cases: test_predict_bucket)
        lambda w: P(w, "--format", "grib2", out="s3://bucket/fc"),
        ["--out s3://bucket/fc with --format grib2", "a local folder and copy them there"],
    ),
    ("out-truth", lambda w: P(w, "--overwrite", out=str(w["store"])), ["is the truth/training store"]),
    ("out-truth-no-overwrite", lambda w: P(w, out=str(w["store"])), ["is the truth/training store"]),
    (
        "out-inside-truth",
        lambda w: P(w, "--overwrite", out=str(w["store"] / "temperature")),
        ["lies inside the truth/training store"],
    ),
    (
        "out-new-inside-truth",
        lambda w: P(w, out=str(w["store"] / "fc.zarr")),
        ["lies inside the truth/training store", "Choose an --out outside it"],
    ),
    (
        "out-contains-truth",
        lambda w: P(w, "--overwrite", out=str(w["store"].parent)),
        ["contains the truth/training store"],
    ),
    ("out-climatology", lambda w: P(w, "--overwrite", out=str(w["clim"])), ["is the climatology"]),
    ("out-run-dir", lambda w: P(w, "--overwrite", out=str(w["run"])), ["is the run directory run.dir"]),
    ("out-run-dir-plain", lambda w: P(w, out=str(w["run"])), ["is the run directory"]),
    (
        "out-contains-run",
        lambda w: P(w, "--overwrite", out=str(w["run"].parent)),
        ["contains the run directory"],
    ),
    (
        "out-checkpoints",
        lambda w: P(w, "--overwrite", out=str(w["run"] / "checkpoints")),
        ["is the checkpoint folder"],
    ),
    (
        "out-checkpoint",
        lambda w: P(w, "--overwrite", out=str(w["ckpt"])),
        ["lies inside the checkpoint folder"],
    ),
    (
        "out-inside-checkpoint",
        lambda w: P(w, out=str(w["ckpt"] / "fc.zarr")),
        ["lies inside the checkpoint folder"],
    ),
    ("out-user-folder", lambda w: P(w, "--overwrite", out=str(w["mine"])), ["not a jigsaw-earth forecast"]),
    (
        "out-user-subfolder",
        lambda w: P(w, "--overwrite", out=str(w["mine"] / "sub")),
        ["not a jigsaw-earth forecast store", "a.png"],
    ),
    (
        "out-user-file",
        lambda w: P(w, "--overwrite", out=str(w["mine"] / "notes.txt")),
        ["is a file or link", "remove it yourself"],
    ),
    (
        "out-holds-another-forecast",
        lambda w: P(w, out=str(w["fc"])),
        [
            "holds a complete forecast of another request",
            "model steps (--steps): 1 (recorded: 2)",
            "--overwrite",
        ],
    ),
    ("out-user-no-overwrite", lambda w: P(w, out=str(w["mine"])), ["already exists", "--overwrite"]),
    ("checkpoint-missing", lambda w: P(w, "--checkpoint", "/nonexistent/step_1"), ["meta.json not found"]),
    (
        "checkpoint-tmp",
        lambda w: P(w, "--checkpoint", str(w["run"] / "checkpoints" / "step_000000006.tmp")),
        ["not a complete jigsaw-earth checkpoint", "did not finish"],
    ),
    (
        "checkpoint-is-run",
        lambda w: P(w, "--checkpoint", str(w["run"])),
        ["not a complete jigsaw-earth checkpoint", "step_N folder"],
    ),
    (
        "checkpoint-is-file",
        lambda w: P(w, "--checkpoint", str(w["run"] / "config.yaml")),
        ["not a complete jigsaw-earth checkpoint"],
    ),
    (
        "override-embed-dim",
        lambda w: P(w, "model.overrides.embed_dim=8"),
        ["model.overrides.embed_dim=8 differs", "drop the override of model.overrides.embed_dim"],
    ),
    (
        "override-depth",
        lambda w: P(w, "model.overrides.depth=1"),
        ["model.overrides.depth=1 differs", "config.yaml"],
    ),
    ("override-model-name", lambda w: P(w, "model.name=vit"), ["model.name='vit' differs from"]),
    ("override-preset", lambda w: P(w, "model.preset=small"), ["model.preset='small' differs"]),
    (
        "override-levels",
        lambda w: P(w, "data.levels=[500]", "validation.variables=[geopotential@500]"),
        ["data.levels=[500] differs from [500, 850]"],
    ),
    (
        "override-surface",
        lambda w: P(w, "data.surface=[]", "validation.variables=[temperature@850]"),
        ["data.surface=[] differs from ['2m_temperature']"],
    ),
    (
        "override-upper-air",
        lambda w: P(w, "data.upper_air=[geopotential]", "validation.variables=[geopotential@500]"),
        ["data.upper_air=['geopotential'] differs"],
    ),
    (
        "override-step-hours",
        lambda w: P(w, "data.step_hours=12", "validation.lead_hours=[12]"),
        ["data.step_hours=12 differs from 6"],
    ),
    (
        "override-tendency",
        lambda w: P(w, "loss.tendency_scaling=false"),
        ["loss.tendency_scaling=False differs from True"],
    ),
    ("override-unknown", lambda w: P(w, "optim.lrr=1"), ["'optim.lrr'", "did you mean 'lr'"]),
    (
        "start-words",
        lambda w: [*P(w)[:4], "--start", "yesterday", *P(w)[6:]],
        ["--start 'yesterday'", "not a date"],
    ),
    (
        "end-typo",
        lambda w: [*P(w)[:6], "--end", "2020-0l-02", *P(w)[8:]],
        ["--end '2020-0l-02'", "YYYY-MM-DD"],
    ),
    (
        "start-after-end",
        lambda w: [*P(w)[:4], "--start", "2020-02-05", *P(w)[6:]],
        ["--start 2020-02-05 is after --end 2020-02-02", "swap"],
    ),
    (
        "no-inits-in-range",
        lambda w: [*P(w)[:4], "--start", "2021-01-01", "--end", "2021-01-02", *P(w)[8:]],
        ["no initialisation time in [2021-01-01, 2021-01-02]", "widen --start/--end"],
    ),
    (
        "steps-beyond-store",
        lambda w: P(w, "--steps", "9999"),
        ["9999 forecast steps inside the store", "lower --steps"],
    ),
    ("config-missing", lambda w: ["predict", "/nonexistent.yaml", "--out", "x.zarr"], ["not found"]),
    (
        "in-progress-user-folder",
        lambda w: P(w, out=str(w["root"] / "theirs.zarr")),
        [
            "the in-progress folder",
            "theirs.zarr.in-progress is not a jigsaw-earth forecast store",
            "notes.txt",
        ],
    ),
    (
        "in-progress-complete-store",
        lambda w: P(w, out=str(w["root"] / "done.zarr")),
        ["done.zarr.in-progress is a complete forecast store, not a forecast in progress"],
    ),
    (
        "scores-progress-inside-checkpoint",
        lambda w: [*P(w)[:2], *P(w)[4:], "--score", "--scores", str(w["ckpt"] / "s")],
        ["--scores", "is in the record", "of the training run", "nothing was written"],
    ),
    (
        "no-checkpoint",
        lambda w: P(w, f"run.dir={w['root'] / 'empty-run'}"),
        ["no checkpoint in run directory", "train first", "--checkpoint"],
    ),
]


@pytest.mark.parametrize(("case", "argv", "fragments"), PREDICT_CASES, ids=[c[0] for c in PREDICT_CASES])
def test_bad_predict(case: str, argv: Any, fragments: list[str], world: dict, capsys: Any) -> None:
    before = _world_snapshot(world)
    listing = sorted(p.name for p in world["root"].iterdir())
    code, out = _cli(argv(world), capsys)
    _assert_clean_error(code, out, 2, fragments)
    assert _world_snapshot(world) == before, "a refused predict changed the disk"
    assert sorted(p.name for p in world["root"].iterdir()) == listing, "a refused predict left files behind"


def _copy_store(src: Path, dst: Path, change: Any = None) -> Path:
    """A copy of a store, optionally changed (``change(ds) -> ds``) and re-written without encodings."""
    import xarray as xr

    if change is None:
        shutil.copytree(src, dst)
        return dst
    ds = change(xr.open_zarr(src)).load()
    for v in ds.variables.values():
        v.encoding = {}
    ds.to_zarr(dst, zarr_format=3, consolidated=False)
    return dst


def _unfinished(w: dict, t: Path) -> Path:
    import zarr

    path = _copy_store(w["fc"], t / "fc.zarr")
    zarr.open_group(path, mode="r+").attrs["jigsaw_earth"] = {"kind": "forecast", "complete": False}
    return path


def _text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _score_json(w: dict, t: Path, change: Any) -> Path:
    data = json.loads(w["scores"].read_text())
    return _text(t / "s.json", json.dumps(change(data)))


def S(w: dict, fc: Any, *extra: str, truth: Any = None) -> list[str]:
    truth = w["store"] if truth is None else truth
    return ["score", str(fc), "--truth", str(truth), "--out", str(w["root"] / "refused"), *extra]


def _truth(w: dict, t: Path, change: Any) -> Path:
    """A changed copy of the truth around the forecast's inits (a smaller copy: faster)."""
    window = slice("2020-01-31", "2020-02-05")
    return _copy_store(w["store"], t / "tr.zarr", lambda d: change(d.sel(time=window)))


def _isel(**sel: Any) -> Any:
    return lambda ds: ds.isel(**sel)


# (id, argv(world, tmp), fragments): score, plot
SCORE_CASES: list[tuple[str, Any, list[str]]] = [
    ("forecast-missing", lambda w, t: S(w, t / "none.zarr"), ["forecast store", "none.zarr not found"]),
    (
        "truth-missing",
        lambda w, t: ["score", str(w["fc"]), "--truth", str(t / "era5.zarr")],
        ["truth store", "era5.zarr not found"],
    ),
    (
        "climatology-missing",
        lambda w, t: S(w, w["fc"], "--climatology", str(t / "clim.zarr")),
        ["climatology store", "not found"],
    ),
    (
        "truth-is-forecast",
        lambda w, t: ["score", str(w["fc"]), "--truth", str(w["fc"])],
        ["--truth", "same store as FORECAST", "ERA5"],
    ),
    (
        "climatology-is-truth",
        lambda w, t: S(w, w["fc"], "--climatology", str(w["store"])),
        ["--climatology", "same store as --truth"],
    ),
    (
        "climatology-is-forecast",
        lambda w, t: S(w, w["fc"], "--climatology", str(w["fc"])),
        ["same store as FORECAST"],
    ),
    (
        "forecast-temp-name",
        lambda w, t: S(w, _copy_store(w["fc"], t / "fc.zarr.tmp-4f2a")),
        ["did not finish", "'.tmp-'", "score a finished store"],
    ),
    ("forecast-unfinished", lambda w, t: S(w, _unfinished(w, t)), ["marked unfinished", "score a finished"]),
    (
        "forecast-duplicated-init",
        lambda w, t: S(w, _copy_store(w["fc"], t / "d.zarr", _isel(time=[0, 1, 1, 2]))),
        ["init times repeat ['2020-02-02T00']", "counted twice", "drop_duplicates"],
    ),
    (
        "forecast-unsorted",
        lambda w, t: S(w, _copy_store(w["fc"], t / "u.zarr", _isel(time=[2, 0, 1]))),
        ["not sorted: 2020-02-03T00 comes before 2020-02-01T00", "sortby"],
    ),
    (
        "forecast-no-inits",
        lambda w, t: S(w, _copy_store(w["fc"], t / "e.zarr", _isel(time=slice(0, 0)))),
        ["init times: none", "at least one init time"],
    ),
    (
        "truth-lacks-variable",
        lambda w, t: S(w, w["fc"], truth=_truth(w, t, lambda d: d.drop_vars("temperature"))),
        ["forecast variable 'temperature' cannot be scored", "--variables without it"],
    ),
    (
        "truth-lacks-level",
        lambda w, t: S(w, w["fc"], truth=_truth(w, t, lambda d: d.sel(level=[500]))),
        ["'geopotential' cannot be scored", "without levels [850]"],
    ),
    (
        "climatology-lacks-variable",
        lambda w, t: S(
            w,
            w["fc"],
            "--climatology",
            str(_copy_store(w["clim"], t / "c.zarr", lambda d: d.drop_vars("geopotential"))),
        ),
        ["'geopotential' cannot be scored", "the climatology has no 'geopotential'"],
    ),
    (
        "variables-unknown",
        lambda w, t: S(w, w["fc"], "--variables", "humidity"),
        ["--variables ['humidity'] not in the forecast", "it has"],
    ),
    (
        "variables-none-scorable",
        lambda w, t: S(
            w, w["fc"], "--variables", "temperature", truth=_truth(w, t, lambda d: d.drop_vars("temperature"))
        ),
        ["none of --variables ['temperature'] can be scored"],
    ),
    ("region-unknown", lambda w, t: S(w, w["fc"], "--regions", "mars"), ["'mars'"]),
    (
        "period-without-inits",
        lambda w, t: S(w, w["fc"], "--start", "2021-01-01", "--end", "2021-02-01"),
        ["no init times between 2021-01-01 and 2021-02-01"],
    ),
    (
        "baselines-missing",
        lambda w, t: S(w, w["fc"], "--baselines", str(t / "b.csv")),
        ["baselines file", "not found", "leave --baselines out"],
    ),
    (
        "baselines-columns",
        lambda w, t: S(w, w["fc"], "--baselines", str(_text(t / "b.csv", "a,b\n1,2\n"))),
        ["b.csv lacks columns", "rmse"],
    ),
    (
        "forecast-is-a-training-store",
        lambda w, t: S(w, _copy_store(w["store"], t / "x.zarr")),
        ["forecast has no 'prediction_timedelta' dimension", "forecast store"],
    ),
]

PLOT_CASES: list[tuple[str, Any, list[str]]] = [
    ("json-missing", lambda w, t: ["plot", str(t / "s.json"), "--out", str(t / "p")], ["s.json not found"]),
    (
        "json-corrupt",
        lambda w, t: ["plot", str(_text(t / "s.json", '{"scores": [')), "--out", str(t / "p")],
        ["s.json is not valid JSON", "write it again"],
    ),
    (
        "json-binary",
        lambda w, t: ["plot", str(_binary(t / "s.json")), "--out", str(t / "p")],
        ["s.json is not valid JSON"],
    ),
    (
        "json-list",
        lambda w, t: ["plot", str(_text(t / "s.json", "[1, 2]")), "--out", str(t / "p")],
        ["has no 'scores' list"],
    ),
    (
        "json-no-scores",
        lambda w, t: ["plot", str(_text(t / "s.json", '{"rows": []}')), "--out", str(t / "p")],
        ["has no 'scores' list", "jigsaw-earth score"],
    ),
    (
        "row-without-metric",
        lambda w, t: [
            "plot",
            str(
                _score_json(
                    w,
                    t,
                    lambda d: {
                        **d,
                        "scores": [{k: v for k, v in r.items() if k != "metric"} for r in d["scores"]],
                    },
                )
            ),
            "--out",
            str(t / "p"),
        ],
        ["row 0 lacks ['metric']", "write it again"],
    ),
    (
        "row-not-mapping",
        lambda w, t: ["plot", str(_score_json(w, t, lambda d: {**d, "scores": [3]})), "--out", str(t / "p")],
        ["row 0 lacks", "'model'"],
    ),
    (
        "plot-baselines-missing",
        lambda w, t: ["plot", str(w["scores"]), "--out", str(t / "p"), "--baselines", str(t / "b.csv")],
        ["baselines file", "not found"],
    ),
]


def _refused_cleanly(argv: Any, fragments: list[str], world: dict, tmp_path: Path, capsys: Any) -> None:
    """Exit 2 with one clear line, and nothing written in the world or in ``tmp_path``."""
    before = _world_snapshot(world)
    listing = sorted(p.name for p in world["root"].iterdir())
    args = argv(world, tmp_path)
    made = _snapshot(tmp_path)
    code, out = _cli(args, capsys)
    _assert_clean_error(code, out, 2, fragments)
    assert _world_snapshot(world) == before and _snapshot(tmp_path) == made, "a refused command wrote"
    assert sorted(p.name for p in world["root"].iterdir()) == listing


@pytest.mark.parametrize(
    ("case", "argv", "fragments"), SCORE_CASES + PLOT_CASES, ids=[c[0] for c in SCORE_CASES + PLOT_CASES]
)
def test_bad_score_or_plot(
    case: str, argv: Any, fragments: list[str], world: dict, tmp_path: Path, capsys: Any
) -> None:
    _refused_cleanly(argv, fragments, world, tmp_path, capsys)


def PL(*extra: str, ws: str = "16") -> list[str]:
    return [
        "plan",
        "--model",
        "weathermixer",
        "--preset",
        "tiny",
        "--grid",
        "32x64",
        "--world-size",
        ws,
        *extra,
    ]


def PR(w: dict, src: Any, out: Any, *extra: str) -> list[str]:
    return ["data", "prepare", str(src), "--out", str(out), "--no-progress", *extra]


# (id, argv(world, tmp), fragments): plan, data, config validate
OTHER_CASES: list[tuple[str, Any, list[str]]] = [
    ("plan-world-37", lambda w, t: PL(ws="37"), ["--world-size 37", "default --nodes 4", "--nodes 1"]),
    ("plan-world-zero", lambda w, t: PL(ws="0"), ["--world-size 0", "positive integer"]),
    ("plan-world-negative", lambda w, t: PL(ws="-4"), ["--world-size -4", "positive integer"]),
    (
        "plan-gpu-memory-1kb",
        lambda w, t: PL("--gpu-memory", "1KB"),
        ["--gpu-memory '1KB'", "less than any GPU"],
    ),
    (
        "plan-gpu-memory-bare",
        lambda w, t: PL("--gpu-memory", "80"),
        ["--gpu-memory '80' is 80 bytes", "80GB"],
    ),
    ("plan-gpu-memory-word", lambda w, t: PL("--gpu-memory", "lots"), ["--gpu-memory 'lots'", "80GiB"]),
    ("plan-gpu-memory-zero", lambda w, t: PL("--gpu-memory", "0GB"), ["--gpu-memory '0GB'", "such as 80GB"]),
    ("plan-gpu-memory-negative", lambda w, t: PL("--gpu-memory=-8GB"), ["--gpu-memory '-8GB'"]),
    ("plan-nodes-not-divisor", lambda w, t: PL("--nodes", "3"), ["--nodes 3", "divisor of --world-size 16"]),
    ("plan-nodes-zero", lambda w, t: PL("--nodes", "0"), ["--nodes 0", "positive divisor"]),
    ("plan-efficiency-zero", lambda w, t: PL("--efficiency", "0"), ["--efficiency 0", "(0, 1]"]),
    ("plan-efficiency-above-one", lambda w, t: PL("--efficiency", "1.5"), ["--efficiency 1.5", "(0, 1]"]),
    ("plan-tflops-zero", lambda w, t: PL("--gpu-tflops", "0"), ["--gpu-tflops 0", "positive number"]),
    ("plan-link-negative", lambda w, t: PL("--link-gbps", "-1"), ["--link-gbps -1", "positive number"]),
    ("plan-inter-zero", lambda w, t: PL("--inter-gbps", "0"), ["--inter-gbps 0", "positive number"]),
    ("plan-batch-zero", lambda w, t: PL("--batch", "0"), ["--batch 0", "positive integer"]),
    ("plan-global-batch-zero", lambda w, t: PL("--global-batch", "0"), ["--global-batch 0", "positive"]),
    ("plan-channels-two", lambda w, t: PL("--channels", "69,2"), ["--channels '69,2'", "3 integers"]),
    ("plan-channels-word", lambda w, t: PL("--channels", "a,b,c"), ["--channels 'a,b,c'", "integers"]),
    (
        "plan-grid-half",
        lambda w, t: ["plan", "--model", "weathermixer", "--grid", "32x", "--world-size", "4"],
        ["--grid '32x'"],
    ),
    (
        "plan-grid-word",
        lambda w, t: ["plan", "--model", "weathermixer", "--grid", "big", "--world-size", "4"],
        ["--grid 'big'"],
    ),
    (
        "plan-preset-unknown",
        lambda w, t: [
            "plan",
            "--model",
            "weathermixer",
            "--preset",
            "huge",
            "--grid",
            "32x64",
            "--world-size",
            "4",
        ],
        ["'huge'"],
    ),
    (
        "io-report-time-far",
        lambda w, t: ["data", "io-report", str(w["store"]), "--time-index", "99999"],
        ["--time-index 99999 is outside the store's", "choose one in [0,"],
    ),
    (
        "io-report-time-negative",
        lambda w, t: ["data", "io-report", str(w["store"]), "--time-index", "-1"],
        ["--time-index -1 is outside"],
    ),
    (
        "io-report-missing",
        lambda w, t: ["data", "io-report", str(t / "none.zarr")],
        ["none.zarr", "does not exist"],
    ),
    (
        "inspect-missing",
        lambda w, t: ["data", "inspect", str(t / "none.zarr")],
        ["none.zarr", "does not exist"],
    ),
    (
        "prepare-out-inside-source",
        lambda w, t: PR(w, w["store"], w["store"] / "p.zarr"),
        ["--out", "lies inside the source of the prepare", "nothing was written or deleted"],
    ),
    (
        "prepare-out-is-source",
        lambda w, t: PR(w, w["store"], w["store"], "--overwrite"),
        ["is the source of the prepare"],
    ),
    (
        "prepare-out-contains-source",
        lambda w, t: PR(w, w["store"], w["store"].parent, "--overwrite"),
        ["contains the source of the prepare"],
    ),
    (
        "prepare-out-user-folder",
        lambda w, t: PR(w, w["store"], w["mine"], "--overwrite"),
        ["not a jigsaw-earth store store", "remove it yourself"],
    ),
    (
        "prepare-out-forecast",
        lambda w, t: PR(w, w["store"], w["fc"], "--overwrite"),
        ["of another kind ('forecast', not 'store')"],
    ),
    ("prepare-out-exists", lambda w, t: PR(w, w["store"], w["mine"]), ["already exists", "--overwrite"]),
    ("prepare-out-url", lambda w, t: PR(w, w["store"], "memory://p.zarr"), ["'memory://p.zarr' must be"]),
    ("prepare-source-missing", lambda w, t: PR(w, t / "none.zarr", t / "p.zarr"), ["does not exist"]),
    (
        "prepare-levels-missing",
        lambda w, t: PR(w, w["store"], t / "p.zarr", "--levels", "300"),
        ["levels [300]", "are not in"],
    ),
    (
        "synth-over-user-folder",
        lambda w, t: ["data", "synth", "--out", str(w["mine"]), "--overwrite"],
        ["not a jigsaw-earth store store", "Nothing was deleted"],
    ),
    (
        "synth-over-forecast",
        lambda w, t: ["data", "synth", "--out", str(w["fc"]), "--overwrite"],
        ["of another kind ('forecast', not 'store')"],
    ),
    (
        "validate-world-size-zero",
        lambda w, t: ["config", "validate", str(w["cfg"]), "--world-size", "0"],
        ["--world-size 0", "positive integer", "leave it out"],
    ),
    (
        "validate-world-size-negative",
        lambda w, t: ["config", "validate", str(w["cfg"]), "--world-size", "-2"],
        ["--world-size -2", "positive integer"],
    ),
]


@pytest.mark.parametrize(("case", "argv", "fragments"), OTHER_CASES, ids=[c[0] for c in OTHER_CASES])
def test_bad_plan_data_config(
    case: str, argv: Any, fragments: list[str], world: dict, tmp_path: Path, capsys: Any
) -> None:
    _refused_cleanly(argv, fragments, world, tmp_path, capsys)


def test_plot_runs_from_another_directory(
    world: dict, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Store paths in a score JSON are absolute; older relative ones are read against its folder."""
    data = json.loads(world["scores"].read_text())
    assert Path(data["forecast"]).is_absolute() and Path(data["truth"]).is_absolute()
    import os

    rel = {k: os.path.relpath(data[k], world["root"]) for k in ("forecast", "truth")}
    old = world["root"] / "old-scores.json"
    old.write_text(json.dumps({**data, **rel}))
    monkeypatch.chdir(tmp_path)
    try:
        code, out = _cli(["plot", str(old), "--out", str(tmp_path / "plots")], capsys)
    finally:
        old.unlink()
    assert code == 0, out
    assert "no maps drawn" not in out
    assert sorted(p.name for p in (tmp_path / "plots").glob("map-*.png"))
