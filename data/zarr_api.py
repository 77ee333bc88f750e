"""What the data pipeline reads from zarr-python beyond opening arrays, the same on every zarr 3
release it runs with (3.1 on Python 3.11, the newest 3.x on Python 3.12 and later).

The one difference that matters here: up to zarr 3.1 a codec's settings such as
``BytesCodec.endian`` and ``ShardingCodec.index_location`` are ``enum.Enum`` members; from zarr 3.2
they are plain strings (the enum classes remain only as deprecated shims). A codec's ``to_dict()``,
its entry in ``zarr.json``, holds the Zarr v3 specification's strings on every release, so settings
are read from there (``codec_config``), never from the attributes.

``sync`` is zarr's own way of running a store coroutine on its event loop; zarr has no public name
for it, and ``zarr.core.sync.sync`` is the same function on every zarr 3 release.
"""

from __future__ import annotations

from typing import Any

from zarr.buffer import default_buffer_prototype
from zarr.core.sync import sync

__all__ = [
    "codec_config",
    "default_buffer_prototype",
    "index_at_end",
    "little_endian",
    "numcodecs_codec",
    "sync",
]


def codec_config(codec: Any) -> dict[str, Any]:
    """The ``configuration`` of a zarr v3 codec as ``zarr.json`` spells it (empty when it has none)."""
    return dict(codec.to_dict().get("configuration") or {})


def little_endian(bytes_codec: Any) -> bool:
    """Whether a ``BytesCodec`` stores little-endian values (no byte order given counts as little:
    zarr writes none for one-byte types)."""
    return codec_config(bytes_codec).get("endian", "little") == "little"


def index_at_end(sharding_codec: Any) -> bool:
    """Whether a ``ShardingCodec`` writes its shard index after the chunks (the spec's default)."""
    return codec_config(sharding_codec).get("index_location", "end") == "end"


def numcodecs_codec(codec: Any) -> Any | None:
    """The numcodecs codec inside a ``numcodecs.*`` zarr v3 codec (``zarr.codecs.numcodecs``), made
    from its public ``codec_config``; None for any other codec."""
    config = getattr(codec, "codec_config", None)
    if not isinstance(config, dict) or "id" not in config:
        return None
    import numcodecs

    return numcodecs.get_codec(dict(config))
