"""Plain-PyTorch twins of the jigsaw layers and models: derived from them, computed with torch's ops.

``plain(module)`` turns a one-rank jigsaw layer or model into its twin, holding its weights:
each jigsaw layer is swapped for its plain form (``layers.py``), built from the layer's own
geometry; the models keep their own code. ``build_twin(name, grid, ...)`` does it for a
registered model. Each layer's maths is therefore written once; the twin is independent of the
jigsaw layer where that layer computes with its own code (distributed matmuls, convolutions and
window gathers, ring attention, sharded norms, halo exchanges, mesh-invariant dropout), which the
twin replaces by what a PyTorch user would write for the whole field (``nn.Conv2d`` after
``F.pad``, circular in longitude, for the convolutions: ``sphere_pad``). The twins are the
baselines of ``jigsaw-earth bench`` and what its DDP, FSDP2 and tensor-parallel strategies wrap.
"""

from .check import twin_errors
from .derive import build_twin, plain
from .layers import MLP, PLAIN, TokenMixing
from .load import canonical_parameters, load_jigsaw

__all__ = [
    "MLP",
    "PLAIN",
    "TokenMixing",
    "build_twin",
    "canonical_parameters",
    "load_jigsaw",
    "plain",
    "twin_errors",
]
