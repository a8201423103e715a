#!/usr/bin/env bash
# The main job: one Llama block, forward and backward.
#  * With an sm_90 GPU (H100 / H200: nvidia-smi reports compute capability 9.0) and the CUDA
#    backend built: builds bench_block and runs a quick subset (Llama-1B, 8192 tokens): a small
#    layer checked against the fp64 textbook block, then coda's block timed against the same
#    GEMMs alone (cuBLASLt) and against the unfused path. Arguments go to bench_block.
#  * Otherwise: says so and runs the CPU backend's block, checked against the textbook block
#    (examples/llama_block.cpp). Arguments go to llama_block.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}

# The compute capability of the first GPU, empty without a working nvidia-smi.
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' ' || true)

# Build `target`, one progress line per compiled file (a fresh clone compiles for a minute or
# two on 2 cores; the kernels of the CUDA backend take longer); the full log is kept.
build_target() {
  local target=$1 log=$build/demo-build.log
  echo "building $target in $build (log: $log)"
  if ! cmake --build "$build" -j "$jobs" --target "$target" 2>&1 | tee "$log" \
      | grep --line-buffered -E '^\[ *[0-9]+(/[0-9]+|%)\]' | sed -u 's/^/  /'; then
    echo "the build failed; the end of $log:"
    tail -n 30 "$log"
    exit 1
  fi
}

echo "configuring $build"
mkdir -p "$build"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release ${CODA_CMAKE_ARGS:-} >"$build/configure.log" 2>&1 \
  || { cat "$build/configure.log"; exit 1; }
cuda_built=$(grep -q '^CODA_ENABLE_CUDA:BOOL=ON' "$build/CMakeCache.txt" && echo 1 || echo 0)

if [[ $cap == 9.0 && $cuda_built == 1 ]]; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
  echo "sm_90 GPU found ($gpu): building bench_block and running Llama-1B at 8192 tokens"
  build_target bench_block
  "$build/bench/bench_block" --models 1b --tokens 8192 --out "$build/block_quick.json" "$@"
  echo
  echo "This quick run: $build/block_quick.json."
  echo "The full benchmark (Llama-1B and 8B, 8192 and 16384 tokens, about a minute):"
  echo "  $build/bench/bench_block            # writes bench/results/block.json"
  echo "  tools/perf_tables.py                 # its table in docs/PERFORMANCE.md"
  echo "Last recorded results: bench/results/block.json, docs/PERFORMANCE.md (Llama block)."
  exit 0
fi

if [[ -z $cap ]]; then
  echo "no GPU found: running the CPU backend"
elif [[ $cap != 9.0 ]]; then
  echo "no sm_90 GPU found (compute capability $cap): running the CPU backend"
else
  echo "sm_90 GPU found, but this build has no CUDA backend (nvcc not found): running the CPU backend"
fi
build_target llama_block
exec "$build/examples/llama_block" --cpu "$@"
