#!/usr/bin/env bash
# Copies what tools/gpu_check.sh --prebuilt runs out of a build folder into DEST, in the same
# layout (libcoda, the test and benchmark binaries, the CUDA example, the ptxas log, the commit),
# so that a GPU machine can run binaries built elsewhere (the device tool carries DEST):
#   tools/pack_prebuilt.sh BUILD DEST [BUILD_LOG]
set -euo pipefail
build=$1 dest=$2 log=${3:-$1/build.log}
rm -rf "$dest" && mkdir -p "$dest"/{src,tests,bench,examples}
# The file under its SONAME (libcoda.so.0), which the binaries load, as a plain file: symlinks
# may not survive the trip to the device.
cp -L "$build"/src/libcoda.so.[0-9] "$dest/src/"
cp "$build"/tests/coda_gpu_tests "$build"/tests/coda_cpu_tests "$dest/tests/"
cp "$build"/bench/bench_gemm "$build"/bench/bench_fused "$build"/bench/bench_block "$dest/bench/"
cp "$build"/examples/fused_geglu "$dest/examples/"
[[ -f $log ]] && cp "$log" "$dest/build.log"
git rev-parse --short=12 HEAD >"$dest/COMMIT"
[[ -z $(git status --porcelain --untracked-files=no) ]] || sed -i 's/$/-dirty/' "$dest/COMMIT"
du -sh "$dest"
