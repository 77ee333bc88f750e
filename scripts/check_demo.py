"""Exit non-zero unless the demo's model beats persistence and climatology at every validated lead.

Used by CI after the README's demo command: ``python scripts/check_demo.py runs/demo/train``, and
after its fine-tune (``runs/demo/finetune``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(run_dir: str) -> int:
    summary = json.loads((Path(run_dir) / "summary.json").read_text())
    val = summary["validation"]
    keys = sorted({k.rsplit("/", 1)[0] for k in val if k.endswith("/model")})
    failed = []
    for key in keys:
        model = val[f"{key}/model"]
        for base in ("persistence", "climatology"):
            other = val.get(f"{key}/{base}")
            if other is not None and not model < other:
                failed.append(f"{key}: model {model:.4g} >= {base} {other:.4g}")
        pers, clim = (val.get(f"{key}/{b}", float("nan")) for b in ("persistence", "climatology"))
        print(f"{key:<12} model {model:>10.4g}  persistence {pers:>10.4g}  climatology {clim:>10.4g}")
    print(f"demo: {summary['steps']} steps, {summary['samples_per_s']:.1f} samples/s, mesh {summary['mesh']}")
    if failed or not keys:
        print("demo does not beat the baselines:\n" + "\n".join(failed or ["no validation results"]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "runs/demo/train"))
