"""jigsaw layers: nn.Modules that take and return this rank's tile, exact under any mesh."""

from .base import Domain, gather_field, init_model, local_domain, parameter_bytes
from .dropout import Dropout, set_dropout_step
from .linear import Linear
from .mlp import MLP
from .norm import GroupNorm, InstanceNorm, LayerNorm
from .token_mixing import TokenMixing

__all__ = [
    "MLP",
    "Domain",
    "Dropout",
    "GroupNorm",
    "InstanceNorm",
    "LayerNorm",
    "Linear",
    "TokenMixing",
    "gather_field",
    "init_model",
    "local_domain",
    "parameter_bytes",
    "set_dropout_step",
]
