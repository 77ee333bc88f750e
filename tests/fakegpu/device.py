"""The fake accelerator's device: torch's PrivateUse1 slot named ``fakegpu`` (``guard.py``).

``torch.fakegpu`` has ``FAKEGPU_COUNT`` devices (default 8), a current device (``set_device``; the
NCCL rules of ``nccl.py`` read it) and one in-order stream; autocast on it falls through (fp32).
``Module.to(fakegpu)`` keeps a parameter's Python attributes, as CUDA's ``set_data`` does.
"""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any

import torch
import torch.utils.backend_registration as backend_registration

__all__ = ["COUNT_ENV", "MODULE", "TYPE", "register"]

TYPE = "fakegpu"
COUNT_ENV = "FAKEGPU_COUNT"
_registered: list[bool] = [False]


class _Stream:
    """The one in-order queue of a fake device (its work is done when it is queued)."""

    def synchronize(self) -> None:
        return None

    def wait_stream(self, other: _Stream) -> None:
        return None

    def query(self) -> bool:
        return True


class _Module(backend_registration._DummyBackendModule):
    """``torch.fakegpu``: what torch's own code and the package ask of a device module."""

    _stream = _Stream()

    def __init__(self) -> None:
        self.current, self.chosen = 0, False  # chosen: set_device was called in this process

    def device_count(self) -> int:
        return int(os.environ.get(COUNT_ENV, "8"))

    def current_device(self) -> int:
        return self.current

    def set_device(self, device: Any) -> None:
        index = device if isinstance(device, int) else torch.device(device).index
        index = self.current if index is None else index
        if not 0 <= index < self.device_count():
            raise RuntimeError(
                f"{TYPE}: invalid device ordinal {index} ({self.device_count()} devices on host "
                f"{socket.gethostname()}: a rank takes its host's device by its local rank)"
            )
        self.current, self.chosen = index, True

    def current_stream(self, device: Any = None) -> _Stream:
        return self._stream

    def stream(self, stream: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def synchronize(self, device: Any = None) -> None:
        return None

    def get_amp_supported_dtype(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16]


MODULE = _Module()


def register() -> None:
    """Name PrivateUse1 ``fakegpu`` once per process; autocast on it falls through (fp32); the
    NCCL-like process-group backend for its tensors."""
    if _registered[0]:
        return
    backend_registration._setup_privateuseone_for_python_backend(TYPE, backend_module=MODULE)
    lib = torch.library.Library("_", "IMPL")  # a fallback for a whole dispatch key
    lib.fallback(torch.library.fallthrough_kernel, dispatch_key="AutocastPrivateUse1")
    _LIBS.append(lib)
    from . import nccl

    nccl.register()
    torch.utils.swap_tensors = _swap_keeping_attributes
    _registered[0] = True


_swap = torch.utils.swap_tensors


def _swap_keeping_attributes(t1: torch.Tensor, t2: torch.Tensor) -> None:
    """``Module.to(fakegpu)`` swaps each parameter with its device copy (a wrapper subclass); on CUDA
    the parameter object stays (``set_data``) and keeps its Python attributes: keep them here too."""
    mine = {k: v for k, v in vars(t1).items() if k not in ("elem", "index")}
    _swap(t1, t2)
    for key, value in mine.items():
        setattr(t1, key, value)


_LIBS: list[Any] = []
