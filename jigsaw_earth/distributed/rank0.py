"""Work done once, on rank 0, with its outcome shared: a result there, the same error everywhere."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeVar

import torch.distributed as dist

from .mesh import DomainMesh

__all__ = ["on_rank0"]

T = TypeVar("T")


def on_rank0(mesh: DomainMesh, fn: Callable[[], T]) -> T | None:
    """Run ``fn`` on rank 0 only; an exception there is raised on every rank (collective).

    Returns ``fn``'s result on rank 0 and ``None`` elsewhere. Errors keep their type when it is
    an ``OSError`` or ``ValueError`` (subclasses included), so every rank exits the same way.
    """
    result: T | None = None
    failure: Any = None
    if mesh.rank == 0:
        try:
            result = fn()
        except (OSError, ValueError) as err:
            failure = err
    if mesh.is_distributed and dist.is_initialized():
        box = [None if failure is None else _portable(failure)]
        dist.broadcast_object_list(box, src=0)  # on the group's own device (NCCL's: the current GPU)
        if box[0] is not None and failure is None:
            failure = _rebuild(box[0])
    if failure is not None:
        raise failure
    return result


def _portable(err: BaseException) -> tuple[str, Any]:
    """What crosses to the other ranks: an ``OSError``'s errno, else the error's class and text."""
    if isinstance(err, OSError) and err.errno is not None:
        return ("os", (err.errno, err.strerror, err.filename))
    cls = type(err)
    return ("value", (cls.__module__, cls.__qualname__, str(err)))


def _rebuild(item: tuple[str, Any]) -> BaseException:
    """The same error on this rank: an ``OSError`` of the errno, or the ``ValueError`` (subclass)."""
    kind, payload = item
    if kind == "os":
        return OSError(*payload)  # OSError(errno, ...) builds the matching subclass
    module, name, text = payload
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        cls = ValueError
    if not (isinstance(cls, type) and issubclass(cls, ValueError)):
        cls = ValueError
    return cls(text)
