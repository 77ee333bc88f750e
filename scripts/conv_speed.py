"""One-rank speed and peak memory of the convolution-like layers against their plain-torch twins.

    python scripts/conv_speed.py [--repeats 7] [--case conv_pole ...]

Each case runs forward + backward of the jigsaw layer (A) and of a plain-torch twin holding the
same weights (B), interleaved A B B A over the repeats; it prints the median of the per-repeat
time ratios A/B (wall and CPU time) and the ratio of peak RSS growth (VmHWM reset through
/proc/self/clear_refs) of one step each. Outputs are checked equal first. One torch thread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from jigsaw_earth.distributed.halo import Halo, pad_reference
from jigsaw_earth.layers.base import local_domain
from jigsaw_earth.layers.conv import Conv2d
from jigsaw_earth.layers.patch import PatchEmbed, PatchRecovery
from jigsaw_earth.layers.resample import Downsample, Upsample

GRID = (64, 128)
B = 2


def _full(p: torch.Tensor) -> torch.Tensor:
    return p.detach().clone()


def case_conv(lat_mode: str):
    layer = Conv2d(local_domain(*GRID), 64, 64, 3, lat_mode=lat_mode)
    w, b = _full(layer.weight).requires_grad_(), _full(layer.bias).requires_grad_()
    halo = Halo.uniform(1, lat_mode)
    x = torch.randn(B, 64, *GRID)
    return layer, (lambda x: F.conv2d(pad_reference(x, halo), w, b)), x


def case_patch_embed():
    layer = PatchEmbed(local_domain(*GRID), 8, 128, 4)
    w, b = _full(layer.weight).requires_grad_(), _full(layer.bias).requires_grad_()
    x = torch.randn(B, 8, *GRID)
    return layer, (lambda x: F.conv2d(x, w.T.reshape(128, 8, 4, 4), b, 4).permute(0, 2, 3, 1)), x


def case_downsample():
    layer = Downsample(local_domain(*GRID), 64, 64, "conv", 2)
    w, b = _full(layer.conv.weight).requires_grad_(), _full(layer.conv.bias).requires_grad_()
    halo = Halo((1, 1), (1, 1), "zeros", "periodic")
    x = torch.randn(B, 64, *GRID)
    return layer, (lambda x: F.conv2d(pad_reference(x, halo), w, b, 2)), x


def case_upsample():
    g = (GRID[0] // 2, GRID[1] // 2)
    layer = Upsample(local_domain(*g), 64, 64, "transposed", 2)
    w, b = _full(layer.conv.weight).requires_grad_(), _full(layer.conv.bias).requires_grad_()
    x = torch.randn(B, 64, *g)
    return layer, (lambda x: F.conv_transpose2d(x, w, b, 2)), x


def case_patch_recovery():
    tok = (GRID[0] // 4, GRID[1] // 4)
    layer = PatchRecovery(local_domain(*tok), 128, 8, 4, out_grid=GRID)
    w, b = _full(layer.weight).requires_grad_(), _full(layer.bias).requires_grad_()
    x = torch.randn(B, *tok, 128)

    def twin(x):
        cols = F.linear(x.reshape(B, -1, 128), w.T, b).transpose(1, 2)
        return F.fold(cols, GRID, 4, stride=4)

    return layer, twin, x


CASES = {
    "conv_zeros": lambda: case_conv("zeros"),
    "conv_pole": lambda: case_conv("pole"),
    "patch_embed": case_patch_embed,
    "downsample": case_downsample,
    "upsample": case_upsample,
    "patch_recovery": case_patch_recovery,
}


def _step(fn, x, gy):
    x = x.detach().requires_grad_()
    y = fn(x)
    y.backward(gy)
    return y


def _timed(fn, x, gy) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    _step(fn, x, gy)
    return time.perf_counter() - w0, time.process_time() - c0


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(field)


def _peak_kib(fn, x, gy) -> int:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _rss_kib("VmRSS")
    _step(fn, x, gy)
    return _rss_kib("VmHWM") - before


def peaks(name: str) -> tuple[float, float]:
    """Peak RSS growth (MiB) of one step of the layer and of its twin (run with large blocks mmapped)."""
    layer, twin, x = CASES[name]()
    gy = torch.randn_like(twin(x))
    mem = [_peak_kib(fn, x, gy) for fn in (layer, twin, layer, twin)]
    return min(mem[0], mem[2]) / 1024, min(mem[1], mem[3]) / 1024


def run(name: str, repeats: int) -> None:
    layer, twin, x = CASES[name]()
    ya, yb = layer(x), twin(x)
    err = (ya - yb).abs().max().item() / yb.abs().max().item()
    gy = torch.randn_like(yb)
    for fn in (layer, twin, layer, twin):  # warm up
        _step(fn, x, gy)
    ratios_w, ratios_c = [], []
    for r in range(repeats):
        order = (layer, twin) if r % 2 == 0 else (twin, layer)
        t = {id(fn): _timed(fn, x, gy) for fn in order}
        (wa, ca), (wb, cb) = t[id(layer)], t[id(twin)]
        ratios_w.append(wa / wb)
        ratios_c.append(ca / cb)
    # large blocks mmapped (fixed threshold), so the process's RSS follows live memory
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run(
        [sys.executable, __file__, "--peaks", name], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    ma, mb = float(out[0]), float(out[1])
    print(
        f"{name:15s} err {err:.1e}  time x{statistics.median(ratios_w):.2f} "
        f"(cpu x{statistics.median(ratios_c):.2f}, spread {min(ratios_w):.2f}-{max(ratios_w):.2f})  "
        f"peak {ma:.1f} / {mb:.1f} MiB = x{ma / max(mb, 1e-3):.2f}",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--case", action="append", choices=list(CASES))
    p.add_argument("--peaks", choices=list(CASES), help=argparse.SUPPRESS)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.peaks:
        print(*peaks(args.peaks))
        return
    for name in args.case or list(CASES):
        run(name, args.repeats)


if __name__ == "__main__":
    main()
