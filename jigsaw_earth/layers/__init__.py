"""jigsaw layers: nn.Modules that take and return this rank's tile, exact under any mesh."""

from .base import Domain, gather_field, init_model, local_domain, parameter_bytes
from .linear import Linear

__all__ = ["Domain", "Linear", "gather_field", "init_model", "local_domain", "parameter_bytes"]
