#!/usr/bin/env bash
# One call on the GPU machine (the `device` tool: 10 minutes a call, files back only from $OUT,
# at most 8 of them): steps in order, each under what is left of the call's deadline, a short
# summary per step, and every log and JSON packed into $OUT/all.tgz at the end. Run from the
# repository root of a clean committed tree:
#   CODA_COMMIT=<hash> tools/device_call.sh build suite 'pytest:tests/python/test_distributed.py' \
#     'sweep:Gpu/Fused*:Gpu/Gpu*:178:14' torch
# Steps:
#   build            configure and build coda, the GPU tests and the benchmarks in $BUILD
#   suite[:FILTER]   coda_gpu_tests (a gtest filter, default all)
#   pytest:FILES     python -m pytest on those files (comma-separated) against $BUILD's libcoda
#   torch            python -m coda.bench --out $OUT/torch.json (about 330 s on an H200)
#   train[:ARGS]     examples/train_llama.py ARGS (comma-separated; default its 400 steps): its
#                    loss.json and loss.png as $OUT/train_llama.json and $OUT/train_llama.png
#   bench:NAME       bench/<NAME> (bench_gemm, bench_fused, bench_block, bench_gemm_fp8) --out
#                    $OUT/<NAME>.json
#   sweep:FILTER:FIRST:N   tools/seed_sweep.sh FILTER N --first FIRST --gpu (JOBS=7) with a
#                    deadline inside the call's (a cut range reports the seeds that finished); a
#                    filter holding ':' is fine (the last two fields are FIRST and N)
# DEADLINE (seconds from the start, default 580) bounds the whole call; BUILD defaults to /root/b,
# which a warm machine keeps between calls (a later call may skip `build`).
set -uo pipefail
OUT=${OUT:?the device tool sets OUT}
BUILD=${BUILD:-/root/b}
DEADLINE=${DEADLINE:-580}
export CODA_COMMIT=${CODA_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
mkdir -p "$OUT"
left() { echo $((DEADLINE - SECONDS)); }
run() { # run NAME LOG COMMAND...: under what is left, then one summary line
  local name=$1 log=$2 t0=$SECONDS limit
  shift 2
  limit=$(left)
  if ((limit < 10)); then echo "$name: skipped (no time left)"; return 1; fi
  timeout "$limit" "$@" >"$OUT/$log" 2>&1
  local rc=$?
  echo "$name: rc=$rc $((SECONDS - t0))s$( ((rc == 124)) && echo ' (ran past the deadline)')"
  return $rc
}
nvidia-smi --query-gpu=name --format=csv,noheader
export CODA_LIBRARY=$BUILD/src/libcoda.so PYTHONPATH=$PWD/python LD_LIBRARY_PATH=$BUILD/src
export BUILD_DIR=$BUILD JOBS=${JOBS:-7} # tools/seed_sweep.sh's
for step in "$@"; do
  case $step in
  build)
    run configure configure.log cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCODA_GTEST_SOURCE="$PWD/.deps/googletest" -DCMAKE_CUDA_FLAGS=-Xptxas=-v \
      -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 \
      -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20 || exit 1
    run build build.log cmake --build "$BUILD" -j "$(nproc)" --target coda coda_gpu_tests \
      bench_gemm bench_fused bench_block bench_gemm_fp8 || { tail -20 "$OUT/build.log"; exit 1; }
    echo "  spills: $(grep -cE '[1-9][0-9]* bytes spill' "$OUT/build.log"), wgmma warnings:" \
      "$(grep -cE 'C7508|C7510|C7511|C7514|C7515' "$OUT/build.log")" ;;
  suite | suite:*)
    filter=${step#suite}; filter=${filter#:}
    run "suite ${filter:-all}" suite.log "$BUILD/tests/coda_gpu_tests" --gtest_brief=1 \
      --gtest_filter="${filter:-*}"
    tail -2 "$OUT/suite.log"; grep '^\[  FAILED' "$OUT/suite.log" | head ;;
  pytest:*)
    IFS=, read -r -a files <<<"${step#pytest:}"
    run pytest pytest.log python -m pytest "${files[@]}" -q -rs -p no:cacheprovider
    tail -3 "$OUT/pytest.log" ;;
  torch)
    run torch torch.log python -m coda.bench --out "$OUT/torch.json"
    tail -25 "$OUT/torch.log" ;;
  train | train:*)
    IFS=, read -r -a targs <<<"${step#train}"; targs=("${targs[@]/#:/}")
    run train train.log python examples/train_llama.py --out "$OUT/train" ${targs[@]+"${targs[@]}"}
    tail -6 "$OUT/train.log"
    mv "$OUT/train/loss.json" "$OUT/train_llama.json" 2>/dev/null
    mv "$OUT/train/loss.png" "$OUT/train_llama.png" 2>/dev/null
    rmdir "$OUT/train" 2>/dev/null ;;
  bench:*)
    name=${step#bench:}
    run "$name" "$name.log" "$BUILD/bench/$name" --commit "$CODA_COMMIT" --out "$OUT/$name.json"
    grep -iE 'geomean|mismatch' "$OUT/$name.log" | head -20 ;;
  sweep:*)
    spec=${step#sweep:}; n=${spec##*:}; spec=${spec%:*}; first=${spec##*:}; filter=${spec%:*}
    log="sweep-$first.log"
    # (its own deadline a little inside the call's, so a cut range still reports its seeds)
    run "sweep $filter $first+$n" "$log" tools/seed_sweep.sh \
      "$filter" "$n" --first "$first" --gpu --deadline $(($(left) - 8))
    grep -E 'seed sweep|fail [1-9]|failing|no failing' "$OUT/$log" | head ;;
  *) echo "unknown step $step" >&2 ;;
  esac
done
# Everything in one file (the tool returns at most 8), the JSON results beside it.
(cd "$OUT" && tar czf all.tgz ./*.log 2>/dev/null && rm -f ./*.log)
ls "$OUT"
