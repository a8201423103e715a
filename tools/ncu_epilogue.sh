#!/usr/bin/env bash
# Nsight Compute on one fused-kernel launch and on coda's plain GEMM of the same shape, from
# bench_fused (the first case its --filter selects): where the epilogue's time goes. Writes, per
# kernel, the report, its details page (speed of light, warp states, memory) and the SASS with
# per-instruction stall samples as CSV (tools/ncu_stalls.py summarizes it), under $OUT. Run on
# the GPU machine from the repository root, on a build that has bench_fused:
#   OUT=/tmp/ncu BUILD=build-slim tools/ncu_epilogue.sh K0
# LAUNCH_SKIP=N profiles the fused kernel's (N+1)-th launch instead of its first: bench_fused's
# warm-up launches the default schedule, then cooperative and staged forced, then (except K6)
# ping-pong forced, so LAUNCH_SKIP=2 is the staged kernel and 3 the ping-pong one (its plain GEMM
# is still the first launch).
# PLAIN_KERNEL (a regex, default LinearEpilogue) and PLAIN_SKIP (default 0) pick the plain side:
# on E4M3 operands gemm_fp8's default kernel is the staged one, whose epilogue is a FusedEpilogue
# (Stage and a store) that LinearEpilogue does not match (the K1 and K7 FP8 profiles of
# 2026-12-07 got no plain side); list the case's kernels first (ncu --print-summary per-kernel)
# and set these to gemm_fp8's.
set -uo pipefail
OUT=${OUT:-/tmp/coda_ncu}
BUILD=${BUILD:-build-gpu-check}
FILTER=${1:-K0}
LAUNCH_SKIP=${LAUNCH_SKIP:-0}
PLAIN_KERNEL=${PLAIN_KERNEL:-LinearEpilogue}
PLAIN_SKIP=${PLAIN_SKIP:-0}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BUILD/src${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for side in fused plain; do
  if [[ $side == fused ]]; then
    epilogue=FusedEpilogue skip=$LAUNCH_SKIP name="$FILTER-FusedEpilogue"
  else
    epilogue=$PLAIN_KERNEL skip=$PLAIN_SKIP name="$FILTER-LinearEpilogue"
  fi
  timeout 300 ncu --kernel-name-base demangled --kernel-name "regex:$epilogue" --launch-skip "$skip" \
    --launch-count 1 --set full -f -o "$OUT/$name" \
    "$BUILD/bench/bench_fused" --filter "$FILTER" --runs 1 --out "$OUT/$name-bench.json" \
    >"$OUT/$name.log" 2>&1 || echo "ncu $name failed: $(tail -3 "$OUT/$name.log")"
  ncu --import "$OUT/$name.ncu-rep" --page details >"$OUT/$name-details.txt" 2>&1
  ncu --import "$OUT/$name.ncu-rep" --page source --csv --print-source sass \
    >"$OUT/$name-sass.csv" 2>&1
  grep -E 'Duration|Compute \(SM\) Throughput|Memory Throughput|Warp Cycles Per Issued|Issue Slots Busy|No Eligible' \
    "$OUT/$name-details.txt" | sed "s/^/$name: /" | head -12
done
