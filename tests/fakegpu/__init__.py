"""A fake accelerator on a CPU-only torch: the device guard of the tests (no GPU needed).

``fakegpu`` (torch's PrivateUse1 slot, ``device.py``) has ``FAKEGPU_COUNT`` devices per host
(default 8). Its tensors hold their values on the CPU but report ``fakegpu:K`` as their device, and
every operator is checked the way CUDA checks it (``guard.py``): tensors of two devices in one operator
raise (a CPU tensor, or ``fakegpu:0`` with ``fakegpu:1``), except a 0-dim CPU tensor read as a scalar
(CUDA lifts those), never a CPU tensor written by the operator (``total += cuda_tensor`` into a CPU
scalar raises on CUDA). Copies between devices (``.to``, ``copy_``) and CPU index tensors are allowed,
as on CUDA. ``fakegpu`` without an index is the current device (``torch.fakegpu.set_device``), as
``cuda`` is. Reading a value to the host (``.item()``, ``float()``, ``.tolist()``) is allowed and
counted in ``FakeGpu.host_reads`` (this process, i.e. this rank) with the place it came from, and
refused inside a communication site (``comm_site``: a layer's exchange); ``.numpy()`` of a device
tensor raises as on CUDA. ``torch.distributed`` calls follow NCCL's rules (``nccl.py``).

One process: ``with fake_gpu():``. Every rank of a job: ``JIGSAW_DEVICE_PLUGIN=tests.fakegpu``
(``jigsaw_earth/device.py``; the folder's path ``tests/fakegpu`` works too) makes each rank, spawned or
under torchrun, call ``activate()`` before it chooses its device; ``python -m tests.fakegpu COMMAND ...``
(from the repository's root) sets it and runs the CLI.

What it does not model: CUDA streams and asynchrony, autocast (bf16 runs in fp32 here), and the
``device.type == "cuda"`` branches of ``jigsaw_earth/device.py``, which are read, not run, here.
"""

from .guard import DeviceMixing, FakeGpu, FakeGpuTensor, HostRead, activate, active, fake_gpu, rank

__all__ = ["DeviceMixing", "FakeGpu", "FakeGpuTensor", "HostRead", "activate", "active", "fake_gpu", "rank"]
