"""``jigsaw-earth model summary``: parameters, per-rank memory and communication of a model
(``model export`` and ``model verify``, sharing a trained model: ``model_share.py``).

Constructs every domain rank's model on the ``meta`` device (nothing is allocated), so the
paper-scale presets at 721 × 1440 are summarised in seconds::

    jigsaw-earth model summary --model weathermixer --preset 3b --mesh 2x2 --grid 721x1440
    jigsaw-earth model summary --config run.yaml --mesh 2x2 --json summary.json
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import yaml

from ..argtypes import parse_grid, parse_ints
from ..distributed.mesh import parse_mesh
from ..models import MODELS, model_entry
from ..models.summary import ModelSummary, summarize
from .checked_write import check_json, write_json

JSON_KEYS = ("model", "mesh", "total_params")

__all__ = ["add_parser", "model_spec", "run"]

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "model", help="describe a model (parameters, per-rank memory, communication); export and verify one"
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    s = actions.add_parser("summary", help="sizes and per-step communication on a mesh, without allocating")
    s.add_argument(
        "--config", metavar="YAML|PRESET", help="a config file with a model: section, or a preset name"
    )
    s.add_argument(
        "--model",
        help="registered model or package.module:Class (all built-ins unless this or --config names one)",
    )
    s.add_argument(
        "--preset", help="preset (tiny, small, 1b, 3b, paper-c1, paper-1.1b); overrides the config's"
    )
    s.add_argument("--mesh", default="2x2", metavar="LATxLON", help="domain mesh (default 2x2)")
    s.add_argument("--grid", default="721x1440", metavar="NLATxNLON", help="global grid (default 721x1440)")
    s.add_argument(
        "--channels",
        metavar="STATE,STATIC,TIME",
        help="input channels: state (variables × levels), static fields, time features (default: from the "
        "config's data section, else 69,2,4 — the paper's 5 upper-air variables × 13 levels + 4 surface)",
    )
    s.add_argument("--batch", type=int, default=1, help="samples per domain group per step (default 1)")
    s.add_argument(
        "--members",
        type=int,
        metavar="M",
        help="ensemble members per sample (default: the config's training.members, else 1); with a mesh "
        "1xExLATxLON, M / E of them batched per rank",
    )
    s.add_argument("--json", type=Path, metavar="PATH", help="write the summaries as JSON")
    s.set_defaults(run=run)
    from .model_share import add_actions

    add_actions(actions)


def _config_channels(doc: dict) -> str | None:
    """``STATE,STATIC,TIME`` from a config's data section (upper_air × levels + surface)."""
    data = doc.get("data") or {}
    if not all(k in data for k in ("upper_air", "levels", "surface")):
        return None
    n_state = len(data["upper_air"]) * len(data["levels"]) + len(data["surface"])
    return f"{n_state},2,4"


def model_spec(args: argparse.Namespace) -> list[tuple[str, str, dict[str, Any]]]:
    """``(name, preset, overrides)`` for each model to summarise, from ``--config`` and flags."""
    name, preset, overrides = args.model, args.preset, {}
    cfg = args.config
    if cfg and (cfg.endswith((".yaml", ".yml")) or Path(cfg).exists()):
        path = Path(cfg)
        if not path.exists():
            raise FileNotFoundError(f"--config {cfg}: no such file; pass an existing YAML or a preset name")
        doc = yaml.safe_load(path.read_text()) or {}
        args.channels = args.channels or _config_channels(doc)
        if getattr(args, "members", 1) is None:
            args.members = int((doc.get("training") or {}).get("members", 1))
        section = doc.get("model")
        if not isinstance(section, dict):
            raise ValueError(f"--config {cfg}: no 'model:' section (with name, preset and overrides)")
        section = dict(section)
        name = name or section.pop("name", None)
        preset = preset or section.pop("preset", None)
        section.pop("name", None), section.pop("preset", None)
        noise = int(section.pop("noise_channels", 0) or 0)
        if noise:  # noise channels are static inputs of a stochastic model
            n_state, n_static, n_time = (args.channels or "69,2,4").split(",")
            args.channels = f"{n_state},{int(n_static) + noise},{n_time}"
        overrides = section.pop("overrides", None) or section
    elif cfg:
        if ":" in cfg:  # name:preset
            name, preset = cfg.split(":", 1)
        else:
            preset = preset or cfg
    names = [name] if name else list(MODELS)
    # a model without a 'tiny' preset gets its own default
    return [(n, preset or model_entry(n).default_preset, dict(overrides)) for n in names]


def _gib(n: int) -> str:
    """Bytes in the largest binary unit that keeps the number ≥ 1 (fixed width)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:8.2f} {unit}"
    return f"{n:8d} B  "


def _print(s: ModelSummary) -> None:
    print(f"{s.model} preset={s.preset} mesh={s.mesh} grid={s.grid[0]}x{s.grid[1]} batch={s.batch}")
    print(f"  parameters             {s.total_params:>16,}")
    print(f"  per-rank parameters    {', '.join(f'{n:,}' for n in s.rank_params)}")
    print(
        f"  FLOP per sample        {s.forward_flops / 1e12:8.2f} T forward, {s.backward_flops / 1e12:.2f} T "
        "backward (all ranks; matmuls and norms, from the layers' cost declarations)"
    )
    print(f"  per-rank param bytes   {_gib(s.rank_param_bytes_max)}  (max over ranks, fp32)")
    print(
        f"  per-rank train bytes   {_gib(s.rank_train_bytes_max)}  (param + grad + AdamW 2 states; "
        f"1 rank: {_gib(s.serial_train_bytes).strip()}; ratio {s.train_bytes_ratio:.4f})"
    )
    m = s.step_memory
    states, acts = _gib(m["parameters"] + m["optimizer"]).strip(), _gib(m["activations"] + m["transient"])
    print(
        f"  per-rank step memory   {_gib(m['total'])}  (rank 0, batch {s.batch}: param + AdamW {states}, "
        f"grads {_gib(m['gradients']).strip()}, activations {acts.strip()} at the backward's peak; "
        "as `jigsaw-earth plan`)"
    )
    print(f"  checkpoint bytes       {_gib(s.checkpoint_bytes)}  (model + AdamW state, fp32, all ranks)")
    print(
        f"  comm per step          {_gib(s.comm_forward_bytes)} forward, "
        f"{_gib(s.comm_backward_bytes).strip()} backward (all ranks of the domain group)"
    )
    for op, (f, b) in sorted(s.comm_by_layer.items()):
        print(f"    {op:<22} {_gib(f)} fwd {_gib(b)} bwd")
    if s.data_parallel_allreduce_bytes:
        print(
            f"  data-parallel grads    {_gib(s.data_parallel_allreduce_bytes)} per step "
            "(ring all-reduce over data x ensemble)"
        )
    if s.members > 1:
        print(
            f"  ensemble               {s.members} members per sample; members' gather before the loss "
            f"{_gib(s.ensemble_gather_bytes).strip()} per step (all ranks of the domain group)"
        )
    print(f"  summarised in {s.seconds:.2f} s")


def run(args: argparse.Namespace) -> int:
    check_json(args.json, "--json", *JSON_KEYS)
    shape = parse_mesh(args.mesh)
    grid = parse_grid(args.grid, example="721x1440")
    specs = model_spec(args)
    chans = parse_ints(args.channels or "69,2,4", "--channels", 3, sep=",", minimum=0, example="69,2,4")
    if args.batch < 1:
        raise ValueError(f"--batch {args.batch}: use a positive number of samples")
    members = 1 if args.members is None else args.members
    if members < 1 or members % shape.ensemble:
        raise ValueError(
            f"--members {members}: use a positive number of members that splits over the mesh's "
            f"ensemble axis of {shape.ensemble}"
        )
    out = []
    for name, preset, overrides in specs:
        kw = {"preset": preset, "batch": args.batch, "members": members}
        s = summarize(name, shape, (grid[0], grid[1]), *chans, **kw, **overrides)
        _print(s)
        out.append(s.as_dict())
    if args.json:
        write_json(args.json, out, "--json", *JSON_KEYS)
    return 0
