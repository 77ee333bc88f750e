"""U-Net forecaster on jigsaw layers.

    fields ─ ConvBlock(c0) ──────────────────────────────────────── concat ─ ConvBlock(c0) ─ 1×1 ─▶ Δ
                └ Downsample ─ ConvBlock(c1) ────────── concat ─ ConvBlock(c1) ┘ Upsample
                                  └ Downsample ─ ConvBlock(c2) ─ Upsample ┘

A conv block is ``convs_per_block`` × (3×3 Conv2d → GroupNorm → activation); its convolutions
have no bias (the norm subtracts each group's mean, so a bias would only add a per-group dead
direction and noise to the gradients). Convolutions pad
periodically in longitude and by ``lat_mode`` beyond the poles (``"pole"``: across the pole,
180° away). Every level keeps the global grid it was computed on (``out_domain``), and each
up-sampling returns exactly the grid of its skip connection, so odd grids (721 × 1440, 33 × 64)
need no cropping. Group-norm statistics are global, so the model is exact on every mesh.
"""

from __future__ import annotations

import itertools

import torch
from jigsaw_earth.models.common import Forecaster
from jigsaw_earth.models.presets import UNetConfig
from torch import nn

from jigsaw_earth.layers.base import Domain
from jigsaw_earth.layers.conv import Conv2d
from jigsaw_earth.layers.cost import Cost
from jigsaw_earth.layers.mlp import get_activation
from jigsaw_earth.layers.norm import GroupNorm
from jigsaw_earth.layers.resample import Downsample, Upsample

__all__ = ["ConvBlock", "UNet"]


class ConvBlock(nn.Module):
    """``n`` × (Conv2d → GroupNorm → activation) on a field tile ``(B, C, h, w)``."""

    def __init__(self, domain: Domain, in_ch: int, out_ch: int, cfg: UNetConfig):
        super().__init__()
        self.act, self.activation = get_activation(cfg.activation), cfg.activation
        self.domain, self.out_ch = domain, out_ch
        self.convs = nn.ModuleList(
            Conv2d(domain, in_ch if i == 0 else out_ch, out_ch, cfg.kernel, lat_mode=cfg.lat_mode, bias=False)
            for i in range(cfg.convs_per_block)
        )
        self.norms = nn.ModuleList(GroupNorm(domain, cfg.groups, out_ch) for _ in range(cfg.convs_per_block))

    def cost(self, batch: int, elsize: int = 4, input_grad: bool = True) -> Cost:
        """The activation after each norm saves its input (the layers price themselves)."""
        if self.activation == "identity":
            return Cost()
        return Cost(
            saved=len(self.convs) * self.domain.counts(batch)[self.domain.index] * self.out_ch * elsize
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv, norm in zip(self.convs, self.norms):
            x = self.act(norm(conv(x)))
        return x


class UNet(Forecaster):
    """``forward(state (B, n_state, h, w), static (n_static, h, w), time (B, n_time))`` → next state."""

    input_layer = "encoder.0.convs.0"  # the layer that reads the assembled input
    output_layer = "head"  # the 1x1 convolution to the state's channels

    def __init__(
        self, domain: Domain, n_state: int, n_static: int, n_time: int, cfg: UNetConfig | None = None
    ):
        cfg = cfg or UNetConfig()
        super().__init__(domain, n_state, n_static, n_time, cfg.residual, cfg.coord_channels)
        if not cfg.channel_mults or cfg.convs_per_block < 1:
            raise ValueError(
                f"UNet needs at least one level and one conv per block, got channel_mults="
                f"{cfg.channel_mults} and convs_per_block={cfg.convs_per_block}"
            )
        self.cfg = cfg
        chans = [cfg.base_channels * m for m in cfg.channel_mults]
        domains = [domain]
        self.encoder = nn.ModuleList([ConvBlock(domain, self.in_channels, chans[0], cfg)])
        self.down = nn.ModuleList()
        for lo, hi in itertools.pairwise(chans):
            self.down.append(Downsample(domains[-1], lo, hi, mode=cfg.down, lat_mode=cfg.lat_mode))
            domains.append(self.down[-1].out_domain)
            self.encoder.append(ConvBlock(domains[-1], hi, hi, cfg))
        self.up = nn.ModuleList()
        self.decoder = nn.ModuleList()
        for level in reversed(range(len(chans) - 1)):
            fine = domains[level].grid
            coarse, size = domains[level + 1], (fine.n_lat, fine.n_lon)
            self.up.append(
                Upsample(
                    coarse, chans[level + 1], chans[level], mode=cfg.up, out_grid=size, lat_mode=cfg.lat_mode
                )
            )
            self.decoder.append(ConvBlock(domains[level], 2 * chans[level], chans[level], cfg))
        self.head = Conv2d(domain, chans[0], n_state, 1)

    def forward_stage(self, path: str) -> int:
        """``encoder.0, down.0, encoder.1, …, up.0, decoder.0, …, head``: the order ``predict``
        runs them in (registration keeps each list together)."""
        top, _, rest = path.partition(".")
        i, levels = int(rest.partition(".")[0] or 0), len(self.encoder)
        up = 2 * levels + 2 * i  # after the whole encoder
        return {"encoder": 2 * i, "down": 2 * i + 1, "up": up, "decoder": up + 1}.get(top, 4 * levels)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        skips = [self.encoder[0](x)]
        for down, block in zip(self.down, self.encoder[1:]):
            skips.append(block(down(skips[-1])))
        y = skips.pop()
        for up, block in zip(self.up, self.decoder):
            y = block(torch.cat([up(y), skips.pop()], dim=1))
        return self.head(y)
