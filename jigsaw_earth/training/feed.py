"""Training batches on the compute device, one step ahead (``Feeder``).

On a GPU the host-to-device copy of step ``s + 1``'s batch (page-locked memory, a side stream) runs
while step ``s``'s backward pass computes, so a step never waits for its own copy; the compute stream
waits for the side stream only where it first reads the batch. On the CPU a batch is used where it is.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..data.batch import Batch

__all__ = ["Feeder"]

_TENSORS = ("inputs", "targets", "static", "time_features")


class Feeder:
    """``get(step)``: the batch of ``step`` on ``device``; ``ahead(step)``: start copying it now."""

    def __init__(self, read: Callable[[int], Batch], device: torch.device) -> None:
        self.read, self.device = read, device
        self._side = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._ahead: tuple[int, Batch, Batch] | None = None  # (step, host batch, device batch)

    def ahead(self, step: int) -> None:
        """Read ``step``'s batch (it waits for the host read) and start its copy to the device."""
        if self._side is None or (self._ahead is not None and self._ahead[0] == step):
            return
        host = self.read(step)
        with torch.cuda.stream(self._side):
            self._ahead = (step, host, host.to(self.device, non_blocking=True))

    def get(self, step: int) -> Batch:
        """``step``'s batch on the device (copied ahead, or now)."""
        if self._side is None:
            return self.read(step).to(self.device)
        if self._ahead is None or self._ahead[0] != step:
            self._ahead = None
            self.ahead(step)
        _, _, batch = self._ahead  # type: ignore[misc]
        self._ahead = None
        compute = torch.cuda.current_stream(self.device)
        compute.wait_stream(self._side)
        for name in _TENSORS:  # made on the side stream, used and freed on the compute stream
            getattr(batch, name).record_stream(compute)
        return batch
