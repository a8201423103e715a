#!/usr/bin/env bash
# The main job: a Llama block forward+backward, checked against the textbook block.
# On a machine without a GPU it says so and runs the CPU backend.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release ${CODA_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "${JOBS:-$(nproc)}" --target llama_block >/dev/null
exec "$build/examples/llama_block" "$@"
