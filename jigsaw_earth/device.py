"""The compute device of a rank, and the few calls that differ between CPU and an accelerator.

Everything else in the package is device-agnostic: tensors are made on the device of the data they
meet. What depends on the kind of device lives here once: which device a rank computes on
(``distributed.device``: ``auto`` = this rank's GPU when torch sees one, else the CPU; ranks that
outnumber a host's GPUs share them, ``LOCAL_RANK`` modulo their count), the process-group backend
that goes with it, synchronising for timers, memory figures, pinned host memory for non-blocking
copies, copies off the device on a stream of their own (``CopyOut``), device time without a host
sync per span (``DeviceTimer``), and the device's name. A device torch does not ship reaches every
rank through ``JIGSAW_DEVICE_PLUGIN`` (``load_device_plugin``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "PLUGIN_ENV",
    "CopyOut",
    "DeviceTimer",
    "check_device_option",
    "copies_done",
    "default_backend",
    "device_count",
    "device_name",
    "free_bytes",
    "host_empty",
    "load_device_plugin",
    "patch_conv_as_gemm",
    "peak_memory_bytes",
    "pin",
    "resolve_device",
    "set_precision",
    "synchronize",
]

PLUGIN_ENV = "JIGSAW_DEVICE_PLUGIN"
_plugins: set[str] = set()


def load_device_plugin() -> None:
    """Activate the device plugin ``JIGSAW_DEVICE_PLUGIN`` names in this process, once: a module, a
    ``.py`` file or a package's folder whose ``activate()`` makes its device known to torch (an
    out-of-tree accelerator's registration; the tests' fake accelerator, the package
    ``tests.fakegpu``). Every rank calls this before it chooses its device: spawned ranks, and
    ``python -m jigsaw_earth`` under torchrun or srun."""
    spec = os.environ.get(PLUGIN_ENV, "")
    if not spec or spec in _plugins:
        return
    try:
        path = Path(spec)
        package = ("/" in spec or os.sep in spec) and path.is_dir()  # a path, not a module's name
        if spec.endswith(".py") or package:
            name, file = (path.name, path / "__init__.py") if package else (path.stem, path)
            module = sys.modules.get(name)
            if module is None or Path(getattr(module, "__file__", "")).resolve() != file.resolve():
                where = {"submodule_search_locations": [str(path)]} if package else {}
                loader = importlib.util.spec_from_file_location(name, file, **where)
                if loader is None or loader.loader is None:
                    raise ImportError(f"cannot load {spec}")
                module = importlib.util.module_from_spec(loader)
                sys.modules[name] = module
                loader.loader.exec_module(module)
        else:
            module = importlib.import_module(spec)
        activate = module.activate
    except (ImportError, OSError, AttributeError) as err:
        raise ValueError(
            f"{PLUGIN_ENV}={spec!r}: cannot activate it ({err}); name an importable module, a .py file or a "
            f"package's folder that defines activate(), or unset {PLUGIN_ENV}"
        ) from None
    activate()
    _plugins.add(spec)


def device_count(device_type: str) -> int:
    """Devices of ``device_type`` this process sees (0 for the CPU)."""
    if device_type == "cpu":
        return 0
    return int(torch.get_device_module(device_type).device_count())


def check_device_option(device: str, option: str = "--device") -> None:
    """A command's ``--device cuda`` on a torch that sees no GPU: one line naming the build and the fix,
    before any rank starts."""
    if device.partition(":")[0] == "cuda" and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}, but it sees no GPU" if torch.version.cuda else "a CPU-only build"
        raise ValueError(
            f"{option} {device}: torch {torch.__version__} is {build}; use {option} cpu, or install the "
            f"CUDA build of torch that matches the driver (nvidia-smi) on a machine with a GPU"
        )


def resolve_device(request: str = "auto", local_rank: int | None = None) -> torch.device:
    """This rank's compute device, made current. ``auto``: GPU ``LOCAL_RANK`` when CUDA is available,
    else the CPU; ``cuda`` (or another accelerator type) without an index takes ``LOCAL_RANK``'s, modulo
    the devices the host has (ranks that outnumber its GPUs share them)."""
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if request == "auto":
        request = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(request)
    except RuntimeError as err:
        raise ValueError(
            f"distributed.device={request!r} is not a device torch knows ({err}); use auto, cpu or cuda"
        ) from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ValueError(
            f"distributed.device={request!r} but torch {torch.__version__} ({build}) sees no GPU; install "
            f"the CUDA build of torch that matches the driver (nvidia-smi), or set distributed.device=cpu"
        )
    if device.index is None:
        device = torch.device(device.type, local_rank % max(1, device_count(device.type)))
    module = torch.get_device_module(device.type)
    if hasattr(module, "set_device"):  # the current device: NCCL's object collectives and barriers use it
        module.set_device(device)
    return device


def default_backend(device: torch.device) -> str:
    """The process-group backend torch registers for the device type: NCCL for CUDA ranks, gloo for
    the CPU (an out-of-tree accelerator registers its own)."""
    import torch.distributed as dist

    return dist.Backend.default_device_backend_map.get(device.type, "gloo")


def synchronize(device: torch.device, stream_only: bool = False) -> None:
    """Wait for the device's queued work (timers); nothing on the CPU. ``stream_only``: the current
    stream's work only (copies queued on a side stream go on)."""
    if device.type == "cuda":
        if stream_only:
            torch.cuda.current_stream(device).synchronize()
        else:
            torch.cuda.synchronize(device)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated bytes on a GPU since the last reset; on the CPU the process's peak resident set."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(rss * 1024 if sys.platform != "darwin" else rss)
    except ImportError:  # pragma: no cover - windows
        return 0


def free_bytes(device: torch.device, local_ranks: int = 1) -> int:
    """Bytes free for this rank: the GPU's free memory, or the host's available memory shared by
    ``local_ranks`` processes."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        text = Path("/proc/meminfo").read_text()
        kib = next(line.split()[1] for line in text.splitlines() if line.startswith("MemAvailable"))
        avail = int(kib) * 1024
    except (OSError, StopIteration, ValueError):
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return avail // max(1, local_ranks)


def _pins(device: torch.device) -> bool:
    """Whether host memory bound for ``device`` is page-locked (a GPU's; not the CPU's or MPS's)."""
    return device.type not in ("cpu", "mps")


def pin(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` in page-locked host memory when it is bound for a GPU (non-blocking copies)."""
    return tensor.pin_memory() if _pins(device) else tensor


def host_empty(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Host memory for copies to or from ``device``: page-locked when it is a GPU (non-blocking
    copies)."""
    return torch.empty(tuple(shape), dtype=dtype, pin_memory=_pins(device))


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return platform.processor() or platform.machine() or device.type


def set_precision(precision: str) -> None:
    """Math mode of fp32 matrix products and convolutions on GPU: TF32 for ``tf32``, true fp32
    otherwise (``bf16`` autocasts the forward; what stays fp32 stays exact)."""
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def patch_conv_as_gemm(device: torch.device) -> bool:
    """Whether a patch convolution (stride = kernel: ``PatchEmbed``) runs as GEMMs on its patch rows
    (``distributed/conv_ring.py``): on the CPU, where oneDNN's convolution weight gradient measured
    2–7× slower than the GEMM; not on a GPU, where the plain ``nn.Conv2d`` (cuDNN) measured 1.19×
    faster than the GEMMs and their copies into patch rows (H100, bf16, ``bench layers --size
    large``)."""
    return device.type == "cpu"


def copies_done(device: torch.device) -> Callable[[], None]:
    """A ``wait()`` for the work queued so far on ``device``'s current stream (copies to the host),
    callable from any thread; a no-op on the CPU, where copies are done when they return."""
    if device.type != "cuda":
        return _nothing
    done = torch.cuda.Event()
    done.record()
    return done.synchronize


class CopyOut:
    """Copies device tensors into host buffers (``host_empty``) on a CUDA stream of their own, so
    the next kernels of the compute stream run while a copy is in flight; on the CPU a plain copy.
    ``copy`` returns a ``wait()`` to call (from any thread) before the host reads the buffer."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.timer = DeviceTimer(device, self.stream)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> Callable[[], None]:
        if self.stream is None:
            with self.timer:
                dst.copy_(src)
            return _nothing
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # src is computed
        with torch.cuda.stream(self.stream), self.timer:
            dst.copy_(src, non_blocking=True)
        src.record_stream(self.stream)  # its memory is not reused before the copy is done
        done = torch.cuda.Event()
        done.record(self.stream)
        return done.synchronize


class DeviceTimer:
    """Seconds of device work inside ``with timer:`` blocks, summed: on CUDA, events recorded on
    ``stream`` (default: the current one) and read by ``total()`` (which waits for them: call it
    after the timed work); on the CPU the wall time of each block."""

    def __init__(self, device: torch.device, stream: Any = None):
        self.cuda = device.type == "cuda"
        self.stream, self.seconds = stream, 0.0
        self._events: list[tuple[Any, Any]] = []
        self._t0 = 0.0

    def __enter__(self) -> DeviceTimer:
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record(self.stream)
            self._events.append((start, None))
        else:
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record(self.stream)
            self._events[-1] = (self._events[-1][0], end)
        else:
            self.seconds += time.perf_counter() - self._t0

    def total(self) -> float:
        """The summed seconds (on CUDA this waits for the last timed work to finish)."""
        for start, end in self._events:
            end.synchronize()
            self.seconds += start.elapsed_time(end) / 1e3
        self._events.clear()
        return self.seconds


def _nothing() -> None:
    return None
