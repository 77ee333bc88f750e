"""A shared model's folder: what it holds, opened with its integrity checked, read by any rank's blocks.

Layout (everything a user needs, nothing else; it uploads to Hugging Face as it is)::

    README.md                         the model card (Hugging Face's YAML header)
    contract.json                     the input contract (``contract.py``): also the model's name, preset, …
    model.safetensors                 the weights: consolidated global tensors, or
    model-00001-of-0000N.safetensors    several files of bounded size, with
    model.safetensors.index.json      Hugging Face's index (tensor → file)
    static.safetensors                the static fields as the model reads them (normalised)
    reference.safetensors             a reference forecast's initial state, physical units
    reference.json                    its expected output: statistics per field and step, the tolerance
    jigsaw_earth.json                 the export's record: every file's size and SHA-256, the contract's

``ModelFolder.open`` refuses, naming the file, a folder with a file missing or of another size
than the export wrote (truncated), a ``contract.json`` changed since the export (its SHA-256 is in
the record and in every weight file's header) or a weight file that is not safetensors. Loading
refuses weights whose shapes differ from the model the contract builds, naming file and tensor.
``verify_files`` compares every file's SHA-256 with the record (``model verify``). The model card
``README.md`` is the publisher's to edit (a hub edits it too): it is recorded, never checked.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..checkpoint.planner import Block
from ..checkpoint.safetensors_files import SafetensorsFiles, read_header
from ..checkpoint.state import model_blocks
from ..ownership import FOLDER_MARKER, read_marker
from .contract import FORMAT, VERSION

__all__ = [
    "CARD",
    "CONTRACT",
    "INDEX",
    "KIND",
    "REFERENCE",
    "REFERENCE_STATE",
    "STATIC",
    "ModelFolder",
    "file_sha256",
    "is_model_folder",
]

log = logging.getLogger(__name__)

KIND = "model"  # the ownership kind of an exported folder (``ownership.check_output``)
CARD, CONTRACT, INDEX = "README.md", "contract.json", "model.safetensors.index.json"
STATIC, REFERENCE_STATE, REFERENCE = "static.safetensors", "reference.safetensors", "reference.json"
FIX = "download or copy the folder again, or export the model again (jigsaw-earth model export)"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def is_model_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder ``model export`` wrote (its record says so)."""
    return (read_marker(path) or {}).get("kind") == KIND


@dataclass
class ModelFolder:
    """An exported model, opened: its contract, record and weight index; files checked present,
    whole and unchanged in size, the contract unchanged."""

    path: Path
    contract: dict[str, Any]
    record: dict[str, Any]
    weight_map: dict[str, str]

    @classmethod
    def open(cls, path: str | Path) -> ModelFolder:
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(
                f"model folder {path} does not exist; give the folder `jigsaw-earth model export` wrote"
            )
        record = read_marker(path)
        if record is None or record.get("kind") != KIND:
            raise ValueError(
                f"{path} is not a model folder of jigsaw-earth (no {FOLDER_MARKER} of kind {KIND!r}); give "
                "the folder `jigsaw-earth model export` wrote"
            )
        if record.get("format") != FORMAT or record.get("version") != VERSION:
            raise ValueError(
                f"{path / FOLDER_MARKER}: format {record.get('format')!r} version {record.get('version')!r}; "
                f"this jigsaw-earth reads {FORMAT!r} version {VERSION}"
            )
        for name, info in record["files"].items():
            file = path / name
            if not file.is_file():
                raise ValueError(
                    f"{path} lacks {name}, which the export wrote ({info['bytes']} bytes); {FIX}"
                )
            size = file.stat().st_size
            if size != info["bytes"] and name not in (CONTRACT, CARD):  # the contract: by its hash below
                what = "truncated" if size < info["bytes"] else "longer than the export wrote"
                raise ValueError(f"{file} is {size} bytes, the export wrote {info['bytes']}: {what}; {FIX}")
        contract_file = path / CONTRACT
        if file_sha256(contract_file) != record["contract_sha256"]:
            raise ValueError(
                f"{contract_file} was changed after the export (its SHA-256 differs from the one in "
                f"{FOLDER_MARKER} and in the weights' headers); restore it: the contract must describe the "
                f"inputs the weights were trained on. {FIX}"
            )
        contract = json.loads(contract_file.read_text())
        index = json.loads((path / INDEX).read_text())
        folder = cls(path, contract, record, dict(index["weight_map"]))
        for file in sorted(set(folder.weight_map.values())):
            header, _, declared = read_header(path / file)
            meta = header.get("__metadata__", {})
            if meta.get("contract_sha256") != record["contract_sha256"]:
                raise ValueError(
                    f"{path / file} was written for another contract (its header's contract_sha256 "
                    f"{meta.get('contract_sha256')!r} is not {CONTRACT}'s); {FIX}"
                )
            if declared != record["files"][file]["bytes"]:
                raise ValueError(f"{path / file}: its header declares {declared} bytes, the file has "
                                 f"{record['files'][file]['bytes']}; {FIX}")  # fmt: skip
        return folder

    @property
    def step(self) -> int:
        return int(self.contract["training"]["step"])

    def shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Every weight's global shape and the file holding it, from the files' headers."""
        out = {}
        for file in sorted(set(self.weight_map.values())):
            header, _, _ = read_header(self.path / file)
            for name, info in header.items():
                if name != "__metadata__":
                    out[name] = (tuple(info["shape"]), file)
        return out

    def check_model(self, model: nn.Module) -> dict[str, tuple[int, ...]]:
        """Refuse weights that do not fit ``model`` (a tensor missing on either side, another
        shape), naming the file and tensor; returns every weight's global shape by ``model/`` key."""
        saved = self.shapes()
        mine = {k.removeprefix("model/"): b for k, (b, _) in model_blocks(model).items()}
        missing = sorted(set(mine) - set(saved))
        if missing:
            raise ValueError(
                f"{self.path} has no weight {missing[0]} ({len(missing)} missing) for the model its "
                f"{CONTRACT} builds; {FIX}"
            )
        extra = sorted(set(saved) - set(mine))
        if extra:
            raise ValueError(
                f"{self.path / saved[extra[0]][1]} holds {extra[0]}, which the model its {CONTRACT} builds "
                f"lacks ({len(extra)} such); {FIX}"
            )
        for name, block in mine.items():
            shape, file = saved[name]
            if shape != tuple(block.global_shape):
                raise ValueError(
                    f"{self.path / file}: {name} has shape {shape}, the model its {CONTRACT} builds has "
                    f"{tuple(block.global_shape)}; {FIX}"
                )
        return {f"model/{k}": v[0] for k, v in saved.items()}

    def fill(self, targets: dict[str, Block]) -> None:
        """Read each target block (keys ``model/<name>``) from the weight files, only its bytes."""
        with SafetensorsFiles(self.path, FIX) as files:
            files.fill(self.weight_map, targets)

    def load(self, model: nn.Module) -> int:
        """Fill this rank's blocks of ``model`` (built from the contract, on any mesh) from the weights;
        returns the training step the weights are from."""
        self.check_model(model)
        targets = {
            k: Block(b.tensor.detach(), b.global_shape, b.offsets)
            for k, (b, _) in model_blocks(model).items()
        }
        self.fill(targets)
        return self.step

    def read(self, file: str, name: str, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> torch.Tensor:
        """A block of tensor ``name`` of ``file`` (static fields, the reference state)."""
        with SafetensorsFiles(self.path, FIX) as files:
            return files.read(file, name, offsets, sizes)

    def verify_files(self) -> list[str]:
        """One line per file whose SHA-256 differs from the export's record (empty: all as written)."""
        bad = []
        for name, info in sorted(self.record["files"].items()):
            if name != CARD and file_sha256(self.path / name) != info["sha256"]:
                bad.append(
                    f"{name}: its SHA-256 differs from the export's ({info['sha256'][:16]}…): changed since"
                )
        return bad
