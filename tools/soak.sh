#!/usr/bin/env bash
# The soak run (issue 16, item 5) on an H100/H200: examples/train_llama.py --soak twice from the
# same seed, then tools/soak_compare.py: no NaN or Inf, bitwise-identical loss curves, no growth
# of allocated memory after the first steps. Needs torch and the coda package built with CUDA
# (README "Python"); about 3 minutes a run on an H200 at the default size.
#   tools/soak.sh [OUT]        default soak_out; STEPS=2000 SEED=0 override
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-soak_out}
steps=${STEPS:-2000}
seed=${SEED:-0}
export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}
status=0
for run in 1 2; do
  echo "== soak run $run: $steps steps, seed $seed"
  python3 examples/train_llama.py --soak --steps "$steps" --seed "$seed" --out "$out/run$run" \
    || status=1
done
python3 tools/soak_compare.py "$out/run1/soak.json" "$out/run2/soak.json" \
  --markdown "$out/soak.md" || status=1
echo "== $out/soak.md (for docs/reliability.md)"
exit $status
