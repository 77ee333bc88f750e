"""The fake GPU's guard: a dispatch mode that runs every operator on a ``fakegpu`` tensor's CPU values
and checks its devices the way CUDA does, counting (or refusing) reads to the host (the package's
``__init__`` says what it models).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from .device import MODULE, TYPE, register

__all__ = ["DeviceMixing", "FakeGpu", "FakeGpuTensor", "HostRead", "activate", "active", "fake_gpu", "rank"]

REPORT_ENV = "FAKEGPU_REPORT"
_active: list[FakeGpu] = []


def rank() -> str:
    """This process's rank as the messages name it (``RANK``; 0 for a single process)."""
    return os.environ.get("RANK", "0")


class DeviceMixing(RuntimeError):
    """An operator met tensors of two devices where CUDA would refuse them."""


class HostRead(RuntimeError):
    """A value read to the host inside a communication site (it would stall every GPU per exchange)."""


def _device(index: int) -> torch.device:
    return torch.device(TYPE, index)


class FakeGpuTensor(torch.Tensor):
    """A tensor on ``fakegpu:K`` whose values live in ``elem`` (a CPU tensor).

    torch's C++ side sees every one on ``fakegpu:0`` (its autograd engine keeps one queue per device
    index, and a device registered from Python has one); ``index`` is the device Python code sees.
    """

    elem: torch.Tensor
    index: int

    @staticmethod
    def __new__(cls, elem: torch.Tensor, index: int = 0) -> FakeGpuTensor:
        r = torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype,
            device=_device(0), requires_grad=elem.requires_grad, layout=elem.layout,
        )  # fmt: skip
        r.elem, r.index = elem, index
        return r

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return _device(self.index)

    def get_device(self) -> int:
        return self.index

    def __repr__(self) -> str:
        return f"FakeGpuTensor({self.elem!r}, device={self.device})"

    def __tensor_flatten__(self) -> tuple[list[str], int]:
        return ["elem"], self.index

    @staticmethod
    def __tensor_unflatten__(inner: dict, meta: Any, outer_size: Any, outer_stride: Any) -> FakeGpuTensor:
        return FakeGpuTensor(inner["elem"], meta)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        raise RuntimeError(f"{func} on a {TYPE} tensor outside fake_gpu()")


# operators that may take tensors of two devices on CUDA too
_CROSS = {
    "_to_copy", "copy_", "_copy_from", "_copy_from_and_resize", "index", "index_put_", "index_put",
    "_index_put_impl_", "_pin_memory", "is_pinned", "lift_fresh", "set_", "_has_compatible_shallow_copy_type",
}  # fmt: skip
_HOST_READS = {"_local_scalar_dense", "is_nonzero", "equal"}


def _on_device(x: Any) -> bool:
    return isinstance(x, FakeGpuTensor)


def _target(device: Any) -> torch.device | None:
    """``device`` (as Python code names it) as a fake device with its index (the current one when it
    has none), else None."""
    if device is None:
        return None
    device = torch.device(device)
    if device.type != TYPE:
        return None
    return device if device.index is not None else _device(MODULE.current)


_asked = threading.local()  # the fake device a Python call named, while torch runs it


@contextlib.contextmanager
def _asking(target: torch.device | None) -> Iterator[None]:
    before = getattr(_asked, "device", None)
    _asked.device = target or before
    try:
        yield
    finally:
        _asked.device = before


def _dispatched_target(device: Any) -> torch.device | None:
    """The fake device of a ``device=`` an operator receives: the one the Python call named, else
    (torch's own C++, which sees every fake tensor on index 0) the current device."""
    if device is None or torch.device(device).type != TYPE:
        return None
    return getattr(_asked, "device", None) or _device(MODULE.current)


def _place(skip: int = 2) -> str:
    return "".join(traceback.format_stack(limit=14)[:-skip])


def _comm_site() -> str | None:
    """The communication site the code is in (``comm_site``), if the package is loaded."""
    comm = sys.modules.get("jigsaw_earth.distributed.comm")
    stack = comm.ledger.stack if comm is not None else []
    return "/".join(stack) if stack else None


class FakeGpu(TorchDispatchMode):
    """Runs every operator on the CPU values, checking devices as CUDA does."""

    def __init__(self, host_reads: list[str] | None = None) -> None:
        super().__init__()
        self.host_reads: list[str] = [] if host_reads is None else host_reads

    def read_to_host(self, what: str, place: str) -> None:
        site = _comm_site()
        if site is not None:
            raise HostRead(
                f"rank {rank()}: {what} reads a device value to the host inside the communication site "
                f"{site!r} (every exchange would wait for the device):\n{place}"
            )
        self.host_reads.append(place)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func.namespace == "c10d":
            from .nccl import collective

            return collective(func, args, kwargs, _unwrap, FakeGpuTensor)
        name = func._schema.name.split("::")[-1]
        flat, _ = tree_flatten((args, kwargs))
        indices = {t.index for t in flat if _on_device(t)}
        to_device = _dispatched_target(kwargs.get("device"))
        if indices and name not in _CROSS:
            self._check(func, args, kwargs, indices)
        if indices and name in _HOST_READS:
            self.read_to_host(str(func), _place())
        if name == "_pin_memory":
            return args[0].clone()
        if name == "is_pinned":
            return True
        kw = tree_map(_unwrap, kwargs)
        if to_device is not None:
            kw["device"] = torch.device("cpu")
        if kw.get("pin_memory"):
            kw["pin_memory"] = False
        out = func(*tree_map(_unwrap, args), **kw)
        if name == "copy_":
            return args[0]
        written = _written_input(func, args)
        if written is not None:
            return written
        index = to_device.index if to_device is not None else min(indices) if indices else None
        if name == "_to_copy" and "device" in kwargs and to_device is None:
            index = None  # to the CPU
        return tree_map(lambda x: _wrap(x, index), out) if index is not None else out

    @staticmethod
    def _check(func: Any, args: Any, kwargs: Any, indices: set[int]) -> None:
        if len(indices) > 1:
            a, b = sorted(indices)[:2]
            raise DeviceMixing(
                f"rank {rank()}: Expected all tensors to be on the same device, but found at least two "
                f"devices, {TYPE}:{a} and {TYPE}:{b}! ({func})"
            )
        schema = func._schema.arguments
        named = [(schema[i] if i < len(schema) else None, a) for i, a in enumerate(args)]
        named += [(next((s for s in schema if s.name == k), None), v) for k, v in kwargs.items()]
        for arg, value in named:
            written = arg is not None and arg.alias_info is not None and arg.alias_info.is_write
            for v in value if isinstance(value, (list, tuple)) else [value]:
                host = isinstance(v, torch.Tensor) and not _on_device(v) and v.device.type == "cpu"
                if host and (written or v.dim() > 0):
                    raise DeviceMixing(
                        f"rank {rank()}: Expected all tensors to be on the same device, but found at least "
                        f"two devices, {TYPE}:{min(indices)} and cpu! ({func}, argument "
                        f"{arg.name if arg else '?'}: a CPU tensor of shape {tuple(v.shape)}"
                        f"{' written in place' if written else ''})"
                    )


def _unwrap(x: Any) -> Any:
    return x.elem if isinstance(x, FakeGpuTensor) else x


def _wrap(x: Any, index: int) -> Any:
    return FakeGpuTensor(x, index) if isinstance(x, torch.Tensor) and not isinstance(x, FakeGpuTensor) else x


def _written_input(func: Any, args: Any) -> Any:
    """The input an in-place operator returns (the caller's own tensor, not a new wrapper)."""
    rets = func._schema.returns
    if len(rets) != 1 or rets[0].alias_info is None or not rets[0].alias_info.is_write:
        return None
    for a, s in zip(args, func._schema.arguments):
        if s.alias_info is not None and s.alias_info.is_write and isinstance(a, torch.Tensor):
            return a
    return None


class _Moves(TorchFunctionMode):
    """``Tensor.to(fakegpu)`` as the copy operator (torch's own ``to`` would look for a real device);
    ``tolist`` read from the values (a host read)."""

    def __init__(self, mode: FakeGpu) -> None:
        super().__init__()
        self.mode = mode

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        with _asking(_target(kwargs.get("device"))):
            return self._run(func, args, kwargs)

    def _run(self, func: Any, args: Any, kwargs: dict) -> Any:
        if func is torch.Tensor.tolist and _on_device(args[0]):
            self.mode.read_to_host("tolist", _place(1))
            return args[0].elem.tolist()
        if func in (torch.tensor, torch.as_tensor, torch.asarray) and _target(kwargs.get("device")):
            host = func(*args, **{**kwargs, "device": "cpu"})  # torch builds these below the dispatcher
            return torch.ops.aten._to_copy.default(host, device=_target(kwargs["device"]))
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and _on_device(args[0]):
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            index = tuple(torch.tensor(i) if isinstance(i, list) else i for i in index)  # as torch does
            return func(args[0], index, *args[2:], **kwargs)
        if func is torch.Tensor.to:
            device, dtype, non_blocking, _, *_ = torch._C._nn._parse_to(*args[1:], **kwargs)
            other = args[1] if len(args) > 1 else kwargs.get("other")
            if _on_device(other):  # .to(tensor): its device as Python sees it
                device = other.device
            t, target = args[0], _target(device)
            if target is not None:
                if _on_device(t) and t.index == target.index and (dtype is None or dtype == t.dtype):
                    return t
                with _asking(target):
                    return torch.ops.aten._to_copy.default(
                        t, dtype=dtype or t.dtype, device=target, non_blocking=non_blocking
                    )
        return func(*args, **kwargs)


def active() -> FakeGpu | None:
    """The mode ``activate()`` entered in this process, if any."""
    return _active[0] if _active else None


def _enter_in_threads(mode: FakeGpu) -> Any:
    """Enter the modes in every thread started from now on (torch's modes are per thread)."""
    run = threading.Thread.run

    def run_faked(thread: threading.Thread) -> None:
        with FakeGpu(mode.host_reads) as inner, _Moves(inner):
            run(thread)

    threading.Thread.run = run_faked
    return run


@contextlib.contextmanager
def fake_gpu() -> Iterator[FakeGpu]:
    """Within: ``fakegpu`` tensors work and device mixing raises ``DeviceMixing``, in this thread
    and in every thread started meanwhile (torch's modes are per thread)."""
    if active() is not None:  # the process-wide guard of a rank (activate) is already on
        yield active()  # type: ignore[misc]
        return
    register()
    mode = FakeGpu()
    run = _enter_in_threads(mode)
    try:
        with mode, _Moves(mode):
            yield mode
    finally:
        threading.Thread.run = run


def activate() -> None:
    """The device plugin's entry (``JIGSAW_DEVICE_PLUGIN``): the guard on for the rest of this
    process, in every thread. At exit the rank's host reads are printed, and with
    ``FAKEGPU_REPORT=DIR`` written to ``DIR/rank-R-PID.json`` with its host and device, its
    ``torch.distributed`` calls by operator and any CPU tensors handed to them (``nccl.py``)."""
    if active() is not None:
        return
    register()
    mode = FakeGpu()
    _enter_in_threads(mode)
    mode.__enter__()
    _Moves(mode).__enter__()
    _active.append(mode)
    atexit.register(_report, mode)


def _report(mode: FakeGpu) -> None:
    from . import nccl

    print(f"fake_gpu: rank {rank()}: {len(mode.host_reads)} host reads", file=sys.stderr)
    folder = os.environ.get(REPORT_ENV)
    if folder:
        report = {"rank": int(rank()), "host": socket.gethostname(), "device": MODULE.current,
                  "host_reads": len(mode.host_reads), "calls": dict(nccl.CALLS),
                  "cpu_handoffs": nccl.HANDOFFS}  # fmt: skip
        Path(folder, f"rank-{rank()}-{os.getpid()}.json").write_text(json.dumps(report))
