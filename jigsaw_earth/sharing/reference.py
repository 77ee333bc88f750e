"""The reference forecast of a shared model: one initial state and the statistics of the forecast
from it, so that a downloaded model proves it reproduces its author's numbers.

At export (``run_reference``, collective) the model forecasts ``steps`` steps from the first
initialisation time of the validation period on the export's mesh; per state channel and step the
global mean, standard deviation, minimum and maximum of the forecast (physical units, every grid
point alike) go to ``reference.json`` with the tolerance, and the initial state to
``reference.safetensors``. ``compare`` sets a rerun's statistics against them: a statistic passes
within ``tolerance`` × the field's expected standard deviation. The tolerance covers another mesh,
device or the plain-PyTorch twin (which differ from the export by float32 rounding, 1e-6 of a
field's spread); a changed weight moves the statistics far beyond it. A stochastic model's
reference runs with its noise at zero.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..data.samples import TrainData
from ..distributed.comm import all_reduce_
from ..distributed.mesh import DomainMesh
from ..models.run import model_step

__all__ = ["STATISTICS", "TOLERANCE", "compare", "field_statistics", "run_reference"]

STATISTICS = ("mean", "std", "min", "max")
#: the tolerance of a reference statistic, in units of the field's standard deviation, by precision
TOLERANCE = {"fp32": 1e-4, "tf32": 1e-2, "bf16": 5e-2}


def _moments(x: torch.Tensor) -> torch.Tensor:
    """``(C, 5)`` float64: count, sum, sum of squares, min, max of each channel of ``(C, h, w)``."""
    flat = x.detach().double().flatten(1)
    n = torch.full((flat.shape[0],), float(flat.shape[1]), dtype=torch.float64, device=x.device)
    return torch.stack([n, flat.sum(1), (flat * flat).sum(1), flat.min(1).values, flat.max(1).values], 1)


def _from_moments(m: torch.Tensor) -> list[dict[str, float]]:
    out = []
    for n, s, q, lo, hi in m.cpu().tolist():
        mean = s / n
        out.append({"mean": mean, "std": math.sqrt(max(q / n - mean * mean, 0.0)), "min": lo, "max": hi})
    return out


def field_statistics(x: torch.Tensor, mesh: DomainMesh | None = None) -> list[dict[str, float]]:
    """Mean, std, min and max of each channel of ``x`` ``(C, h, w)``: over the whole grid, the tiles
    of ``mesh``'s domain reduced (collective), or of ``x`` alone."""
    m = _moments(x)
    if mesh is not None and mesh.domain.size > 1:
        sums, low, high = m[:, :3].contiguous(), m[:, 3].contiguous(), m[:, 4].contiguous()
        all_reduce_(sums, mesh.domain, op="reference.sum")
        all_reduce_(low, mesh.domain, op="reference.min", reduce=torch.distributed.ReduceOp.MIN)
        all_reduce_(high, mesh.domain, op="reference.max", reduce=torch.distributed.ReduceOp.MAX)
        m = torch.cat([sums, low[:, None], high[:, None]], 1)
    return _from_moments(m)


@torch.no_grad()
def run_reference(
    model: torch.nn.Module, data: TrainData, mesh: DomainMesh, init: int, steps: int, precision: str,
    tendency: bool, noise_channels: int,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:  # fmt: skip
    """This rank's tiles of the initial state at store index ``init`` (physical units) and of the
    static fields (as the model reads them), and the expected statistics of ``steps`` forecast
    steps from that state (collective over the mesh)."""
    dev = mesh.device
    batch = data._batch(np.asarray([init]), 0).to(dev)
    state, static = batch.inputs, batch.static
    scale = data.tendency_std.to(dev) if tendency else None
    noise = None
    if noise_channels:
        noise = torch.zeros(1, noise_channels, *state.shape[-2:], device=dev)
    per_step = []
    for k in range(steps):
        tf = data.step_time_features(batch, k).to(dev)
        state = model_step(model, state, static, tf, bf16=precision == "bf16", tendency=scale, noise=noise)
        per_step.append(field_statistics(data.denormalise(state)[0], mesh))
    names = data.channels
    expected = {
        "init_time": str(np.datetime_as_string(np.asarray(data.times)[init], unit="h")),
        "steps": steps,
        "step_hours": data.step_hours,
        "noise": "zeros" if noise_channels else None,
        "tolerance": TOLERANCE[precision],
        "tolerance_means": "each statistic within tolerance × the field's expected std (float32 rounding of "
        "another mesh, device or the plain-PyTorch twin stays far inside it)",
        "fields": {name: [step[c] for step in per_step] for c, name in enumerate(names)},
    }
    state0 = np.asarray(data.source.inputs(init), np.float32)
    return state0, static.cpu().numpy(), expected


def compare(expected: dict[str, Any], got: dict[str, list[dict[str, float]]]) -> list[str]:
    """One line per field, step and statistic of ``got`` outside the tolerance (empty: it matches)."""
    tol = float(expected["tolerance"])
    bad = []
    for name, steps in expected["fields"].items():
        for k, want in enumerate(steps):
            have = got[name][k]
            bound = tol * max(want["std"], 1e-12)
            for stat in STATISTICS:
                if not abs(have[stat] - want[stat]) <= bound:
                    hours = (k + 1) * int(expected["step_hours"])
                    bad.append(
                        f"{name} at +{hours} h: {stat} {have[stat]:.7g} against {want[stat]:.7g} expected "
                        f"(tolerance {bound:.3g})"
                    )
    return bad
