"""``model verify DIR``: does this folder reproduce its author's numbers?

Every file is checked against the export's record (present, its size, its SHA-256; ``contract.json``
unchanged), the model is loaded as ``load_model`` loads it, and the reference forecast runs from
its initial state: each field's mean, std, min and max after each step must match ``reference.json``
within its tolerance. The result lists every difference, naming the file, or the field, step and
statistic.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .folder import REFERENCE, REFERENCE_STATE, ModelFolder
from .plain import load_model
from .reference import STATISTICS, compare, field_statistics

__all__ = ["Verification", "verify_model"]


@dataclass
class Verification:
    """What ``verify_model`` found: ``problems`` (empty: the folder reproduces its reference), the
    files checked, the statistics compared and the largest deviation in units of the tolerance."""

    path: Path
    problems: list[str] = field(default_factory=list)
    files: int = 0
    compared: int = 0
    worst: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_model(path: str | Path, device: str = "cpu", twin: bool = True) -> Verification:
    """Check the folder's files and rerun its reference forecast on ``device`` (``twin``: with the
    plain-PyTorch twin, as ``load_model`` loads it)."""
    folder = ModelFolder.open(path)  # missing or truncated files, a changed contract: refused here
    result = Verification(Path(path), folder.verify_files(), len(folder.record["files"]))
    model = load_model(path, device, twin=twin)
    expected = json.loads((folder.path / REFERENCE).read_text())
    grid = folder.contract["grid"]
    names = model.channels
    state = folder.read(REFERENCE_STATE, "state", (0, 0, 0), (len(names), grid["n_lat"], grid["n_lon"]))
    init = np.datetime64(expected["init_time"], "h")
    out = model.forecast(state[None].to(device), init, int(expected["steps"]))
    got = {name: [] for name in names}
    for k in range(out.shape[0]):
        for c, stats in enumerate(field_statistics(out[k, 0])):
            got[names[c]].append(stats)
    result.problems += compare(expected, got)
    tol = float(expected["tolerance"])
    for name, steps in expected["fields"].items():
        for k, want in enumerate(steps):
            for stat in STATISTICS:
                deviation = abs(got[name][k][stat] - want[stat]) / (tol * max(want["std"], 1e-12))
                result.worst = max(result.worst, deviation)
                result.compared += 1
    return result
