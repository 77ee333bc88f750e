"""jigsaw layers: nn.Modules that take and return this rank's tile, exact under any mesh."""

from .attention import GlobalAttention, LocalAttention
from .base import Domain, gather_field, init_model, local_domain, parameter_bytes
from .channels import ChannelDim, ModelChannels
from .conv import Conv2d
from .conv_transpose import ConvTranspose2d
from .dropout import Dropout, set_dropout_step
from .linear import Linear
from .mlp import MLP
from .norm import GroupNorm, InstanceNorm, LayerNorm
from .patch import PatchEmbed, PatchRecovery
from .resample import Downsample, Upsample
from .token_mixing import TokenMixing

__all__ = [
    "MLP",
    "ChannelDim",
    "Conv2d",
    "ConvTranspose2d",
    "Domain",
    "Downsample",
    "Dropout",
    "GlobalAttention",
    "GroupNorm",
    "InstanceNorm",
    "LayerNorm",
    "Linear",
    "LocalAttention",
    "ModelChannels",
    "PatchEmbed",
    "PatchRecovery",
    "TokenMixing",
    "Upsample",
    "gather_field",
    "init_model",
    "local_domain",
    "parameter_bytes",
    "set_dropout_step",
]
