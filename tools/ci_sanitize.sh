#!/usr/bin/env bash
# The CPU suite under AddressSanitizer + UndefinedBehaviorSanitizer (every UB report is an error),
# then the C ABI fuzzer (tests/fuzz) for a bounded time from its seed corpus. Needs clang with
# libFuzzer (clang 14: apt-get install clang). No GPU, no CUDA.
#   tools/ci_sanitize.sh                 build in build-sanitize, fuzz for 180 s
#   FUZZ_SECONDS=...  BUILD_DIR=...  JOBS=...
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-sanitize}
jobs=${JOBS:-$(nproc)}
seconds=${FUZZ_SECONDS:-180}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

echo "== configure and build ($build, clang, ASan + UBSan + libFuzzer coverage)"
CC=${CC:-clang} CXX=${CXX:-clang++} cmake -S . -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCODA_ENABLE_CUDA=OFF -DCODA_BUILD_BENCH=OFF \
  -DCODA_SANITIZE=ON -DCODA_BUILD_FUZZ=ON > "$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j "$jobs"

echo "== the CPU suite under ASan + UBSan"
ctest --test-dir "$build" -L cpu --output-on-failure -j "$jobs"

echo "== fuzz the C ABI for ${seconds} s"
corpus=$(mktemp -d /tmp/coda-fuzz-corpus.XXXXXX)
cp tests/fuzz/corpus/* "$corpus"/
# Artifacts (a crashing input, if any) go to the build folder.
status=0
"$build/tests/fuzz/fuzz_c_abi" -max_total_time="$seconds" -max_len=256 -len_control=0 \
  -timeout=20 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$build/fuzz-" "$corpus" > "$build/fuzz.log" 2>&1 \
  || status=$?
rm -rf "$corpus"
if [[ $status -ne 0 ]]; then
  echo "fuzzing found a problem (exit $status); the input is in $build/fuzz-*; log $build/fuzz.log"
  tail -40 "$build/fuzz.log"
  exit 1
fi
grep -E "^#[0-9]+ +(INITED|DONE)" "$build/fuzz.log" || true
runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$build/fuzz.log" | awk '{print $2}')
echo "fuzzing: clean for ${seconds} s, $runs executions (log $build/fuzz.log)"
