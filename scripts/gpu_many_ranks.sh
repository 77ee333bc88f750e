#!/usr/bin/env bash
# Many ranks on the GPUs of one node (docs/gpu.md, "Many GPUs"), in one go, from the repository root:
#   bash scripts/gpu_many_ranks.sh [WORKDIR]
# Needs the CUDA build of torch and `pip install -e .`. On a node with one GPU every multi-rank run
# shares it (messages staged through pinned host memory); with N >= 2 GPUs the script also runs
# `selftest --nproc N`, one GPU per rank over NCCL. Prints one table; exit 1 when any row fails.
# Expected: every selftest PASS; the demo on mesh 2x2 ends at the CPU 2x2 run's final loss 0.476679;
# NCCL asked for ranks that share a GPU is refused before NCCL starts (exit 2, naming the fix).
# A dry run without a GPU, on the tests' fake accelerator (every rank sharing one fake device):
#   DEVICE=fakegpu JIGSAW_DEVICE_PLUGIN=tests/fakegpu FAKEGPU_COUNT=1 bash scripts/gpu_many_ranks.sh
set -uo pipefail
cd "$(dirname "$0")/.."
work="${1:-$(mktemp -d)}"
mkdir -p "$work"
device="${DEVICE:-auto}"
gpus="$(python -c 'import torch; print(torch.cuda.device_count())')"
rows=()
fail=0

row() {  # row NAME SECONDS VERDICT DETAIL
  rows+=("$(printf '%-44s %7s  %-4s  %s' "$1" "$2" "$3" "$4")")
  [ "$3" = PASS ] || fail=1
}

selftest() {  # selftest NAME ARGS...
  local name="$1" t0 log
  shift
  log="$work/$(echo "$name" | tr ' /' '__').log"
  t0=$(date +%s)
  jigsaw-earth selftest --device "$device" --workdir "$work" "$@" >"$log" 2>&1
  local code=$?
  local last
  last="$(grep -E '^(PASS|FAIL)' "$log" | tail -n 1)"
  row "$name" "$(($(date +%s) - t0)) s" "$([ $code = 0 ] && echo PASS || echo FAIL)" "${last:-see $log}"
  grep -E '^rank [0-9]+:' "$log" | head -n 4 | sed 's/^/    /'
}

python -c 'import torch, jigsaw_earth; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, '\
'{torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}")'
selftest "selftest --nproc 2 (1x2)" --nproc 2
selftest "selftest --nproc 4 (2x2)" --nproc 4
if [ "$gpus" -ge 2 ]; then
  selftest "selftest --nproc $gpus (a GPU each, NCCL)" --nproc "$gpus"
fi

# the demo on mesh 2x2, its four ranks sharing the node's first GPU
t0=$(date +%s)
jigsaw-earth data synth --out "$work/demo/data.zarr" --overwrite >"$work/synth.log" 2>&1
CUDA_VISIBLE_DEVICES=0 torchrun --nproc-per-node 4 -m jigsaw_earth train configs/demo.yaml \
  data.store="$work/demo/data.zarr" run.dir="$work/demo/train" distributed.device="$device" \
  logging.wandb.mode=disabled --new-run >"$work/demo.log" 2>&1
final="$(grep -o 'final loss [0-9.]*' "$work/demo.log" | tail -n 1)"
row "demo, mesh 2x2 sharing one GPU" "$(($(date +%s) - t0)) s" \
  "$([ "$final" = 'final loss 0.476679' ] && echo PASS || echo FAIL)" "${final:-see $work/demo.log} (CPU 2x2: 0.476679)"
grep -o 'messages between ranks: .*' "$work/demo.log" | head -n 1 | sed 's/^/    /'

# NCCL asked for two ranks on one GPU: refused by the package, with the fix, before NCCL starts
if [ "$gpus" -ge 1 ]; then
  CUDA_VISIBLE_DEVICES=0 torchrun --nproc-per-node 2 -m jigsaw_earth train configs/demo.yaml mesh.lat=1 \
    data.store="$work/demo/data.zarr" run.dir="$work/demo/refused" distributed.backend=nccl training.steps=2 \
    logging.wandb.mode=disabled --new-run >"$work/refused.log" 2>&1
  refused="$(grep -o 'distributed.backend=nccl: 2 ranks on this host share.*' "$work/refused.log" | head -n 1)"
  row "backend=nccl on 2 ranks sharing a GPU" "-" "$([ -n "$refused" ] && echo PASS || echo FAIL)" \
    "$(echo "${refused:-not refused: see $work/refused.log}" | cut -c1-90)"
fi

echo
printf '%-44s %7s  %-4s  %s\n' "run" "time" "" "result"
printf '%s\n' "${rows[@]}"
echo "logs: $work"
exit "$fail"
