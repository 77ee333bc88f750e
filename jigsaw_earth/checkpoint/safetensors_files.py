"""Consolidated safetensors files written in place by the ranks that hold the blocks, read back by block.

A safetensors file is an 8-byte little-endian header length, a JSON header (each tensor's dtype,
shape and byte range; a string → string ``__metadata__``) and then the tensors' bytes, row-major,
back to back. Every rank derives the same layout from the global shapes (``plan_files``: tensors
in name order, a new file when the next tensor would pass ``max_bytes``; a larger tensor gets a
file of its own, as Hugging Face shards its checkpoints). Rank 0 writes each header and sizes
each file (``create_files``); every rank then writes its blocks into place (``write_block``: one
``os.pwrite`` per contiguous run of the block, straight from the tensor's memory). No rank
gathers a tensor, and none holds more than its own blocks (a block on a GPU crosses to the host
one tensor at a time). The files are plain safetensors: ``safetensors.torch.load_file`` reads
them whole; ``SafetensorsFiles`` reads one rank's blocks back the same way, run by run, into the
rank's tensors.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .planner import Block

__all__ = [
    "DTYPES",
    "FileLayout",
    "SafetensorsFiles",
    "create_files",
    "plan_files",
    "read_header",
    "write_block",
]

#: torch dtype → safetensors dtype name
DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_ITEM = {name: torch.empty((), dtype=dt).element_size() for dt, name in DTYPES.items()}


@dataclass(frozen=True)
class FileLayout:
    """One file: its name, its header (padded to 8 bytes) and where each tensor's bytes start."""

    name: str
    header: bytes
    tensors: dict[str, tuple[tuple[int, ...], str, int]]  # name → (shape, dtype name, start in file)

    @property
    def size(self) -> int:
        return len(self.header) + sum(_nbytes(s, d) for s, d, _ in self.tensors.values())


def _nbytes(shape: tuple[int, ...], dtype: str) -> int:
    return math.prod(shape) * _ITEM[dtype]


def _header(entries: dict[str, tuple[tuple[int, ...], str]], metadata: Mapping[str, str]) -> bytes:
    body: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, (shape, dtype) in entries.items():
        end = offset + _nbytes(shape, dtype)
        body[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(body, separators=(",", ":")).encode()
    text += b" " * (-(len(text) + 8) % 8)  # the data starts 8-byte aligned, as safetensors pads it
    return struct.pack("<Q", len(text)) + text


def plan_files(
    tensors: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
    max_bytes: int,
    stem: str = "model",
    metadata: Mapping[str, str] | None = None,
) -> list[FileLayout]:
    """The files of ``tensors`` (name → global shape, dtype), at most ``max_bytes`` of tensor data
    each unless one tensor is larger: ``STEM.safetensors``, or ``STEM-00001-of-0000N.safetensors``.
    The same on every rank (it depends on the names and shapes only)."""
    groups: list[dict[str, tuple[tuple[int, ...], str]]] = [{}]
    used = 0
    for name in sorted(tensors):
        shape, dtype = tensors[name]
        if dtype not in DTYPES:
            raise ValueError(f"tensor {name!r} is {dtype}, which safetensors cannot hold")
        n = _nbytes(tuple(shape), DTYPES[dtype])
        if groups[-1] and used + n > max_bytes:
            groups.append({})
            used = 0
        groups[-1][name] = (tuple(int(x) for x in shape), DTYPES[dtype])
        used += n
    names = (
        [f"{stem}.safetensors"]
        if len(groups) == 1
        else [f"{stem}-{k + 1:05d}-of-{len(groups):05d}.safetensors" for k in range(len(groups))]
    )
    layouts = []
    for name, entries in zip(names, groups, strict=True):
        header = _header(entries, metadata or {})
        start, placed = len(header), {}
        for key, (shape, dtype) in entries.items():
            placed[key] = (shape, dtype, start)
            start += _nbytes(shape, dtype)
        layouts.append(FileLayout(name, header, placed))
    return layouts


def create_files(folder: Path, layouts: list[FileLayout]) -> None:
    """Write each file's header and give it its full size (the data still zeros): rank 0, once,
    before any rank writes a block."""
    for layout in layouts:
        with open(folder / layout.name, "wb") as f:
            f.write(layout.header)
            f.truncate(layout.size)


def _runs(
    global_shape: tuple[int, ...], offsets: tuple[int, ...], sizes: tuple[int, ...]
) -> Iterator[tuple[int, int, int]]:
    """``(element offset in the global tensor, element offset in the block, elements)`` of every
    contiguous run of a block (row-major): the trailing dimensions the block spans whole run on."""
    d = len(global_shape)
    k = d - 1
    while k > 0 and sizes[k] == global_shape[k]:
        k -= 1
    k = max(k, 0)
    if d == 0:
        yield 0, 0, 1
        return
    run = sizes[k] * math.prod(global_shape[k + 1 :])
    strides = [math.prod(global_shape[j + 1 :]) for j in range(d)]
    for local, idx in enumerate(itertools.product(*(range(sizes[j]) for j in range(k)))):
        start = sum((offsets[j] + idx[j]) * strides[j] for j in range(k)) + offsets[k] * strides[k]
        yield start, local * run, run


def write_block(folder: Path, layout: FileLayout, name: str, block: Block) -> int:
    """Write this rank's ``block`` of tensor ``name`` into its place in ``layout``'s file; returns the
    bytes written."""
    shape, dtype, start = layout.tensors[name]
    t = block.tensor.detach()
    if DTYPES.get(t.dtype) != dtype or tuple(block.global_shape) != shape:
        raise ValueError(
            f"{name}: a block of {t.dtype} {tuple(block.global_shape)}, the file layout's is {dtype} {shape}"
        )
    if t.numel() == 0:
        return 0
    host = t.to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
    item = _ITEM[dtype]
    fd = os.open(folder / layout.name, os.O_WRONLY)
    try:
        _copy_runs(
            fd, memoryview(host), item, start, _runs(shape, tuple(block.offsets), tuple(t.shape)), True
        )
        os.fsync(fd)
    finally:
        os.close(fd)
    return t.numel() * item


def read_header(path: Path) -> tuple[dict[str, Any], int, int]:
    """A safetensors file's header (tensors and ``__metadata__``), where its data start and the
    bytes it declares in all; ``ValueError`` naming the file when it is not one."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ValueError(f"{path.name} is {len(head)} bytes long: not a safetensors file")
            (n,) = struct.unpack("<Q", head)
            if n > 100 * 2**20:
                raise ValueError(f"{path.name} declares a {n}-byte header: not a safetensors file")
            header = json.loads(f.read(n))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path.name}: its header is not JSON ({err}): not a safetensors file") from None
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    return header, 8 + n, 8 + n + max(ends, default=0)


def _copy_runs(fd: int, view: memoryview, item: int, start: int, runs: Iterator[tuple[int, int, int]],
               write: bool) -> None:  # fmt: skip
    """``pwrite`` (``write``) or ``preadv`` every run between the block's bytes ``view`` and the file."""
    for global_at, local_at, n in runs:
        data = view[local_at * item : (local_at + n) * item]
        at = start + global_at * item
        while data:
            done = os.pwrite(fd, data, at) if write else os.preadv(fd, [data], at)
            if done <= 0:
                raise OSError(f"the file ends at byte {at}, inside a tensor: it is truncated")
            data, at = data[done:], at + done


class SafetensorsFiles:
    """A folder's safetensors files, read block by block (a context manager): each file's header is
    checked by ``safetensors`` itself (``safe_open``) and read once; a block is read with
    ``os.preadv``, one call per contiguous run, straight into the target tensor when it is a
    contiguous CPU tensor of the file's dtype (else into a host buffer of the block): no rank maps
    or reads more than its blocks."""

    def __init__(self, folder: Path, fix: str = ""):
        self.folder, self.fix = Path(folder), fix
        self.headers: dict[str, tuple[dict[str, Any], int]] = {}

    def __enter__(self) -> SafetensorsFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.headers.clear()

    def header(self, file: str) -> tuple[dict[str, Any], int]:
        """The file's header and where its data start, the file checked by ``safetensors``."""
        from safetensors import safe_open

        if file not in self.headers:
            path = self.folder / file
            try:
                with safe_open(str(path), framework="pt", device="cpu") as f:
                    f.metadata()
            except Exception as err:  # safetensors raises its own error types on a bad file
                raise ValueError(f"{path} is not a readable safetensors file ({err}); {self.fix}") from None
            header, data_start, _ = read_header(path)
            self.headers[file] = (header, data_start)
        return self.headers[file]

    def _into(self, file: str, name: str, offsets: tuple[int, ...], out: torch.Tensor) -> None:
        header, data_start = self.header(file)
        info = header.get(name)
        if info is None:
            raise ValueError(f"{self.folder / file} holds no tensor {name!r}; {self.fix}")
        shape, dtype = tuple(info["shape"]), info["dtype"]
        if DTYPES.get(out.dtype) != dtype:
            raise ValueError(f"{self.folder / file}: {name} is {dtype}, not {out.dtype}; {self.fix}")
        if out.numel() == 0:
            return
        view = memoryview(out.reshape(-1).view(torch.uint8).numpy())
        fd = os.open(self.folder / file, os.O_RDONLY)
        try:
            runs = _runs(shape, offsets, tuple(out.shape))
            _copy_runs(fd, view, _ITEM[dtype], data_start + info["data_offsets"][0], runs, write=False)
        except OSError as err:
            raise ValueError(f"cannot read {name} from {self.folder / file}: {err}; {self.fix}") from None
        finally:
            os.close(fd)

    def read(self, file: str, name: str, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> torch.Tensor:
        """A new CPU tensor holding ``full[offsets : offsets + sizes]`` of tensor ``name`` of ``file``."""
        header, _ = self.header(file)
        dtype = {v: k for k, v in DTYPES.items()}[header[name]["dtype"]] if name in header else torch.float32
        out = torch.empty(sizes, dtype=dtype)
        self._into(file, name, offsets, out)
        return out

    @torch.no_grad()
    def fill(
        self, weight_map: Mapping[str, str], targets: Mapping[str, Block], prefix: str = "model/"
    ) -> None:
        """Read into each target block (keys ``PREFIX<name>``) its part of tensor ``name`` of the file
        ``weight_map`` names: each rank reads only its blocks, one at a time."""
        for key, block in targets.items():
            name = key.removeprefix(prefix)
            t = block.tensor
            if t.device.type == "cpu" and t.is_contiguous():
                self._into(weight_map[name], name, tuple(block.offsets), t)
            else:
                t.copy_(self.read(weight_map[name], name, tuple(block.offsets), tuple(t.shape)))
