"""NCCL's rules on every ``torch.distributed`` call of a rank on the fake accelerator (``guard.py``).

``fakenccl`` is the process-group backend torch picks for ``fakegpu`` (registered with
``Backend.register_backend``, as an out-of-tree accelerator registers its own;
``jigsaw_earth.device.default_backend`` asks torch). Every collective, point-to-point call, object
collective and barrier reaches it as a ``c10d`` operator through the fake's dispatch mode, which
checks it here the way NCCL would take it, then carries the CPU values with gloo and hands the
results back on the device:

* every tensor is on this rank's own device (``torch.fakegpu.set_device``), never on the CPU (gloo
  accepts a CPU tensor, so a CPU run never shows it; NCCL refuses it);
* the rank set its device before the call (object collectives and barriers use the current device:
  NCCL would put every rank's on device 0), and before its groups were made;
* no two ranks of a host share a device in one group (NCCL: "Duplicate GPU detected");
* one dtype per call, the sizes NCCL needs (an all-gather's output is the group times its input),
  and every rank of the group in the same collective with the same dtype and element count (NCCL
  hangs or mixes the bytes otherwise; checked with one small gloo all-gather per collective).

A group of another backend (gloo: ranks sharing a device stage their messages through host
memory) takes host tensors only. Each error names the call, the rank and the place in the code.
``CALLS`` counts the calls checked on this rank by operator; with ``FAKENCCL_RECORD=1`` a CPU tensor
handed to NCCL is recorded in ``HANDOFFS`` (and carried) instead of raising, so a run counts them.
Point-to-point messages are matched by gloo, which refuses a size that differs from the receive;
a dtype that differs at the same byte count is not detected.
"""

from __future__ import annotations

import os
import socket
import sys
import traceback
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["CALLS", "HANDOFFS", "NAME", "NcclRule", "collective", "register"]

NAME = "fakenccl"
TYPE = "fakegpu"
RECORD_ENV = "FAKENCCL_RECORD"
CALLS: Counter[str] = Counter()  # c10d operators checked on this rank: "BACKEND NAME" -> calls
HANDOFFS: list[str] = []  # CPU tensors handed to NCCL, when recorded instead of refused
_shadows: dict[int, tuple[Any, Any]] = {}  # id(gloo backend) -> (it, a gloo ProcessGroup carrying it)
# collectives every rank of the group enters with the same dtype and element count
_MATCHED = (
    "allreduce_", "allreduce_coalesced_", "allgather_", "_allgather_base_", "allgather_coalesced_",
    "allgather_into_tensor_coalesced_", "reduce_scatter_", "_reduce_scatter_base_",
    "reduce_scatter_tensor_coalesced_", "broadcast_", "reduce_",
)  # fmt: skip


class NcclRule(RuntimeError):
    """A ``torch.distributed`` call that NCCL would refuse, hang on, or run on the wrong device."""


def _rank() -> str:
    return os.environ.get("RANK", "0")


def _device_module() -> Any:
    return torch.get_device_module(TYPE)


def register() -> None:
    dist.Backend.register_backend(NAME, _create, devices=[TYPE])
    # gloo serves CUDA's device type too (a gloo group in an NCCL job binds to the job's device)
    dist.Backend.backend_capability[dist.Backend.GLOO].append(TYPE)
    # NCCL's groups split (DeviceMesh on a bound device); gloo splits too, but torch deep-copies the
    # parent's options first, which gloo's cannot be (a split does not change them)
    dist.ProcessGroupGloo._Options.__deepcopy__ = lambda self, memo: self
    # a rank outside a new group takes part in NCCL's split of a bound group; gloo's needs nothing
    dist.ProcessGroupGloo.perform_nocolor_split = lambda self, device: None


def _create(store: Any, rank: int, size: int, timeout: Any) -> Any:
    """A group of ``size`` ranks: refused before ``set_device`` and when two ranks of a host share a
    device; carried by a gloo backend on the same store (and so are the groups split from it)."""
    module = _device_module()
    if not module.chosen:
        raise NcclRule(
            f"rank {_rank()}: a {NAME} process group was created before set_device: NCCL would bind "
            f"every rank of the host to {TYPE}:0"
        )
    store.set(f"{NAME}/device/{rank}", f"{socket.gethostname()} {module.current} {_rank()}")
    seen: dict[tuple[str, str], str] = {}
    for r in range(size):
        host, index, global_rank = store.get(f"{NAME}/device/{r}").decode().split()
        if (host, index) in seen:
            raise NcclRule(
                f"rank {_rank()}: NCCL refuses two ranks on one GPU (Duplicate GPU detected): ranks "
                f"{seen[host, index]} and {global_rank} both on {TYPE}:{index} of {host}; ranks that share "
                f"a device need distributed.transport=host (or more devices)"
            )
        seen[host, index] = global_rank
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def _shadow(group: Any) -> Any:
    """A process group of the CPU that runs ``group``'s gloo backend (the carrier of its values)."""
    gloo = group._get_backend(torch.device(TYPE))
    if id(gloo) not in _shadows:
        shadow = dist.ProcessGroup(group.get_group_store(), group.rank(), group.size())
        shadow._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo)
        shadow._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        _shadows[id(gloo)] = (gloo, shadow)
    return _shadows[id(gloo)][1]


def _where() -> str:
    """The innermost frame of the package's code that made the call (past ``comm.py``'s own), and
    its communication site."""
    frames = traceback.extract_stack()[:-3]
    ours = [f for f in frames if _ours(f.filename)]
    frame = (ours or frames)[-1]
    name = frame.filename
    name = name[name.index("jigsaw_earth/") :] if "jigsaw_earth/" in name else name
    comm = sys.modules.get("jigsaw_earth.distributed.comm")
    site = "/".join(comm.ledger.stack) if comm is not None and comm.ledger.stack else ""
    return f" (at {name}:{frame.lineno} in {frame.name}{f', site {site!r}' if site else ''})"


def _ours(filename: str) -> bool:
    """A file of the package's code other than ``comm.py`` (which every call passes through)."""
    package = "jigsaw_earth/" in filename or "/models/" in filename
    return package and "distributed/comm.py" not in filename


def _group(args: tuple) -> tuple[int, Any]:
    for i, a in enumerate(args):
        if isinstance(a, torch.ScriptObject):
            try:
                return i, dist.ProcessGroup.unbox(a)
            except (RuntimeError, TypeError):
                continue
    raise NcclRule(f"rank {_rank()}: a c10d call without a process group")


def collective(func: Any, args: tuple, kwargs: dict, unwrap: Callable, fake: type) -> Any:
    """Check a ``c10d`` operator against the group's rules, run it on the CPU values, and return the
    caller's own tensors."""
    name = func._schema.name.split("::")[-1]
    at, group = _group(args)
    backend = dist.get_backend(group)
    tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    if backend != NAME:
        CALLS[f"{backend} {name}"] += 1
        on_device = [t for t in tensors if isinstance(t, fake)]
        if on_device:
            raise NcclRule(
                f"rank {_rank()}: {name} on a {backend} group got a tensor on {on_device[0].device}: a "
                f"{backend} group carries host memory (stage device tensors through the host){_where()}"
            )
        return func(*args, **kwargs)
    CALLS[f"{backend} {name}"] += 1
    _check(name, tensors, fake)
    _check_sizes(name, args, group.size())
    shadow = _shadow(group)
    if name in _MATCHED:
        _check_matched(name, tensors, shadow)
    inner = list(tree_map(unwrap, args))
    inner[at] = shadow.boxed()  # (a recorded CPU tensor travels as it is)
    out = func(*inner, **tree_map(unwrap, kwargs))
    own = {id(unwrap(t)): t for t in tensors}
    return tree_map(lambda x: own.get(id(x), x) if isinstance(x, torch.Tensor) else x, out)


def _check(name: str, tensors: list[torch.Tensor], fake: type) -> None:
    module = _device_module()
    if not module.chosen:
        raise NcclRule(
            f"rank {_rank()}: {name} before set_device: NCCL would run it on {TYPE}:{module.current} on "
            f"every rank (object collectives and barriers use the current device){_where()}"
        )
    for t in tensors:
        if not isinstance(t, fake):
            refusal = (
                f"rank {_rank()}: {name} got a CPU tensor of shape {tuple(t.shape)}: NCCL takes device "
                f"tensors only (gloo accepts it, so CPU runs pass){_where()}"
            )
            if os.environ.get(RECORD_ENV) != "1":
                raise NcclRule(refusal)
            HANDOFFS.append(refusal)
            continue
        if t.index != module.current:
            raise NcclRule(
                f"rank {_rank()}: {name} got a tensor on {t.device}, but this rank's device is "
                f"{TYPE}:{module.current}{_where()}"
            )
    if len({t.dtype for t in tensors}) > 1 and name != "barrier":
        dtypes = sorted({str(t.dtype) for t in tensors})
        raise NcclRule(f"rank {_rank()}: {name} mixes dtypes {dtypes}{_where()}")


def _check_sizes(name: str, args: tuple, ranks: int) -> None:
    """The sizes NCCL needs within one rank's call."""
    pairs = {"_allgather_base_": (0, 1), "_reduce_scatter_base_": (1, 0)}  # (larger, smaller) argument
    if name in pairs:
        big, small = (args[i] for i in pairs[name])
        if big.numel() != small.numel() * ranks:
            raise NcclRule(
                f"rank {_rank()}: {name}: {big.numel()} elements for {ranks} ranks of {small.numel()} "
                f"(NCCL needs exactly the group times the shard){_where()}"
            )
    if name == "allgather_":
        shard = args[1][0].numel()
        if any(o.numel() != shard for outs in args[0] for o in outs):
            raise NcclRule(f"rank {_rank()}: allgather_: outputs of another size than the input{_where()}")


def _check_matched(name: str, tensors: list[torch.Tensor], shadow: Any) -> None:
    """Every rank of the group in the same collective, with the same dtype and element count."""
    dtype = tensors[0].dtype if tensors else torch.float32
    mine = torch.tensor(
        [_MATCHED.index(name), _DTYPES.index(dtype), sum(t.numel() for t in tensors)], dtype=torch.int64
    )
    everyone = [torch.empty_like(mine) for _ in range(shadow.size())]
    shadow.allgather([everyone], [mine]).wait()
    if any(not torch.equal(e, mine) for e in everyone):
        calls = [f"{_MATCHED[a]} {_DTYPES[b]} ×{c}" for a, b, c in (e.tolist() for e in everyone)]
        raise NcclRule(
            f"rank {_rank()}: the ranks of a group entered different collectives (NCCL would hang or "
            f"mix them): {', '.join(f'group rank {k}: {c}' for k, c in enumerate(calls))}{_where()}"
        )


_DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
]  # fmt: skip
