#!/usr/bin/env bash
# Nsight Compute on gemm_fp8's kernels for one bench_gemm_fp8 case (the first its --filter
# selects): every FP8 mainloop launch of the case (each tile's warm-up and timed run, in the
# order the benchmark runs them), so one report holds the default tile and each forced one on
# the same inputs. Writes the report and its details page under $OUT, the SASS of the first
# launch with per-instruction stall samples as CSV (tools/ncu_stalls.py summarizes it), and
# prints per launch its grid, duration, issue rate and warp cycles per instruction. Run on the
# GPU machine from the repository root, on a build that has bench_gemm_fp8:
#   OUT=/tmp/ncu BUILD=/root/b tools/ncu_fp8.sh llama1b.gate_up.fwd
# COUNT bounds the launches profiled (default 20: bench_gemm_fp8 runs eight tiles twice each).
set -uo pipefail
OUT=${OUT:-/tmp/coda_ncu}
BUILD=${BUILD:-build-gpu-check}
FILTER=${1:-llama1b.gate_up.fwd}
COUNT=${COUNT:-20}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BUILD/src${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
timeout "${NCU_TIMEOUT:-300}" ncu --kernel-name-base demangled --kernel-name regex:Fp8Mainloop \
  --launch-count "$COUNT" --set full -f -o "$OUT/fp8" \
  "$BUILD/bench/bench_gemm_fp8" --filter "$FILTER" --runs 1 --out "$OUT/fp8-bench.json" \
  >"$OUT/fp8.log" 2>&1 || echo "ncu failed: $(tail -3 "$OUT/fp8.log")"
ncu --import "$OUT/fp8.ncu-rep" --page details >"$OUT/fp8-details.txt" 2>&1
ncu --import "$OUT/fp8.ncu-rep" --page source --csv --print-source sass \
  >"$OUT/fp8-sass.csv" 2>&1
# One line per launch: the template arguments that tell the tiles apart (schedule, tile, the
# mainloop's partials and order), then its numbers.
awk '
  /^  [^ ].*\(.*\)x\(.*\)/ {
    if (name != "") print name " | " stats
    name = $0; stats = ""
    gsub(/coda::|sm90::|gpu::|unsigned |  +/, "", name)
    if (length(name) > 220) name = substr(name, 1, 220)
  }
  /Duration|Issue Slots Busy|Warp Cycles Per Issued Instruction|No Eligible|Registers Per Thread/ {
    line = $0; gsub(/  +/, " ", line); stats = stats line ";"
  }
  END { if (name != "") print name " | " stats }
' "$OUT/fp8-details.txt"
