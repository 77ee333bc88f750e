"""The compute device of a rank, and the few calls that differ between CPU and an accelerator.

Everything else in the package is device-agnostic: tensors are made on the device of the data they
meet. What depends on the kind of device lives here once: which device a rank computes on
(``distributed.device``: ``auto`` = this rank's GPU when torch sees one, else the CPU), the
process-group backend that goes with it, synchronising for timers, memory figures, pinned host
memory for non-blocking copies, and the device's name.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = [
    "copies_done",
    "copy_to_host",
    "default_backend",
    "device_name",
    "free_bytes",
    "host_empty",
    "patch_conv_as_gemm",
    "peak_memory_bytes",
    "pin",
    "resolve_device",
    "set_precision",
    "synchronize",
]


def resolve_device(request: str = "auto", local_rank: int | None = None) -> torch.device:
    """This rank's compute device. ``auto``: GPU ``LOCAL_RANK`` when CUDA is available, else the CPU;
    ``cuda`` (or another accelerator type) without an index takes ``LOCAL_RANK``'s."""
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
        device = torch.device(device.type, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def default_backend(device: torch.device) -> str:
    """NCCL for CUDA ranks, gloo for everything else."""
    return "nccl" if device.type == "cuda" else "gloo"


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


def pin(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` in page-locked host memory when it is bound for a GPU (non-blocking copies)."""
    return tensor.pin_memory() if device.type == "cuda" else tensor


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


def host_empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Host memory for copies off ``device``: page-locked when it is a GPU (non-blocking copies)."""
    return torch.empty(shape, dtype=dtype, pin_memory=device.type == "cuda")


def copies_done(device: torch.device) -> Callable[[], None]:
    """A ``wait()`` for the work queued so far on ``device``'s current stream (copies to the host),
    callable from any thread; a no-op on the CPU, where copies are done when they return."""
    if device.type != "cuda":
        return _nothing
    done = torch.cuda.Event()
    done.record()
    return done.synchronize


def copy_to_host(x: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None]]:
    """Start copying ``x`` into page-locked host memory; returns the host tensor and a ``wait()`` to
    call before reading it. On the CPU ``x`` itself and a no-op."""
    if x.device.type == "cpu":
        return x, _nothing
    if x.device.type != "cuda":
        return x.cpu(), _nothing
    host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    host.copy_(x, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    return host, done.synchronize


def _nothing() -> None:
    return None
