#!/usr/bin/env bash
# Two trees of coda measured against each other in one call on the GPU machine, runs alternated,
# so that a change is timed against its baseline on the same card in the same state, as the
# comparisons in docs/fp8.md and docs/epilogue.md are. Two steps:
#
#   here:   tools/ab_device.sh prepare A B
#           A, B: commits (or anything git archive takes). Writes .deps/ab/A.tar.gz, B.tar.gz and
#           .deps/ab/commits (their short hashes), and .deps/googletest from /usr/src/googletest
#           where missing. Send .deps with the call (the device tool's `carry`): the device's
#           copy of .git may predate the session's commits, so the trees travel as archives.
#   device: bash tools/ab_device.sh run TARGETS REPEATS COMMAND
#           builds both trees (Release, sm_90a; ninja TARGETS, e.g. "bench_gemm_fp8 coda"), in
#           /root/ab/build-A and build-B (kept on a warm machine: a second run rebuilds only
#           what changed), then runs COMMAND REPEATS times for each side, alternating A, B, A,
#           B, ..., with SIDE (A or B), COMMIT (the side's hash), SRC (its tree), BUILD (its
#           build), RUN (1..REPEATS) and RES (the results folder) in the environment; each run's
#           output goes to $RES/$SIDE-$RUN.log. Everything in $RES comes back as one file,
#           $OUT/ab.tgz (the device returns at most 8 files), and each log's last SHOW lines
#           (default 12) are printed.
#
# Example (bench_gemm_fp8's geomeans, two runs a side):
#   tools/ab_device.sh prepare main fp8-scales-v4
#   device: bash tools/ab_device.sh run bench_gemm_fp8 2 \
#     '$BUILD/bench/bench_gemm_fp8 --commit $COMMIT --out $RES/fp8-$SIDE-$RUN.json'
set -euo pipefail
cd "$(dirname "$0")/.."
AB=.deps/ab

case "${1:-}" in
prepare)
  [[ $# -eq 3 ]] || { echo "usage: $0 prepare A B" >&2; exit 2; }
  mkdir -p "$AB"
  : >"$AB/commits"
  for side in A B; do
    ref=$2
    [[ $side == B ]] && ref=$3
    git archive --format=tar.gz -o "$AB/$side.tar.gz" "$ref"
    echo "$side $(git rev-parse --short "$ref^{commit}")" >>"$AB/commits"
  done
  [[ -d .deps/googletest ]] || cp -r /usr/src/googletest .deps/googletest
  cat "$AB/commits"
  du -sh .deps | cut -f1 | sed 's/^/.deps: /'
  ;;
run)
  [[ $# -eq 4 ]] || { echo "usage: $0 run TARGETS REPEATS COMMAND" >&2; exit 2; }
  repeats=$3 command=$4
  read -ra target_list <<<"$2"
  [[ -f $AB/commits ]] || { echo "no $AB/commits: run '$0 prepare A B' here and carry .deps" >&2; exit 2; }
  out=${OUT:-/tmp/ab-out}
  export RES=/root/ab/results
  rm -rf "$RES"
  mkdir -p "$RES" "$out"
  gtest=$PWD/.deps/googletest
  t0=$SECONDS
  pids=()
  for side in A B; do
    rm -rf "/root/ab/src-$side"
    mkdir -p "/root/ab/src-$side"
    tar -xzf "$AB/$side.tar.gz" -C "/root/ab/src-$side"
    (cmake -S "/root/ab/src-$side" -B "/root/ab/build-$side" -G Ninja -DCMAKE_BUILD_TYPE=Release \
       -DCODA_GTEST_SOURCE="$gtest" -DCODA_BUILD_EXAMPLES=OFF \
       -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 \
       -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20 >"$RES/configure-$side.log" 2>&1 &&
       ninja -C "/root/ab/build-$side" -j "$(( ($(nproc) + 1) / 2 ))" "${target_list[@]}" \
         >"$RES/build-$side.log" 2>&1) &
    pids+=($!)
  done
  fail=0
  for pid in "${pids[@]}"; do wait "$pid" || fail=1; done
  echo "build: $(( SECONDS - t0 )) s"
  grep -h "spill stores" "$RES"/build-*.log | grep -v " 0 bytes spill" | sort | uniq -c || true
  if ((fail)); then
    tail -n 20 "$RES"/configure-*.log "$RES"/build-*.log
    tar -czf "$out/ab.tgz" -C "$RES" .
    exit 1
  fi
  for run in $(seq 1 "$repeats"); do
    for side in A B; do
      commit=$(awk -v s="$side" '$1 == s {print $2}' "$AB/commits")
      (export SIDE=$side COMMIT=$commit SRC=/root/ab/src-$side BUILD=/root/ab/build-$side RUN=$run
       cd "$SRC" && bash -c "$command") >"$RES/$side-$run.log" 2>&1 || echo "$side run $run: exit $?"
    done
  done
  echo "runs: $(( SECONDS - t0 )) s"
  cp "$AB/commits" "$RES/commits"
  tar -czf "$out/ab.tgz" -C "$RES" .
  for log in "$RES"/[AB]-*.log; do
    echo "== $(basename "$log") ($(awk -v s="$(basename "$log" | cut -c1)" '$1 == s {print $2}' "$AB/commits"))"
    tail -n "${SHOW:-12}" "$log"
  done
  ;;
*)
  sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
  ;;
esac
