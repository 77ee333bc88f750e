"""How one Zarr array's chunks lie in storage, and reading a box of it as decoded blocks.

``ChunkFormat.of(array)`` reads a zarr v2 or v3 array's metadata once: array, chunk and shard
shapes, the storage dtype, and the bytes→bytes codecs to undo (zstd, blosc, gzip, crc32c, or any
numcodecs codec). ``blocks(box)`` yields, for every storage object (a shard, or a chunk where
the array is not sharded) that the box touches, that object's chunks as one array of shape
``(chunks along each axis..., chunk shape...)``:

- an uncompressed, densely written shard on local disk is a memory map of the file itself, so
  the bytes are copied once, from the page cache straight into the caller's output;
- otherwise the needed chunks' bytes are fetched (coalesced byte ranges, one round trip per object;
  from a bucket through ``objects.RangeReader``: hedged, many in flight across the reading threads)
  and decoded into a reused scratch buffer.

Arrays whose codecs this module does not know (array→array codecs, v2 filters) are read through
zarr itself, one box per call (``supported`` is False). The caller copies the blocks into place:
see ``reader.TileReader``.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from jigsaw_earth.data.objects import RangeReader, is_object_url
from jigsaw_earth.data.zarr_api import (
    default_buffer_prototype,
    index_at_end,
    little_endian,
    numcodecs_codec,
    sync,
)
from zarr.abc.store import RangeByteRequest, SuffixByteRequest

__all__ = ["Block", "ChunkFormat", "ChunkSource", "local_root"]

log = logging.getLogger(__name__)

EMPTY = np.uint64(2**64 - 1)  # a shard index entry of a chunk that was never written
Box = tuple[tuple[int, int], ...]  # [start, stop) per axis, in storage axis order


@dataclass(frozen=True)
class Block:
    """One storage object's part of a box: its chunks ``chunks[i]`` (each of the chunk shape) and
    ``grid[g...]``, the index in ``chunks`` of the chunk at grid position ``g`` counted from
    ``origin`` (array cells ``origin + g * chunk + offset``). Shards store their chunks in any
    order (zarr-python writes Morton order), so ``grid`` is a permutation, not a reshape."""

    origin: tuple[int, ...]
    chunks: np.ndarray
    grid: np.ndarray
    #: where ``chunks`` is a memory map of an uncompressed local file: that file and the byte offset
    #: of ``chunks[0]`` in it (``placement`` then reads long runs straight into place with ``preadv``)
    file: str | None = None
    offset: int = 0
    #: the storage object's coordinates in the array's grid of objects (shards or chunks)
    coords: tuple[int, ...] = ()


def _bytes_decoder(codec: Any) -> Callable[[Any, Any], Any] | None:
    """``decode(src, dest)`` for a zarr v3 bytes→bytes codec, or None when unknown."""
    from numcodecs import blosc, gzip, zstd
    from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, ZstdCodec

    if isinstance(codec, ZstdCodec):
        return lambda src, dest: zstd.decompress(src, dest)
    if isinstance(codec, BloscCodec):
        return lambda src, dest: blosc.decompress(src, dest)
    if isinstance(codec, GzipCodec):
        g = gzip.GZip()
        return lambda src, dest: g.decode(src, out=dest)
    if isinstance(codec, Crc32cCodec):
        return lambda src, dest: memoryview(src)[:-4]
    inner = numcodecs_codec(codec)  # zarr's numcodecs.* wrappers around a numcodecs codec
    if inner is not None and hasattr(inner, "decode"):
        return lambda src, dest: inner.decode(src, out=dest)
    return None


@dataclass(frozen=True)
class ChunkFormat:
    """Storage facts of one array (see the module docstring); ``supported`` False: read via zarr."""

    path: str  # the array's path in its store
    shape: tuple[int, ...]
    chunk: tuple[int, ...]  # inner chunk shape
    shard: tuple[int, ...] | None  # shard shape of sharded arrays
    dtype: np.dtype  # storage dtype, byte order included
    fill: Any
    order: str  # "C" or "F" (v2 only)
    decoders: tuple[Callable[[Any, Any], Any], ...]  # applied in this order to a stored chunk
    index_crc: bool  # shard index followed by a crc32c checksum
    index_at_end: bool
    key: Callable[[tuple[int, ...]], str]  # storage object grid coordinates -> store key
    supported: bool

    @classmethod
    def of(cls, array: Any) -> ChunkFormat:
        meta = array.metadata
        shape, path = tuple(array.shape), array.path

        def key(coords: tuple[int, ...], m: Any = meta, p: str = path) -> str:
            return f"{p}/{m.encode_chunk_key(coords)}" if p else m.encode_chunk_key(coords)

        base = dict(path=path, shape=shape, fill=array.fill_value, key=key)
        if meta.zarr_format == 2:
            comp = meta.compressor
            ok = not meta.filters and (comp is None or hasattr(comp, "decode"))
            dec = () if comp is None else ((lambda src, dest, c=comp: c.decode(src, out=dest)),)
            return cls(
                **base,
                chunk=tuple(meta.chunks),
                shard=None,
                dtype=np.dtype(array.dtype),
                order=meta.order,
                decoders=dec,
                index_crc=False,
                index_at_end=True,
                supported=ok,
            )
        from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec

        codecs, shard, chunk = list(meta.codecs), None, tuple(array.chunks)
        index_crc, at_end, ok = False, True, True
        if len(codecs) == 1 and isinstance(codecs[0], ShardingCodec):
            sc = codecs[0]
            shard, chunk, codecs = tuple(array.shards), tuple(sc.chunk_shape), list(sc.codecs)
            idx = list(sc.index_codecs)
            ok = (
                bool(idx)
                and isinstance(idx[0], BytesCodec)
                and little_endian(idx[0])
                and all(isinstance(c, Crc32cCodec) for c in idx[1:])
                and len(idx) <= 2
            )
            index_crc = len(idx) == 2
            at_end = index_at_end(sc)
        dtype = np.dtype(array.dtype)
        if not codecs or not isinstance(codecs[0], BytesCodec):
            ok = False  # an array->array codec (transpose, ...) first
        else:
            dtype = dtype.newbyteorder("<" if little_endian(codecs[0]) else ">")
        decoders = [_bytes_decoder(c) for c in codecs[1:]]
        ok = ok and all(d is not None for d in decoders)
        return cls(
            **base,
            chunk=chunk,
            shard=shard,
            dtype=dtype,
            order="C",
            decoders=tuple(reversed([d for d in decoders if d is not None])),
            index_crc=index_crc,
            index_at_end=at_end,
            supported=ok,
        )

    @cached_property
    def object_shape(self) -> tuple[int, ...]:
        """Shape of one storage object (a shard, else a chunk)."""
        return self.shard or self.chunk

    @cached_property
    def chunk_bytes(self) -> int:
        return int(np.prod(self.chunk)) * self.dtype.itemsize

    @cached_property
    def grid(self) -> tuple[int, ...]:
        """Chunks per storage object along each axis."""
        return tuple(s // c for s, c in zip(self.object_shape, self.chunk))


def local_root(store: Any) -> str | None:
    """The folder of a local zarr store (through wrapper stores), else None."""
    import zarr.storage

    while isinstance(store, zarr.storage.WrapperStore):
        store = store._store
    return str(store.root) if isinstance(store, zarr.storage.LocalStore) else None


class _Indexes:
    """Shard indexes by key (a small LRU: a training store's shards do not change under it)."""

    def __init__(self, size: int = 4096):
        self._cache: OrderedDict[str, np.ndarray | None] = OrderedDict()
        self._size, self._lock = size, threading.Lock()

    def get(self, key: str) -> np.ndarray | bool | None:
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        return False

    def put(self, key: str, index: np.ndarray | None) -> None:
        with self._lock:
            self._cache[key] = index
            if len(self._cache) > self._size:
                self._cache.popitem(last=False)


class ChunkSource:
    """Reads boxes of the arrays of one store as blocks; counts the bytes and requests it makes."""

    def __init__(self, store: Any, url: str | None = None, hedge: bool = True):
        self.store, self.root = store, local_root(store)
        #: a bucket's range reads (``objects.RangeReader``: many in flight, hedged); None elsewhere
        self.remote = RangeReader(url, hedge) if url is not None and is_object_url(url) else None
        self._indexes = _Indexes()
        self._scratch = threading.local()
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.requests = 0
        #: when a list: every local byte range read, as ``(file, start, stop)`` (``bench io``'s raw limit)
        self.trace: list[tuple[str, int, int]] | None = None

    # ---- accounting ---------------------------------------------------------------------------
    def reset(self) -> None:
        with self._lock:
            self.bytes_read = self.requests = 0

    def _count(
        self,
        n_bytes: int,
        n_requests: int = 1,
        file: str | None = None,
        spans: list[tuple[int, int]] | None = None,
    ) -> None:
        with self._lock:
            self.bytes_read += n_bytes
            self.requests += n_requests
            if self.trace is not None and file is not None:
                self.trace += [(file, a, b) for a, b in spans or []]

    # ---- bytes --------------------------------------------------------------------------------
    def _file(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))  # type: ignore[arg-type]

    def _get(self, key: str, ranges: list[tuple[int, int]] | None) -> list[Any] | None:
        """Byte ranges ``[a, b)`` of object ``key`` (None: the whole object); None if absent."""
        if self.root is not None:
            try:
                fd = os.open(self._file(key), os.O_RDONLY)
            except FileNotFoundError:
                return None
            try:
                if ranges is None:
                    ranges = [(0, os.fstat(fd).st_size)]
                out = [os.pread(fd, b - a, a) for a, b in ranges]
            finally:
                os.close(fd)
            self._count(sum(len(o) for o in out), len(out), self._file(key), ranges)
            return out
        if self.remote is not None:
            got = self.remote.get(key, ranges)
            if got is not None:
                spans = ranges if ranges is not None else [(0, len(got[0]))]
                self._count(sum(len(o) for o in got), len(got), key, spans)
            return got
        proto = default_buffer_prototype()

        async def fetch() -> list[Any]:
            import asyncio

            reqs = [None] if ranges is None else [RangeByteRequest(a, b) for a, b in ranges]
            return list(await asyncio.gather(*(self.store.get(key, proto, r) for r in reqs)))

        got = sync(fetch())
        if any(g is None for g in got):
            return None
        out = [g.to_bytes() for g in got]
        self._count(sum(len(o) for o in out), len(out))
        return out

    def _shard_index(self, fmt: ChunkFormat, key: str) -> np.ndarray | None:
        """``(grid..., 2)`` offsets and lengths of a shard's chunks, or None for a missing shard."""
        cached = self._indexes.get(key)
        if cached is not False:
            return cached  # type: ignore[return-value]
        n = int(np.prod(fmt.grid))
        size = 16 * n + (4 if fmt.index_crc else 0)
        if self.root is not None:
            try:
                with open(self._file(key), "rb") as f:
                    end = f.seek(0, os.SEEK_END)
                    first = max(0, end - size) if fmt.index_at_end else 0
                    f.seek(first)
                    raw = f.read(size)
            except FileNotFoundError:
                raw = None
            if raw is not None:
                self._count(len(raw), 1, self._file(key), [(first, first + len(raw))])
        elif self.remote is not None:
            got = self.remote.suffix(key, size) if fmt.index_at_end else self.remote.get(key, [(0, size)])
            got = got[0] if isinstance(got, list) else got
            raw = None if got is None else bytes(got)
            if raw is not None:
                self._count(len(raw))
        else:
            proto = default_buffer_prototype()
            req = SuffixByteRequest(size) if fmt.index_at_end else RangeByteRequest(0, size)
            got = sync(self.store.get(key, proto, req))
            raw = None if got is None else got.to_bytes()
            if raw is not None:
                self._count(len(raw))
        index = None if raw is None else self._check_index(fmt, key, raw, size)
        self._indexes.put(key, index)
        return index

    @staticmethod
    def _check_index(fmt: ChunkFormat, key: str, raw: bytes, size: int) -> np.ndarray:
        """The decoded shard index, after its checksum (a truncated or damaged shard: a clear error)."""
        n = 16 * int(np.prod(fmt.grid))
        bad = len(raw) < size
        if not bad and fmt.index_crc:
            import google_crc32c

            bad = google_crc32c.value(raw[:n]) != int.from_bytes(raw[n : n + 4], "little")
        if bad:
            raise ValueError(
                f"the index of shard {key!r} is damaged (checksum or size wrong): the file is "
                f"truncated or overwritten"
            )
        return np.frombuffer(raw[:n], "<u8").reshape(*fmt.grid, 2)

    def _buffer(self, n_bytes: int) -> np.ndarray:
        """A per-thread scratch buffer of at least ``n_bytes`` (reused: no page faults per read)."""
        buf = getattr(self._scratch, "buf", None)
        if buf is None or buf.nbytes < n_bytes:
            buf = np.empty(max(n_bytes, 1 << 20), np.uint8)
            self._scratch.buf = buf
        return buf[:n_bytes]

    # ---- direct reads again (``placement.replay``) -------------------------------------------
    def shard_file(self, fmt: ChunkFormat, coords: tuple[int, ...]) -> tuple[str, np.ndarray] | None:
        """The local file and index of the shard at ``coords``; None where it is absent or not a
        local shard (its bytes then go the general way)."""
        if fmt.shard is None or self.root is None:
            return None
        key = fmt.key(coords)
        index = self._shard_index(fmt, key)
        return None if index is None else (self._file(key), index)

    def count_direct(self, file: str, spans: list[tuple[int, int]]) -> None:
        """Account one storage object's replayed direct reads (one request, as the first read)."""
        self._count(sum(b - a for a, b in spans), 1, file, spans)

    # ---- blocks -------------------------------------------------------------------------------
    def blocks(self, fmt: ChunkFormat, array: Any, box: Box) -> Iterator[Block]:
        """The storage objects' chunks covering ``box``, one ``Block`` per object (see module)."""
        if not fmt.supported:
            yield self._via_zarr(array, box)
            return
        obj = fmt.object_shape
        ranges = [range(a // s, (b - 1) // s + 1) for (a, b), s in zip(box, obj)]
        for coords in np.ndindex(*(len(r) for r in ranges)):
            oc = tuple(r[i] for r, i in zip(ranges, coords))
            origin = tuple(c * s for c, s in zip(oc, obj))
            # chunks of this object that the box touches (object-local chunk coordinates)
            lo = [max(a, o) - o for (a, _), o in zip(box, origin)]
            hi = [min(b, o + s) - o for (_, b), o, s in zip(box, origin, obj)]
            k0 = tuple(x // c for x, c in zip(lo, fmt.chunk))
            k1 = tuple((x - 1) // c + 1 for x, c in zip(hi, fmt.chunk))
            chunks, grid, file, offset = self._object(fmt, fmt.key(oc), k0, k1)
            origin_cell = tuple(o + k * c for o, k, c in zip(origin, k0, fmt.chunk))
            yield Block(origin_cell, chunks, grid, file, offset, oc)

    def _object(
        self, fmt: ChunkFormat, key: str, k0: tuple[int, ...], k1: tuple[int, ...]
    ) -> tuple[np.ndarray, np.ndarray, str | None, int]:
        """Chunks ``[k0, k1)`` of one storage object: ``(chunks, grid, file, offset)`` as in ``Block``."""
        n_grid = tuple(b - a for a, b in zip(k0, k1))
        dense = np.arange(int(np.prod(n_grid))).reshape(n_grid)
        if fmt.shard is None:  # one chunk per object
            got = self._get(key, None)
            return self._decode_into(fmt, [None if got is None else got[0]], key), dense, None, 0
        index = self._shard_index(fmt, key)
        if index is None:
            return self._decode_into(fmt, [None] * dense.size, key), dense, None, 0
        sub = index[tuple(slice(a, b) for a, b in zip(k0, k1))].reshape(-1, 2)
        if not fmt.decoders and fmt.order == "C" and self.root is not None:
            mapped = self._mapped(fmt, key, sub)
            if mapped is not None:
                chunks, first = mapped
                grid = ((sub[:, 0] - first) // fmt.chunk_bytes).astype(np.int64).reshape(n_grid)
                return chunks, grid, self._file(key), first
        return self._decode_into(fmt, self._chunk_bytes(key, sub), key), dense, None, 0

    def _chunk_bytes(self, key: str, sub: np.ndarray) -> list[Any]:
        """Stored bytes of the shard chunks ``sub`` (offset, length rows; None where never written),
        fetched as few coalesced ranges (chunks written next to each other come in one request)."""
        present = np.nonzero(sub[:, 0] != EMPTY)[0]
        out: list[Any] = [None] * len(sub)
        if not len(present):
            return out
        order = present[np.argsort(sub[present, 0])]
        starts, ends = sub[order, 0].astype(np.int64), (sub[order, 0] + sub[order, 1]).astype(np.int64)
        breaks = np.nonzero(starts[1:] != ends[:-1])[0] + 1
        groups = np.split(np.arange(len(order)), breaks)
        got = self._get(key, [(int(starts[g[0]]), int(ends[g[-1]])) for g in groups])
        if got is None:
            return out
        for g, data in zip(groups, got):
            view, base = memoryview(data), int(starts[g[0]])
            for i in g:
                out[order[i]] = view[int(starts[i]) - base : int(ends[i]) - base]
        return out

    def _mapped(self, fmt: ChunkFormat, key: str, sub: np.ndarray) -> tuple[np.ndarray, int] | None:
        """The shard's chunks from the first to the last of ``sub`` as a view of the memory-mapped
        file, and the first one's offset, when every one is stored uncompressed at a multiple of
        the chunk size from it; None otherwise (then they are read and copied)."""
        size = fmt.chunk_bytes
        if len(sub) == 1:
            start = int(sub[0, 0])
            if sub[0, 0] == EMPTY or int(sub[0, 1]) != size:
                return None
        else:
            offsets, lengths = sub[:, 0], sub[:, 1]
            if (offsets == EMPTY).any() or (lengths != size).any():
                return None
            start = int(offsets.min())
            if ((offsets - start) % size).any():
                return None
        stop = int(sub[:, 0].max()) + size
        with open(self._file(key), "rb") as f:
            file_size = os.fstat(f.fileno()).st_size
            if stop > file_size:
                raise ValueError(
                    f"chunk data of {key!r} ends at byte {stop} but the file holds {file_size}: "
                    f"the shard is truncated"
                )
            page = start - start % mmap.ALLOCATIONGRANULARITY
            mm = mmap.mmap(f.fileno(), stop - page, access=mmap.ACCESS_READ, offset=page)
        spans = None
        if self.trace is not None:  # the byte ranges of the wanted chunks, for bench io's raw reads
            offsets = np.sort(sub[:, 0]).astype(np.int64)
            breaks = np.nonzero(np.diff(offsets) != size)[0] + 1
            spans = [(int(r[0]), int(r[-1]) + size) for r in np.split(offsets, breaks)]
        self._count(len(sub) * size, 1, self._file(key), spans)
        flat = np.frombuffer(mm, dtype=fmt.dtype, offset=start - page)
        return flat.reshape(-1, *fmt.chunk), start

    def _decode_into(self, fmt: ChunkFormat, stored: list[Any], key: str) -> np.ndarray:
        """Decode stored chunks (None: never written, the fill value) into ``(n, chunk...)``."""
        n = len(stored)
        out = self._buffer(n * fmt.chunk_bytes).view(fmt.dtype).reshape(n, *fmt.chunk)
        for i, raw in enumerate(stored):
            if raw is None:
                out[i] = fmt.fill if fmt.fill is not None else 0
                continue
            dest = out[i].reshape(-1).view(np.uint8)
            try:
                data: Any = raw
                for k, dec in enumerate(fmt.decoders):
                    last = k == len(fmt.decoders) - 1 and fmt.order == "C"
                    data = dec(data, dest if last else None)
                if not (isinstance(data, np.ndarray) and data.ctypes.data == dest.ctypes.data):
                    flat = np.frombuffer(data, dtype=fmt.dtype)
                    if flat.size != out[i].size:
                        raise ValueError(f"{flat.size} values where a chunk holds {out[i].size}")
                    out[i] = flat.reshape(fmt.chunk, order=fmt.order)
            except Exception as err:
                raise ValueError(f"chunk of {key!r} cannot be decoded: {type(err).__name__}: {err}") from err
        return out

    def _via_zarr(self, array: Any, box: Box) -> Block:
        """A box read through zarr itself (codecs this module does not decode)."""
        data = np.asarray(array[tuple(slice(a, b) for a, b in box)])
        self._count(data.nbytes)
        return Block(tuple(a for a, _ in box), data[None], np.zeros((1,) * data.ndim, np.int64))
