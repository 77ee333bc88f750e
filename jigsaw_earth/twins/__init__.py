"""Plain-PyTorch twins of the jigsaw layers and models (torch.nn only, no mesh).

Each twin computes what its jigsaw layer or model computes on one rank, with the native op a
PyTorch user would call (``F.conv2d`` after sphere padding, ``F.scaled_dot_product_attention``,
``nn.GroupNorm``, …). ``load_jigsaw(twin, jigsaw_module)`` copies the canonical parameters in.
They are the baselines of ``jigsaw-earth bench`` and what DDP/FSDP/TP comparisons wrap.
"""

from .attention import GlobalAttention, LocalAttention
from .conv import Conv2d, ConvTranspose2d, Downsample, PatchEmbed, PatchRecovery, Upsample
from .dense import MLP, GroupNorm, InstanceNorm, LayerNorm, Linear, TokenMixing
from .load import canonical_parameters, load_jigsaw
from .models import PlainForecaster, PlainUNet, PlainViT, PlainWeatherMixer, build_twin
from .pad import sphere_pad

__all__ = [
    "MLP",
    "Conv2d",
    "ConvTranspose2d",
    "Downsample",
    "GlobalAttention",
    "GroupNorm",
    "InstanceNorm",
    "LayerNorm",
    "Linear",
    "LocalAttention",
    "PatchEmbed",
    "PatchRecovery",
    "PlainForecaster",
    "PlainUNet",
    "PlainViT",
    "PlainWeatherMixer",
    "TokenMixing",
    "Upsample",
    "build_twin",
    "canonical_parameters",
    "load_jigsaw",
    "sphere_pad",
]
