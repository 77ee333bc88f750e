"""torch.distributed.checkpoint (DCP) planners for blocks of canonical global tensors.

Every tensor we save is a rectangular block ``full[offsets : offsets + shape]`` of a global
tensor (``ShardSpec``). DTensor can only describe ``torch.chunk``'s split and ShardedTensor
needs a process group even on one rank, so we describe the blocks to DCP directly: the save
planner emits one ``WriteItem`` per block with its global offsets (DCP's checkpoint metadata
then lists every chunk), and the load planner asks DCP for the overlap of each saved chunk
with this rank's block (``create_read_items_for_chunk_list``, DCP's own resharding). Any mesh
can therefore read a checkpoint written on any other mesh.

Loading never unpickles arbitrary objects: tensor data goes through ``torch.load(weights_only=
True)`` inside DCP, byte (pickled) items are never written nor read, and the ``.metadata``
file, a pickle, is read by an unpickler that accepts only DCP's own metadata classes.
"""

from __future__ import annotations

import dataclasses
import io
import pathlib
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    ReadItem,
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

__all__ = ["Block", "BlockLoadPlanner", "BlockSavePlanner", "SafeFileSystemReader"]


@dataclasses.dataclass(frozen=True)
class Block:
    """This rank's block ``tensor`` of the global tensor ``global_shape`` at ``offsets``."""

    tensor: torch.Tensor
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]

    def chunk(self) -> ChunkStorageMetadata:
        return ChunkStorageMetadata(offsets=torch.Size(self.offsets), sizes=self.tensor.shape)


class BlockSavePlanner(DefaultSavePlanner):
    """Writes each ``Block`` as a DCP shard at its global offsets."""

    def __init__(self, blocks: dict[str, Block]):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.blocks = blocks

    def create_local_plan(self) -> SavePlan:
        items = []
        for fqn, b in self.blocks.items():
            t = b.tensor
            items.append(
                WriteItem(
                    index=MetadataIndex(fqn, torch.Size(b.offsets)),
                    type=WriteItemType.SHARD,
                    tensor_data=TensorWriteData(
                        chunk=b.chunk(),
                        properties=TensorProperties.create_from_tensor(t),
                        size=torch.Size(b.global_shape),
                    ),
                )
            )
        self.plan = SavePlan(items)
        return self.plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO:
        return self.blocks[write_item.index.fqn].tensor.detach()


class BlockLoadPlanner(DefaultLoadPlanner):
    """Reads, for each ``Block``, the parts of the saved chunks that overlap it."""

    def __init__(self, blocks: dict[str, Block]):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.blocks = blocks

    def create_local_plan(self) -> LoadPlan:
        assert self.metadata is not None
        items: list[ReadItem] = []
        for fqn, b in self.blocks.items():
            md = self.metadata.state_dict_metadata.get(fqn)
            if not isinstance(md, TensorStorageMetadata):
                raise ValueError(f"checkpoint has no tensor named {fqn!r}")
            items += create_read_items_for_chunk_list(fqn, md, [b.chunk()])
        return LoadPlan(items)

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        return self.blocks[index.fqn].tensor

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        raise ValueError(f"refusing to unpickle byte item {read_item.dest_index.fqn!r} from a checkpoint")


# ------------------------------------------------------------------------ safe metadata reading
_ALLOWED: dict[tuple[str, str], Any] = {
    ("torch.distributed.checkpoint.metadata", n): getattr(
        __import__("torch.distributed.checkpoint.metadata", fromlist=[n]), n
    )
    for n in (
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    )
}
_ALLOWED.update(
    {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): __import__(
            "torch.distributed.checkpoint.filesystem", fromlist=["_StorageInfo"]
        )._StorageInfo,
        ("torch.serialization", "_get_layout"): torch.serialization._get_layout,  # name → layout
        ("torch", "Size"): torch.Size,
        ("pathlib", "PosixPath"): pathlib.PurePosixPath,  # StorageMeta.checkpoint_id (a path string)
        ("pathlib", "WindowsPath"): pathlib.PureWindowsPath,
        # Python 3.13 and later pickle paths under the module that defines them now
        ("pathlib._local", "PosixPath"): pathlib.PurePosixPath,
        ("pathlib._local", "WindowsPath"): pathlib.PureWindowsPath,
        ("torch", "layout"): torch.layout,
        ("torch", "strided"): torch.strided,
        ("collections", "OrderedDict"): __import__("collections").OrderedDict,
        ("builtins", "set"): set,
        ("builtins", "frozenset"): frozenset,
    }
)
_DTYPES = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}


class _RestrictedUnpickler(pickle.Unpickler):
    """Python's documented 'restricting globals' pattern: only DCP metadata types load."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and name in _DTYPES:
            return _DTYPES[name]
        if module == "torch" and name in ("contiguous_format", "channels_last", "preserve_format"):
            return getattr(torch, name)
        value = _ALLOWED.get((module, name))
        if value is None:
            raise pickle.UnpicklingError(
                f"checkpoint metadata refers to {module}.{name}, which is not a DCP metadata type; "
                "refusing to unpickle it (the file is not a jigsaw-earth checkpoint or was tampered with)"
            )
        return value


def safe_load_metadata(raw: bytes) -> Metadata:
    md = _RestrictedUnpickler(io.BytesIO(raw)).load()
    if not isinstance(md, Metadata):
        raise pickle.UnpicklingError(f"checkpoint metadata is a {type(md).__name__}, not DCP Metadata")
    return md


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose metadata is read with the restricted unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            metadata = safe_load_metadata(f.read())
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata
