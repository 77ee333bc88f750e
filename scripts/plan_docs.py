"""The recommendation tables of docs/plan.md: 0.25° WeatherMixer 1b and 3b on 4, 16 and 256
GPUs of 80 GB, with `jigsaw-earth plan`'s defaults. Prints markdown; paste it over the section.

    python scripts/plan_docs.py > recommendations.md
"""

from __future__ import annotations

from jigsaw_earth.models.plan import Hardware, MeshPlan, plan_meshes, recommend

GRID, CHANNELS, TOKENS = (721, 1440), (69, 2, 4), "46 × 90"


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f}"


def _row(rank: int, p: MeshPlan) -> str:
    cells = [str(rank), p.mesh, _gb(p.memory["total"]), _gb(p.headroom), _gb(sum(p.comm.values())),
             f"{p.compute_s * 1e3:.1f}", f"{p.exposed_s * 1e3:.1f}", f"{p.step_s * 1e3:.1f}",
             f"{p.samples_per_s:.2f}"]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def block(preset: str, world: int) -> list[str]:
    hw = Hardware(tflops=495.0)  # the plan command's default (H100 TF32 dense)
    plans = plan_meshes("weathermixer", preset, GRID, world, CHANNELS, hw)
    best, why = recommend(plans)
    ranked = [p for p in plans if not p.error]
    shown = ranked[:3]
    for extra in ([p for p in ranked if p.data == 1][:1], [p for p in ranked if p.lat * p.lon == 1][:1]):
        shown += [p for p in extra if p not in shown]
    lines = [
        f"**WeatherMixer {preset}, {world} GPUs** — recommended **{best.mesh}**: " + "; ".join(why) + ".",
        "",
    ]
    columns = "rank | mesh | GB/GPU | headroom GB | GB sent/GPU | compute ms | exposed comm ms"
    columns += " | step ms | samples/s"
    lines += [f"| {columns} |", "|---" * 9 + "|"]
    lines += [_row(ranked.index(p) + 1, p) for p in shown]
    fits = sum(p.fits for p in ranked)
    impossible = len(plans) - len(ranked)
    lines += [
        "",
        f"{len(ranked)} meshes priced ({fits} fit), {impossible} impossible on the {TOKENS} token grid.",
        "",
    ]
    return lines


if __name__ == "__main__":
    for preset in ("1b", "3b"):
        for world in (4, 16, 256):
            print("\n".join(block(preset, world)))
