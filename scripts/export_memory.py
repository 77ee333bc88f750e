"""Peak memory per rank while a model's weights are exported as safetensors, and the load back.

    python scripts/export_memory.py --out runs/export-memory [--preset paper-1.1b --grid 720x1440]
        [--export-mesh 2x2 --load-mesh 1x4 --max-file-size 2GB --json runs/export-memory.json]

Builds the WeatherMixer ``--preset`` (random weights: ``init_model``, seed 0, which gives every
mesh the same values) with the paper's 69 state and 3 static channels on ``--export-mesh`` CPU
ranks and writes its weights into ``--out`` as ``model export`` does (``sharing.export.
write_weights``: consolidated tensors, files of at most ``--max-file-size``, each rank writing its
own blocks). Per rank it reports the bytes of its parameters (its share), its resident memory
before the export and the peak during it (``VmHWM`` of ``/proc/self/status``, reset just before
the write). Then on ``--load-mesh`` ranks it builds the same weights again and reads every block
of every tensor back from the files (as a load does, one block at a time), comparing each with
the weights built there bit for bit, and reports that peak too. Exits 1 unless every block is
equal.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from jigsaw_earth.models import build_model

from jigsaw_earth.argtypes import parse_bytes, parse_grid
from jigsaw_earth.checkpoint.safetensors_files import SafetensorsFiles
from jigsaw_earth.checkpoint.state import model_blocks
from jigsaw_earth.distributed.mesh import DomainMesh, parse_mesh
from jigsaw_earth.distributed.spawn import spawn
from jigsaw_earth.layers.base import Domain, init_model, parameter_bytes
from jigsaw_earth.sharing.export import write_weights

CHANNELS = (
    69,
    3,
    0,
)  # the Jigsaw paper's 1.1 B model: 69 state, 3 static, no time features (models/paper.py)
INDEX = "weight_map.json"


def _status(key: str) -> int:
    """``VmRSS``, ``VmHWM``, … of this process, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux)


def _model(mesh: DomainMesh, preset: str, grid: tuple[int, int]) -> torch.nn.Module:
    domain = Domain.create(mesh, *grid)
    return init_model(build_model("weathermixer", domain, *CHANNELS, preset), 0)


def _export(mesh: DomainMesh, preset: str, grid: tuple[int, int], out: str, max_bytes: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    model = _model(mesh, preset, grid)
    built = time.perf_counter() - t0
    gc.collect()
    before = _status("VmRSS")
    _reset_peak()
    t0 = time.perf_counter()
    layouts, weight_map = write_weights(Path(out), model, mesh, max_bytes, {"format": "pt"})
    seconds = time.perf_counter() - t0
    peak = _status("VmHWM")
    if mesh.rank == 0:
        (Path(out) / INDEX).write_text(json.dumps(weight_map))
    files = [[lay.name, lay.size] for lay in layouts]
    return {"rank": mesh.rank, "share": parameter_bytes(model), "before": before, "peak": peak,
            "write_s": seconds, "build_s": built, "files": files}  # fmt: skip


def _load(mesh: DomainMesh, preset: str, grid: tuple[int, int], out: str) -> dict[str, Any]:
    model = _model(mesh, preset, grid)
    gc.collect()
    before = _status("VmRSS")
    _reset_peak()
    weight_map = json.loads((Path(out) / INDEX).read_text())
    differ, blocks, largest = [], 0, 0
    t0 = time.perf_counter()
    with SafetensorsFiles(Path(out)) as files, torch.no_grad():
        for key, (block, _) in model_blocks(model).items():
            name = key.removeprefix("model/")
            part = files.read(weight_map[name], name, tuple(block.offsets), tuple(block.tensor.shape))
            if not torch.equal(part, block.tensor):
                differ.append(name)
            blocks += 1
            largest = max(largest, part.numel() * part.element_size())
            del part
    return {"rank": mesh.rank, "share": parameter_bytes(model), "before": before, "peak": _status("VmHWM"),
            "read_s": time.perf_counter() - t0, "blocks": blocks, "largest_block": largest,
            "differ": differ}  # fmt: skip


def _mib(n: int) -> str:
    return f"{n / 2**20:9.1f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the weight files (replaced)")
    parser.add_argument("--preset", default="paper-1.1b")
    parser.add_argument("--grid", default="720x1440")
    parser.add_argument("--export-mesh", default="2x2")
    parser.add_argument("--load-mesh", default="1x4")
    parser.add_argument("--max-file-size", default="2GB")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    grid = tuple(parse_grid(args.grid, example="720x1440"))
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    max_bytes = parse_bytes(args.max_file_size, "--max-file-size", "2GB")
    wrote = spawn(parse_mesh(args.export_mesh), _export, args.preset, grid, str(out), max_bytes)
    read = spawn(parse_mesh(args.load_mesh), _load, args.preset, grid, str(out))
    files = wrote[0]["files"]
    largest, total = _mib(max(s for _, s in files)).strip(), _mib(sum(s for _, s in files)).strip()
    print(
        f"weathermixer {args.preset} on {grid[0]}x{grid[1]}: {len(files)} file(s), largest {largest}, "
        f"{total} in all"
    )
    print(f"export on {args.export_mesh}: rank, share (its parameters), resident before, peak during, extra")
    for r in wrote:
        extra = r["peak"] - r["before"]
        print(f"  {r['rank']}  {_mib(r['share'])} {_mib(r['before'])} {_mib(r['peak'])} {_mib(extra)}  "
              f"write {r['write_s']:.1f} s")  # fmt: skip
    print(f"load on {args.load_mesh}: rank, share, resident before, peak while reading, extra, largest block")
    for r in read:
        extra = r["peak"] - r["before"]
        counts = f"{r['blocks']} blocks, {len(r['differ'])} differ, read {r['read_s']:.1f} s"
        print(f"  {r['rank']}  {_mib(r['share'])} {_mib(r['before'])} {_mib(r['peak'])} {_mib(extra)} "
              f"{_mib(r['largest_block'])}  {counts}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"export": wrote, "load": read, "args": vars(args)}, indent=1))
    return 0 if not any(r["differ"] for r in read) else 1


if __name__ == "__main__":
    raise SystemExit(main())
