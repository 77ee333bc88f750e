"""Fair CRPS, ensemble-mean RMSE, spread and spread/skill of a trained run at one lead, in one process.

A cross-check of an ensemble run straight from its checkpoint (the validation inits of its config,
physical units, WB2 latitude weights, the headline channels), for the figures of docs/ensembles.md:

    python scripts/ensemble_scores.py runs/ensemble-demo/train --members 8 --lead-hours 24

Members are drawn with the noise stream predict uses (``training/noise.py``); the CRPS is the
trainer's fair CRPS (``training.crps.ensemble_crps``, α = 1). A deterministic run (no noise
channels) has one member, and its CRPS is its mean absolute error. Forecast stores with a member
dimension are scored by ``jigsaw-earth score`` (WB2's ensemble metrics).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import yaml

from jigsaw_earth.checkpoint import latest_checkpoint, load_checkpoint
from jigsaw_earth.config import parse_config
from jigsaw_earth.distributed.mesh import DomainMesh, MeshShape
from jigsaw_earth.training.crps import ensemble_crps
from jigsaw_earth.training.noise import forecast_sample_index, member_noise
from jigsaw_earth.training.sources import build_data
from jigsaw_earth.training.step import build_run_model, model_step

CHANNELS = ["geopotential@500", "temperature@850", "2m_temperature"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path, help="run directory (config.yaml and checkpoints/)")
    p.add_argument("--members", type=int, default=8, help="members to draw (1 for a deterministic run)")
    p.add_argument("--lead-hours", type=int, default=24)
    p.add_argument("--inits", type=int, default=64, help="validation inits, evenly spaced")
    args = p.parse_args()
    raw = yaml.safe_load((args.run / "config.yaml").read_text())
    raw["mesh"] = {"data": 1, "ensemble": 1, "lat": 1, "lon": 1}
    cfg = parse_config(raw)
    mesh = DomainMesh(MeshShape())
    data = build_data(cfg, mesh, training=False)
    model = build_run_model(cfg, mesh, data)
    load_checkpoint(latest_checkpoint(args.run), model, None, mesh)
    model.eval()
    steps = args.lead_hours // data.step_hours
    tend = data.tendency_std if cfg.loss.tendency_scaling else None
    k_noise, g = cfg.model.noise_channels, data.grid
    members = args.members if k_noise else 1
    lat_w, one = data.lat_weights.double(), torch.ones(1, dtype=torch.float64)
    inits = data.val_inits(steps, args.inits)
    sums = {name: [0.0, 0.0, 0.0] for name in CHANNELS}  # CRPS, squared error of the mean, variance
    with torch.no_grad():
        for k0 in range(0, len(inits), 8):
            batch = data._batch(inits[k0 : k0 + 8], steps)
            b, samples = batch.inputs.shape[0], forecast_sample_index(batch.times)
            runs = []
            for m in range(members):
                state = batch.inputs
                for k in range(steps):
                    shape = (b, k_noise, g.n_lat, g.n_lon)
                    noise = None if not k_noise else member_noise(
                        shape, seed=cfg.run.seed, member=m, sample_index=samples, step=k, tile=batch.tile,
                        grid=(g.n_lat, g.n_lon),
                    )  # fmt: skip
                    tf = data.step_time_features(batch, k)
                    state = model_step(model, state, batch.static, tf, bf16=False, tendency=tend, noise=noise)
                runs.append(data.denormalise(state).double())
            ens, truth = torch.stack(runs), data.denormalise(batch.targets[:, -1]).double()
            for name in CHANNELS:
                c = data.channels.index(name)
                x, y = ens[:, :, c : c + 1], truth[:, c : c + 1]
                s = sums[name]
                s[0] += float(ensemble_crps(x, y, lat_w, one, alpha=1.0)) / (g.n_lat * g.n_lon)
                s[1] += float(((x.mean(0) - y) ** 2 * lat_w.view(-1, 1)).mean(dim=(-1, -2, -3)).sum())
                if members > 1:
                    s[2] += float((x.var(0) * lat_w.view(-1, 1)).mean(dim=(-1, -2, -3)).sum())
    n = len(inits)
    print(f"{args.run}: {n} inits, {members} member(s), lead {args.lead_hours} h")
    for name, (crps, sq, var) in sums.items():
        rmse, spread = (sq / n) ** 0.5, (var / n) ** 0.5
        print(f"  {name:<18} CRPS {crps / n:10.4g}  ens-mean RMSE {rmse:10.4g}  spread {spread:10.4g}  "
              f"spread/skill {spread / rmse:6.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
