"""``python -m jigsaw_earth``: the CLI, once the package is known to be installed from this checkout.

``models/`` and ``data/`` sit at the top of the repository and become ``jigsaw_earth.models`` and
``jigsaw_earth.data`` only through the install (pyproject's ``package-dir``). Run from the
repository root without an install, Python finds ``jigsaw_earth/`` in the current folder but not
those two; with another checkout installed, it would mix this checkout's package with that one's
models and data. Either way the command stops with one line saying what to run.
"""

import gc
import sys
from importlib.util import find_spec
from pathlib import Path


def install_problem() -> str | None:
    """What is wrong with the install this ``jigsaw_earth`` runs with, or None."""
    package = Path(__file__).resolve().parent
    root = package.parent
    for sub in ("models", "data"):
        spec = find_spec(f"jigsaw_earth.{sub}")
        if spec is None or spec.origin is None:
            return (
                f"jigsaw_earth.{sub} is not installed (it is {root / sub} in this checkout): "
                f'run `pip install -e .` in {root} first (README, "Quick start")'
            )
        found = Path(spec.origin).resolve().parent
        if (root / sub).is_dir() and found != root / sub:
            return (
                f"jigsaw_earth runs from {package} but jigsaw_earth.{sub} is installed from {found}: "
                f"run `pip install -e .` in {root} to use this checkout"
            )
    return None


if __name__ == "__main__":
    problem = install_problem()
    if problem is not None:
        sys.exit(f"python -m jigsaw_earth: {problem}")

    from .cli import main

    code = main()
    # Python's collection at exit walks every object the imports made (torch, xarray, scipy …): over a
    # second of CPU per rank, which a stopped rank has no time for; frozen, they are left to the OS
    gc.freeze()
    sys.exit(code)
