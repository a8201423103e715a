#!/usr/bin/env bash
# Where the block's time goes, kernel by kernel: Nsight Compute times every kernel of one forward
# and backward of each side of bench_block (coda, GEMM-only, unfused; bench_block --profile 1),
# each kernel alone with caches flushed, and tools/ncu_kernels.py names and sums them. Run on
# the GPU machine from the repository root, on a build that has bench_block:
#   OUT=/tmp/ncu BUILD=/root/b tools/ncu_block.sh [1b|8b] [TOKENS]
set -uo pipefail
OUT=${OUT:-/tmp/coda_ncu}
BUILD=${BUILD:-build-gpu-check}
MODEL=${1:-1b}
TOKENS=${2:-8192}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BUILD/src${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
csv="$OUT/block-$MODEL-$TOKENS-kernels.csv"
timeout 300 ncu --profile-from-start off --metrics gpu__time_duration.sum --csv \
  --print-kernel-base demangled --cache-control all --clock-control none \
  "$BUILD/bench/bench_block" --models "$MODEL" --tokens "$TOKENS" --runs 1 --check 0 \
  --profile 1 --out "$OUT/block-$MODEL-bench.json" >"$csv" 2>"$OUT/block-$MODEL-ncu.log" ||
  echo "ncu failed: $(tail -3 "$OUT/block-$MODEL-ncu.log")"
python3 "$(dirname "$0")/ncu_kernels.py" "$csv"
