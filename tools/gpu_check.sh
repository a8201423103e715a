#!/usr/bin/env bash
# The GPU machine's check of the GEMM: build (ninja), GPU tests, compute-sanitizer on small shapes,
# the cuBLASLt benchmark, SASS and ptxas resource checks. Logs and bench JSON go to $OUT; a short
# table is printed last. Run from the repository root:
#   OUT=/tmp/out CODA_COMMIT=$(git rev-parse HEAD) tools/gpu_check.sh [--no-sanitizer] [--no-bench]
# Needs a GoogleTest source tree at .deps/googletest (copy /usr/src/googletest there).
set -uo pipefail

OUT=${OUT:-/tmp/coda_gpu_check}
BUILD=${BUILD:-build-gpu-check}
JOBS=${JOBS:-$(nproc)}
SANITIZE=1
BENCH=1
for arg in "$@"; do
  case "$arg" in
  --no-sanitizer) SANITIZE=0 ;;
  --no-bench) BENCH=0 ;;
  *) echo "unknown option $arg" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"

COMMIT=${CODA_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
if [[ -z ${CODA_COMMIT:-} ]] && git rev-parse HEAD >/dev/null 2>&1 && [[ -n $(git status --porcelain 2>/dev/null) ]]; then
  COMMIT="$COMMIT-dirty"
fi

declare -A STATUS
step() { # step NAME TIMEOUT_S LOG COMMAND...
  local name=$1 limit=$2 log=$3
  shift 3
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$log" 2>&1
  local rc=$?
  STATUS[$name]="rc=$rc $((SECONDS - t0))s"
  return $rc
}

step configure 300 configure.log cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCODA_GTEST_SOURCE="$PWD/.deps/googletest" -DCMAKE_CUDA_FLAGS="-Xptxas=-v" \
  -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20
# (the last two: CMake 3.25 does not know that nvcc 12+ accepts -std=c++20)
step build 900 build.log cmake --build "$BUILD" -j "$JOBS" --target coda coda_gpu_tests bench_gemm
TESTS="$BUILD/tests/coda_gpu_tests"

# A hang (a pipeline deadlock) shows up in the smoke step within seconds; then nothing else runs.
HUNG=1
if [[ -x $TESTS ]]; then
  step smoke 60 smoke.log "$TESTS" --gtest_filter='*SmallForSanitizer*'
  [[ $? -ne 124 ]] && HUNG=0
fi
if ((!HUNG)); then
  step gpu_tests 180 gpu_tests.log "$TESTS"
  if ((SANITIZE)); then
    for tool in memcheck racecheck synccheck; do
      step "sanitizer_$tool" 120 "sanitizer_$tool.log" compute-sanitizer --tool "$tool" --error-exitcode 1 \
        "$TESTS" --gtest_filter='*SmallForSanitizer*'
    done
  fi
fi
if ((BENCH)) && ((!HUNG)) && [[ -x $BUILD/bench/bench_gemm ]]; then
  step bench 240 bench.log "$BUILD/bench/bench_gemm" --commit "$COMMIT" --out "$OUT/gemm.json"
fi

LIB=$(find "$BUILD" -name 'libcoda.so*' -type f | head -1)
HGMMA=$( [[ -n $LIB ]] && cuobjdump --dump-sass "$LIB" 2>/dev/null | grep -c HGMMA || echo 0)
SPILLS=$(grep -cE '[1-9][0-9]* bytes spill (stores|loads)' "$OUT/build.log" 2>/dev/null)
WARNINGS=$(grep -cE 'C7508|C7510|C7511|C7515' "$OUT/build.log" 2>/dev/null)
grep -E 'Used [0-9]+ registers|spill' "$OUT/build.log" >"$OUT/ptxas.log" 2>/dev/null

echo "== coda GPU check ($COMMIT) =="
printf '%-22s %s\n' "step" "result"
for name in configure build smoke gpu_tests sanitizer_memcheck sanitizer_racecheck sanitizer_synccheck bench; do
  [[ -n ${STATUS[$name]:-} ]] && printf '%-22s %s\n' "$name" "${STATUS[$name]}"
done
printf '%-22s %s\n' "HGMMA in SASS" "$HGMMA"
printf '%-22s %s\n' "ptxas spill lines" "$SPILLS"
printf '%-22s %s\n' "C7508/10/11/15" "$WARNINGS"
grep -hE '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/smoke.log" "$OUT/gpu_tests.log" 2>/dev/null
grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT"/sanitizer_*.log 2>/dev/null
grep -hE 'Failure|exceeds|NaN at|what\(\)' "$OUT/smoke.log" "$OUT/gpu_tests.log" 2>/dev/null | head -20
grep -E '^geomean' "$OUT/bench.log" 2>/dev/null
