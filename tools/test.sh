#!/usr/bin/env bash
# Configure, build and run the whole test suite. CPU tests always run; GPU tests run where an
# sm_90 GPU is present and report themselves as skipped elsewhere.
#   tools/test.sh            build in ./build (CUDA backend too when nvcc is found)
#   BUILD_DIR=... JOBS=...   override the build folder / parallelism
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCODA_WERROR=ON ${CODA_CMAKE_ARGS:-}
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" --output-on-failure -j "$jobs" ${CTEST_ARGS:-}
