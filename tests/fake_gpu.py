"""A fake accelerator on a CPU-only torch: the device guard of the tests (no GPU needed).

``fake_gpu()`` registers a device type ``fakegpu`` (torch's PrivateUse1 slot) whose tensors hold
their values on the CPU but report ``fakegpu:0`` as their device, and checks every operator the way
CUDA does: tensors of two devices in one operator raise, except a 0-dim CPU tensor read as a scalar
(CUDA lifts those), never a CPU tensor written by the operator (``total += cuda_tensor`` into a CPU
scalar raises on CUDA). Copies between devices (``.to``, ``copy_``) and CPU index tensors are allowed,
as on CUDA. Reading a value to the host (``.item()``, ``float()``, ``.tolist()``) is allowed and
counted in ``FakeGpu.host_reads`` with the place it came from; ``.numpy()`` of a device tensor raises
as on CUDA. The code under test runs unchanged with ``distributed.device=fakegpu``.

What it does not model: CUDA streams and asynchrony, autocast (bf16 runs in fp32 here), and the
``device.type == "cuda"`` branches of ``jigsaw_earth/device.py``, which are read, not run, here.
"""

from __future__ import annotations

import contextlib
import threading
import traceback
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils.backend_registration as backend_registration
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["DEVICE", "DeviceMixing", "FakeGpu", "FakeGpuTensor", "fake_gpu"]

TYPE = "fakegpu"
_registered = False


class _Stream:
    """The one in-order queue of the fake device (its work is done when it is queued)."""

    def synchronize(self) -> None:
        return None

    def wait_stream(self, other: _Stream) -> None:
        return None

    def query(self) -> bool:
        return True


class _Module(backend_registration._DummyBackendModule):
    """``torch.fakegpu``: what torch's own code (checkpointing, RNG) asks of a device module."""

    _stream = _Stream()

    def current_stream(self, device: Any = None) -> _Stream:
        return self._stream

    def stream(self, stream: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def synchronize(self, device: Any = None) -> None:
        return None

    def get_amp_supported_dtype(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16]


def _register() -> None:
    """Name PrivateUse1 ``fakegpu`` once per process; autocast on it falls through (fp32)."""
    global _registered
    if _registered:
        return
    backend_registration._setup_privateuseone_for_python_backend(TYPE, backend_module=_Module())
    lib = torch.library.Library("_", "IMPL")  # a fallback for a whole dispatch key
    lib.fallback(torch.library.fallthrough_kernel, dispatch_key="AutocastPrivateUse1")
    _LIBS.append(lib)
    _registered = True


_LIBS: list[Any] = []
_register()
DEVICE = torch.device(TYPE, 0)


class DeviceMixing(RuntimeError):
    """An operator met tensors of two devices where CUDA would refuse them."""


class FakeGpuTensor(torch.Tensor):
    """A tensor on ``fakegpu:0`` whose values live in ``elem`` (a CPU tensor)."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> FakeGpuTensor:
        r = torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype,
            device=DEVICE, requires_grad=elem.requires_grad, layout=elem.layout,
        )  # fmt: skip
        r.elem = elem
        return r

    def __repr__(self) -> str:
        return f"FakeGpuTensor({self.elem!r})"

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["elem"], None

    @staticmethod
    def __tensor_unflatten__(inner: dict, meta: Any, outer_size: Any, outer_stride: Any) -> FakeGpuTensor:
        return FakeGpuTensor(inner["elem"])

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


def _is_fake_device(device: Any) -> bool:
    return device is not None and torch.device(device).type == TYPE


class FakeGpu(TorchDispatchMode):
    """Runs every operator on the CPU values, checking devices as CUDA does."""

    def __init__(self, host_reads: list[str] | None = None) -> None:
        super().__init__()
        self.host_reads: list[str] = [] if host_reads is None else host_reads

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        flat, _ = tree_flatten((args, kwargs))
        on_device = any(_on_device(t) for t in flat)
        to_device = _is_fake_device(kwargs.get("device"))
        if on_device and name not in _CROSS:
            self._check(func, args, kwargs)
        if on_device and name in _HOST_READS:
            self.host_reads.append("".join(traceback.format_stack(limit=12)[:-2]))
        if name == "_pin_memory":
            return args[0].clone()
        if name == "is_pinned":
            return True
        kw = tree_map(_unwrap, kwargs)
        if to_device:
            kw["device"] = torch.device("cpu")
        if kw.get("pin_memory"):
            kw["pin_memory"] = False
        out = func(*tree_map(_unwrap, args), **kw)
        if name == "copy_":
            return args[0]
        written = _written_input(func, args)
        if written is not None:
            return written
        if name == "_to_copy":
            wrap = to_device or ("device" not in kwargs and on_device)
        else:
            wrap = to_device or on_device
        return tree_map(_wrap, out) if wrap else out

    @staticmethod
    def _check(func: Any, args: Any, kwargs: Any) -> None:
        schema = func._schema.arguments
        named = [(schema[i] if i < len(schema) else None, a) for i, a in enumerate(args)]
        named += [(next((s for s in schema if s.name == k), None), v) for k, v in kwargs.items()]
        for arg, value in named:
            written = arg is not None and arg.alias_info is not None and arg.alias_info.is_write
            for v in value if isinstance(value, (list, tuple)) else [value]:
                host = isinstance(v, torch.Tensor) and not _on_device(v) and v.device.type == "cpu"
                if host and (written or v.dim() > 0):
                    raise DeviceMixing(
                        f"Expected all tensors to be on the same device, but found at least two devices, "
                        f"{TYPE}:0 and cpu! ({func}, argument {arg.name if arg else '?'}: a CPU tensor "
                        f"of shape {tuple(v.shape)}{' written in place' if written else ''})"
                    )


def _unwrap(x: Any) -> Any:
    return x.elem if isinstance(x, FakeGpuTensor) else x


def _wrap(x: Any) -> Any:
    return FakeGpuTensor(x) if isinstance(x, torch.Tensor) and not isinstance(x, FakeGpuTensor) else x


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

    def __init__(self, host_reads: list[str]) -> None:
        super().__init__()
        self.host_reads = host_reads

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.tolist and _on_device(args[0]):
            self.host_reads.append("".join(traceback.format_stack(limit=12)[:-1]))
            return args[0].elem.tolist()
        if func in (torch.tensor, torch.as_tensor, torch.asarray) and _is_fake_device(kwargs.get("device")):
            host = func(*args, **{**kwargs, "device": "cpu"})  # torch builds these below the dispatcher
            return torch.ops.aten._to_copy.default(host, device=DEVICE)
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and _on_device(args[0]):
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            index = tuple(torch.tensor(i) if isinstance(i, list) else i for i in index)  # as torch does
            return func(args[0], index, *args[2:], **kwargs)
        if func is torch.Tensor.to:
            device, dtype, non_blocking, _, *_ = torch._C._nn._parse_to(*args[1:], **kwargs)
            t = args[0]
            if _is_fake_device(device):
                if _on_device(t) and (dtype is None or dtype == t.dtype):
                    return t
                return torch.ops.aten._to_copy.default(
                    t, dtype=dtype or t.dtype, device=DEVICE, non_blocking=non_blocking
                )
        return func(*args, **kwargs)


@contextlib.contextmanager
def fake_gpu() -> Iterator[FakeGpu]:
    """Within: ``fakegpu`` tensors work and device mixing raises ``DeviceMixing``, in this thread
    and in every thread started meanwhile (torch's modes are per thread)."""
    mode = FakeGpu()
    run = threading.Thread.run

    def run_faked(thread: threading.Thread) -> None:
        with FakeGpu(mode.host_reads), _Moves(mode.host_reads):
            run(thread)

    threading.Thread.run = run_faked
    try:
        with mode, _Moves(mode.host_reads):
            yield mode
    finally:
        threading.Thread.run = run


def main(argv: list[str]) -> int:
    """``python tests/fake_gpu.py COMMAND ...``: the jigsaw-earth CLI with the fake device active
    (``--device fakegpu`` / ``distributed.device=fakegpu``); prints the host reads it counted."""
    from jigsaw_earth.cli import main as cli

    with fake_gpu() as mode:
        code = cli(argv)
    print(f"fake_gpu: {len(mode.host_reads)} host reads")
    return code


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
