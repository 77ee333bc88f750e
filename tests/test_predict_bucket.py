"""A forecast written into an S3 bucket (a real SeaweedFS on 127.0.0.1, ``object_store.py``).

The tiny model of ``test_predict_stop`` forecasts 6 inits × 8 steps in 3 batches of 2 inits:

* in process (1 rank): ``--out s3://…`` stopped by SIGTERM after model step 3 of batch 2 exits 75 with
  batch 1 recorded as objects under the prefix; the unfinished store is refused by ``score`` naming it,
  and a second predict while a live process holds its lock is refused naming the holder; the same
  command resumes to objects equal, key for key and byte for byte, to the files of ``--out local.zarr``;
  the same command again is a no-op (exit 0, every object's ETag and time unchanged); a bucket is
  refused for ``--format grib2`` and for ``--unfinished``/``--remove-unfinished``, and a prefix holding
  other objects is refused before anything is written;
* slow: the same on 2 ranks under ``jigsaw-earth launch`` (the signal forwarded by the launcher).

Skipped, with the reason, where ``weed`` is not installed.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
from pathlib import Path

import pytest

from tests.object_store import WHY_MISSING, S3Server, weed_binary

from .test_predict_resume import _files, _main, train_tiny
from .test_predict_stop import HOOK, _launch, _launched, _write_config

pytestmark = pytest.mark.skipif(weed_binary() is None, reason=WHY_MISSING)
FORECAST = ["--steps", "8", "--max-inits", "6", "--batch-size", "2"]  # 3 batches of 2 inits
STOP_AFTER = 11  # model steps: step 3 of batch 2


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server.start(tmp_path_factory.mktemp("seaweedfs"))
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    import obstore
    from jigsaw_earth.data.objects import object_store

    obstore.put(object_store("s3://forecasts"), "README", b"the bucket of the tests")  # makes the bucket
    yield server
    server.stop()
    for k, v in saved.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``test_predict_stop``'s model: its store and run."""
    return train_tiny(tmp_path_factory.mktemp("bucket"))


def _objects(url: str) -> dict[str, tuple[str, str]]:
    """Every object under ``url``: (ETag, last modified)."""
    import obstore
    from jigsaw_earth.data.objects import object_store

    return {str(o["path"]): (str(o.get("e_tag")), str(o["last_modified"]))
            for o in obstore.list(object_store(url)).collect()}  # fmt: skip


def _hashes(url: str) -> dict[str, str]:
    """Every object under ``url``: the sha256 of its bytes (as ``_files`` hashes a folder's files)."""
    import obstore
    from jigsaw_earth.data.objects import object_store

    store = object_store(url)
    return {k: hashlib.sha256(bytes(obstore.get(store, k).bytes())).hexdigest() for k in _objects(url)}


def _stop_after(monkeypatch: pytest.MonkeyPatch, steps: int) -> None:
    """SIGTERM to this process after model step ``steps`` (handled on the main thread, before the next)."""
    from jigsaw_earth.inference import rollout

    step, done = rollout.Rollout.step, [0]

    def counted(self, *args, **kwargs):
        out = step(self, *args, **kwargs)
        done[0] += 1
        if done[0] == steps:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(rollout.Rollout, "step", counted)


def test_a_bucket_forecast_stops_resumes_to_the_local_bytes_and_reruns_as_a_no_op(
    s3, trained: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, quiet_signals
) -> None:
    import obstore
    from jigsaw_earth.data.objects import object_store

    from jigsaw_earth.inference.unfinished import holder

    config = _write_config(trained, tmp_path, {})
    base = ["predict", str(config), *FORECAST]
    local, url = tmp_path / "fc.zarr", "s3://forecasts/fc.zarr"
    assert _main([*base, "--out", str(local)], capsys)[0] == 0

    _stop_after(monkeypatch, STOP_AFTER)
    code, text = _main([*base, "--out", url], capsys)
    monkeypatch.undo()
    assert code == 75 and "stopped on SIGTERM in batch 2 of 3, after model step 3 of 8" in text, text
    assert f"1 of 3 batches (2 of 6 inits) are recorded in {url}" in text, text
    keys = _objects(url)
    assert {"_progress/request.json", "_progress/rank-00000.json", "_progress/folder.json"} <= keys.keys()
    assert "_progress/lock" not in keys  # released at the stop
    code, text = _main(["score", url, "--truth", str(trained / "data.zarr")], capsys)
    assert code == 2 and f"{url} is marked unfinished" in text, text

    store = object_store(url)  # a live holder (this process) refuses a second predict, naming it
    obstore.put(store, "_progress/lock", json.dumps(holder()).encode())
    code, text = _main([*base, "--out", url], capsys)
    assert code == 2 and f"{url} is being written by process {os.getpid()} on {socket.gethostname()}" in text
    obstore.delete(store, "_progress/lock")

    code, text = _main([*base, "--out", url], capsys)
    assert code == 0 and f"wrote {url}" in text, text
    assert _hashes(url) == _files(local), "the bucket's objects differ from the local store's files"

    before = _objects(url)
    code, text = _main([*base, "--out", url], capsys)
    assert code == 0 and f"{url} is complete: it holds this forecast" in text, text
    assert _objects(url) == before, "the rerun wrote objects"
    code, text = _main([*base, "--steps", "4", "--out", url], capsys)
    assert code == 2 and "holds a complete forecast of another request" in text, text


def test_a_bucket_is_refused_for_files_for_the_unfinished_listing_and_over_other_objects(
    s3, trained: Path, tmp_path: Path, capsys
) -> None:
    import obstore
    from jigsaw_earth.data.objects import object_store

    config = _write_config(trained, tmp_path, {})
    base = ["predict", str(config), *FORECAST]
    code, text = _main([*base, "--format", "grib2", "--out", "s3://forecasts/fc-grib"], capsys)
    assert code == 2 and "a bucket takes a forecast as a Zarr store (--format zarr)" in text, text
    for option in ("--unfinished", "--remove-unfinished"):
        code, text = _main(["predict", option, "s3://forecasts/fc.zarr"], capsys)
        assert code == 2 and "lists and removes unfinished forecasts in local folders" in text, text
    url = "s3://forecasts/mine"
    obstore.put(object_store(url), "notes.txt", b"mine")
    code, text = _main([*base, "--out", url], capsys)
    assert code == 2 and f"--out {url} holds objects, not a forecast of predict" in text, text
    assert list(_objects(url)) == ["notes.txt"]


@pytest.mark.slow
def test_two_ranks_write_the_local_store_into_a_bucket_stop_resume_and_rerun_as_a_no_op(
    s3, trained: Path, tmp_path: Path
) -> None:
    """Under ``jigsaw-earth launch`` on 2 ranks (lon = 2): SIGTERM to the launcher after model step 3
    of batch 2 (rank 0's hook, ``test_predict_stop.HOOK``)."""
    config = _write_config(trained, tmp_path, {"lon": 2})
    argv = ["predict", str(config), *FORECAST]
    local, url = tmp_path / "fc.zarr", "s3://forecasts/fc-2.zarr"
    _launched([*argv, "--out", str(local)], tmp_path / "local.txt")
    hook, stamp = tmp_path / "hook", tmp_path / "signalled"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    env = {"PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]),
           "JIGSAW_TEST_STOP_AFTER_STEP": str(STOP_AFTER), "JIGSAW_TEST_STOP_STAMP": str(stamp)}  # fmt: skip
    proc = _launch([*argv, "--out", url], tmp_path / "stopped.txt", env)
    proc.wait(timeout=300)
    text = (tmp_path / "stopped.txt").read_text()
    assert proc.returncode == 75 and "ranks exited with 75, 75" in text, text[-3000:]
    assert "stopped on SIGTERM in batch 2 of 3, after model step 3 of 8" in text, text[-3000:]
    assert {"_progress/rank-00000.json", "_progress/rank-00001.json"} <= _objects(url).keys()
    _launched([*argv, "--out", url], tmp_path / "resumed.txt")
    assert _hashes(url) == _files(local), "the bucket's objects differ from the local store's files"
    before = _objects(url)
    text = _launched([*argv, "--out", url], tmp_path / "again.txt")
    assert f"{url} is complete: it holds this forecast" in text and _objects(url) == before, text[-3000:]
