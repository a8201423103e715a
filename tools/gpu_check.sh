#!/usr/bin/env bash
# The GPU machine's check: build (ninja), the CPU and GPU test suites (the CPU suite also holds the
# API's CUDA-path cases), the CUDA examples, compute-sanitizer on small shapes, the benchmarks
# (GEMM vs cuBLASLt, fused kernels vs GEMM and unfused, the Llama block vs its GEMMs alone and
# unfused, the FP8 GEMM vs cuBLASLt's block-scaled FP8 GEMM), SASS and ptxas resource checks.
# Logs and bench JSON go to $OUT; a short table is printed last. Run from the repository root:
#   OUT=/tmp/out tools/gpu_check.sh [--no-sanitizer | --sanitizers=memcheck,...] [--no-bench]
#                                   [--benches=gemm,fused,block,fp8] [--variants] [--python]
#                                   [--gpu-filter=GTEST_FILTER] [--cpu-filter=GTEST_FILTER]
#   tools/gpu_check.sh --build-only        # build here, to run elsewhere with --prebuilt
#   OUT=/tmp/out tools/gpu_check.sh --prebuilt [--no-sanitizer] ...   # run what BUILD holds
# The measured code is exactly a commit: with uncommitted changes in the tree, the build uses
# `git archive HEAD` unpacked into a temporary folder (where git is missing, the working tree,
# and the commit is recorded as <hash>-dirty). --build-only writes that commit to $BUILD/COMMIT,
# so a machine that only runs the binaries (--prebuilt; e.g. the GPU machine, whose cold start
# leaves little time for a build) still records it.
# On the device machine, CODA_COMMIT=<hash> names the commit of the clean tree sent there and the
# working tree is built as it is (git there may be missing or stale). Use a fresh BUILD per
# commit there (BUILD=/root/b-<hash>): a configure that fails stops the run. Needs a GoogleTest
# source tree at .deps/googletest (copy /usr/src/googletest there, `carry` it) where no packaged
# GoogleTest exists.
set -uo pipefail

OUT=${OUT:-/tmp/coda_gpu_check}
BUILD=${BUILD:-build-gpu-check}
JOBS=${JOBS:-$(nproc)}
SANITIZERS=memcheck,racecheck,synccheck
BENCH=1
BENCHES=gemm,fused,block,fp8
VARIANTS=0
BUILD_ONLY=0
PREBUILT=0
CPU_FILTER='*'
GPU_FILTER='*'
PYTHON=0
NO_TESTS=0
for arg in "$@"; do
  case "$arg" in
  --no-sanitizer) SANITIZERS= ;;
  --sanitizers=*) SANITIZERS=${arg#--sanitizers=} ;;
  --no-bench) BENCH=0 ;;
  --benches=*) BENCHES=${arg#--benches=} ;;
  --variants) VARIANTS=1 ;;
  --build-only) BUILD_ONLY=1 ;;
  --prebuilt) PREBUILT=1 ;;
  --cpu-filter=*) CPU_FILTER=${arg#--cpu-filter=} ;; # e.g. 'ApiValidationCuda.*' (CI runs the rest)
  --gpu-filter=*) GPU_FILTER=${arg#--gpu-filter=} ;; # e.g. '*FusedResidualRms*:*Block*' (a subset)
  --python) PYTHON=1 ;;       # pytest tests/python on this build's libcoda (no pip install)
  --no-tests) NO_TESTS=1 ;;   # benches only (after the smoke step)
  *) echo "unknown option $arg" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
BUILD=$(mkdir -p "$BUILD" && cd "$BUILD" && pwd)

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

# Source tree and commit: HEAD itself when the tree is clean, else HEAD's archive; the working
# tree as CODA_COMMIT when the caller names it (the device machine's tree can come with a .git
# of an older commit: archiving its HEAD built old code there, 2026-12-04).
SRC=$PWD
if ((PREBUILT)); then
  COMMIT=$(cat "$BUILD/COMMIT" 2>/dev/null || echo unknown)
elif [[ -n ${CODA_COMMIT:-} ]]; then
  COMMIT=$CODA_COMMIT
elif git rev-parse --verify -q HEAD >/dev/null 2>&1; then
  COMMIT=$(git rev-parse --short=12 HEAD)
  if [[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]]; then
    # A fixed place, so the build folder's CMake cache keeps matching its source folder.
    SRC=$BUILD/source
    rm -rf "$SRC" && mkdir -p "$SRC"
    if ! git archive HEAD | tar -x -C "$SRC"; then
      echo "git archive failed; building the working tree" >&2
      SRC=$PWD
      COMMIT="$COMMIT-dirty"
    fi
  fi
else
  echo "git does not work here; building the working tree" >&2
  COMMIT="unknown-dirty"
fi

if ((!PREBUILT)); then
  step configure 300 configure.log cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCODA_GTEST_SOURCE="$PWD/.deps/googletest" -DCMAKE_CUDA_FLAGS="-Xptxas=-v" \
    -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20
  # (the last two: CMake 3.25 does not know that nvcc 12+ accepts -std=c++20)
  # A failed configure (e.g. a BUILD made from another source folder) must not go on to run the
  # binaries an earlier build left there.
  if [[ ${STATUS[configure]} != rc=0* ]]; then
    echo "configure failed (${STATUS[configure]}): $(tail -3 "$OUT/configure.log")" >&2
    exit 1
  fi
  # The build log is where the ptxas resource lines live; keep it with the binaries.
  step build 900 build.log cmake --build "$BUILD" -j "$JOBS" --target coda coda_cpu_tests coda_gpu_tests \
    bench_gemm bench_fused bench_block bench_gemm_fp8 fused_geglu
  cp "$OUT/build.log" "$BUILD/build.log" 2>/dev/null
  echo "$COMMIT" >"$BUILD/COMMIT"
  if ((BUILD_ONLY)); then
    echo "built $COMMIT in $BUILD: ${STATUS[configure]}, ${STATUS[build]}"
    [[ ${STATUS[build]} == rc=0* ]]
    exit
  fi
else
  cp "$BUILD/build.log" "$OUT/build.log" 2>/dev/null
  # The binaries find libcoda.so through the RPATH of the machine that built them.
  export LD_LIBRARY_PATH="$BUILD/src${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
TESTS="$BUILD/tests/coda_gpu_tests"

# A hang (a pipeline deadlock) shows up in the smoke step within seconds; then nothing else runs.
HUNG=1
if [[ -x $TESTS ]]; then
  step smoke 60 smoke.log "$TESTS" --gtest_filter='*SmallForSanitizer*'
  [[ $? -ne 124 ]] && HUNG=0
fi
if ((!HUNG)) && ((!NO_TESTS)); then
  step gpu_tests 360 gpu_tests.log "$TESTS" --gtest_filter="$GPU_FILTER"
  step cpu_tests 180 cpu_tests.log "$BUILD/tests/coda_cpu_tests" --gtest_filter="$CPU_FILTER"
  step example_geglu 60 example_geglu.log "$BUILD/examples/fused_geglu"
  for tool in ${SANITIZERS//,/ }; do
    step "sanitizer_$tool" 120 "sanitizer_$tool.log" compute-sanitizer --tool "$tool" --error-exitcode 1 \
      "$TESTS" --gtest_filter='*SmallForSanitizer*'
  done
fi
if ((BENCH)) && ((!HUNG)); then
  [[ ,$BENCHES, == *,gemm,* ]] && step bench 300 bench.log "$BUILD/bench/bench_gemm" \
    --commit "$COMMIT" --out "$OUT/gemm.json" --variants "$VARIANTS" \
    --variants-out "$OUT/gemm_schedules.json"
  [[ ,$BENCHES, == *,fused,* ]] && step bench_fused 240 bench_fused.log "$BUILD/bench/bench_fused" \
    --commit "$COMMIT" --out "$OUT/fused.json"
  [[ ,$BENCHES, == *,block,* ]] && step bench_block 300 bench_block.log "$BUILD/bench/bench_block" \
    --commit "$COMMIT" --out "$OUT/block.json"
  [[ ,$BENCHES, == *,fp8,* ]] && step bench_fp8 240 bench_fp8.log "$BUILD/bench/bench_gemm_fp8" \
    --commit "$COMMIT" --out "$OUT/fp8.json"
fi

LIB=$(find "$BUILD" -name 'libcoda.so*' -type f | head -1)
if ((PYTHON)) && ((!HUNG)); then
  CODA_LIBRARY=$(cd "$(dirname "$LIB")" && pwd)/$(basename "$LIB") PYTHONPATH=$SRC/python \
    step pytest 420 pytest.log python -m pytest "$SRC/tests/python" -q -rs -p no:cacheprovider
fi
HGMMA=$( [[ -n $LIB ]] && cuobjdump --dump-sass "$LIB" 2>/dev/null | grep -c HGMMA || echo 0)
SPILLS=$(grep -cE '[1-9][0-9]* bytes spill (stores|loads)' "$OUT/build.log" 2>/dev/null)
STACK=$(grep -cE '[1-9][0-9]* bytes stack frame' "$OUT/build.log" 2>/dev/null)
# (C7514: wgmma serialized because of reads of an in-flight wgmma's accumulators; ptxas prints
# it as "info", and the FP8 mainloop's halves loop met it, fp8_mainloop.cuh.)
WARNINGS=$(grep -cE 'C7508|C7510|C7511|C7514|C7515' "$OUT/build.log" 2>/dev/null)
grep -E 'Used [0-9]+ registers|spill|stack frame' "$OUT/build.log" >"$OUT/ptxas.log" 2>/dev/null

echo "== coda GPU check ($COMMIT) =="
printf '%-22s %s\n' "step" "result"
for name in configure build smoke gpu_tests cpu_tests example_geglu sanitizer_memcheck \
  sanitizer_racecheck sanitizer_synccheck bench bench_fused bench_block bench_fp8 pytest; do
  [[ -n ${STATUS[$name]:-} ]] && printf '%-22s %s\n' "$name" "${STATUS[$name]}"
done
printf '%-22s %s\n' "HGMMA in SASS" "$HGMMA"
printf '%-22s %s\n' "ptxas spill lines" "$SPILLS"
printf '%-22s %s\n' "ptxas stack lines" "$STACK"
printf '%-22s %s\n' "C7508/10/11/14/15" "$WARNINGS"
grep -HE '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/smoke.log" "$OUT/gpu_tests.log" "$OUT/cpu_tests.log" \
  2>/dev/null | sed "s|$OUT/||"
grep -hE '^\[  FAILED  \] [A-Za-z]' "$OUT/gpu_tests.log" "$OUT/cpu_tests.log" 2>/dev/null | head -10
grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT"/sanitizer_*.log 2>/dev/null
grep -hE 'Failure|exceeds|NaN at|what\(\)' "$OUT/smoke.log" "$OUT/gpu_tests.log" 2>/dev/null | head -20
grep -E '^geomean|^variant ' "$OUT/bench.log" 2>/dev/null
tail -n 16 "$OUT/bench_fused.log" 2>/dev/null
grep -E 'FAIL|not supported' "$OUT/bench_block.log" 2>/dev/null | head -10
tail -n 15 "$OUT/bench_block.log" 2>/dev/null
# The FP8 benchmark: the scale layouts cuBLASLt agreed with coda on (counted), and what failed.
grep -E '^  scale layout' "$OUT/bench_fp8.log" 2>/dev/null | sed 's/ (.*//' | sort | uniq -c
grep -E '^geomean|MISMATCH|unavailable|agrees with coda$|^cuBLASLt ' "$OUT/bench_fp8.log" 2>/dev/null |
  head -20
grep -E '^(FAILED|ERROR) |passed|failed' "$OUT/pytest.log" 2>/dev/null | tail -25
# The device tool returns few files: the logs travel as one archive beside the JSON results.
(cd "$OUT" && tar -czf logs.tar.gz --exclude=logs.tar.gz --exclude='*.json' . 2>/dev/null &&
  find . -maxdepth 1 -name '*.log' -delete)
