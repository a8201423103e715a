#!/usr/bin/env bash
# Runs one gtest suite over N consecutive seeds and reports the failing ones and how much of its
# tolerance each output used (max |out - ref| over 2 max |baseline - ref| + atol, atol = 1e-6
# unless the test says otherwise: a test fails above 1).
#   tools/seed_sweep.sh SUITE N [--first S] [--gpu] [--log FILE] [--deadline SECONDS]
#     SUITE  a gtest filter, e.g. 'Kernels/RmsLse.*' or 'Kernels/*:Cpu/*'
#     N      the number of seeds: S, S+1, ..., S+N-1 (default S = 1)
#     --gpu  the GPU suite (coda_gpu_tests) instead of the CPU one
#     --deadline  stop the test processes after SECONDS and report what finished (also on
#            SIGTERM or SIGINT, e.g. from `timeout`): a cut sweep keeps its completed seeds
#            instead of losing them all; it exits 124 then (1 where a seed failed)
#   BUILD_DIR=... (default build) names the build folder; JOBS=... the parallel processes.
# One failing seed replays with CODA_TEST_SEED=<seed> <binary> --gtest_filter=<test>.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 2 ]] || { sed -n '2,13p' "$0"; exit 2; }
suite=$1 n=$2
shift 2
first=1 binary=coda_cpu_tests log="" deadline=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --first) first=$2; shift 2 ;;
    --gpu) binary=coda_gpu_tests; shift ;;
    --log) log=$2; shift 2 ;;
    --deadline) deadline=$2; shift 2 ;;
    *) echo "seed_sweep.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
build=${BUILD_DIR:-build}
exe=$build/tests/$binary
[[ -x $exe ]] || { echo "seed_sweep.sh: $exe not built (tools/test.sh builds it)" >&2; exit 2; }
jobs=${JOBS:-$(nproc)}
[[ -n $log ]] || log=$(mktemp /tmp/seed_sweep.XXXXXX)
: > "$log"

# Tests a seed runs (a seed with fewer results was cut short by a deadline).
per_seed_tests=$("$exe" --gtest_filter="$suite" --gtest_list_tests | grep -c '^  ' || true)

# The seeds in `jobs` contiguous chunks, one process each (--gtest_repeat: iteration i runs
# seed first + i).
chunk=$(( (n + jobs - 1) / jobs ))
pids=()
for (( start = first; start < first + n; start += chunk )); do
  count=$(( first + n - start < chunk ? first + n - start : chunk ))
  CODA_TEST_SEED=$start CODA_TEST_ERROR_LOG=$log.$start \
    "$exe" --gtest_filter="$suite" --gtest_repeat="$count" --gtest_brief=1 \
    > "$log.$start.out" 2>&1 &
  pids+=($!)
done
# A deadline or a signal stops the processes; the results their finished tests logged stay.
interrupted=0
stop() {
  interrupted=1
  kill "${pids[@]}" 2>/dev/null || true
}
trap stop TERM INT
if (( deadline > 0 )); then
  while (( SECONDS < deadline )) && kill -0 "${pids[@]}" 2>/dev/null; do sleep 1; done
  kill -0 "${pids[@]}" 2>/dev/null && stop
fi
status=0
for pid in "${pids[@]}"; do
  # (wait returns early when a trapped signal arrives: wait again until the process is gone)
  while true; do
    code=0
    wait "$pid" || code=$?
    kill -0 "$pid" 2>/dev/null || break
  done
  # A process stop() killed ends with SIGTERM (143): not a failure; a crash still is.
  (( code == 0 || (interrupted && code == 143) )) || status=1
done
trap - TERM INT
cat "$log".*[0-9] > "$log" 2>/dev/null || true # (none where no test logged)
rm -f "$log".*[0-9]

rc=0
python3 - "$log" "$suite" "$first" "$n" "$interrupted" "$per_seed_tests" <<'PY' || rc=$?
import collections, sys
log, suite, first, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
interrupted, per_seed_tests = sys.argv[5] == "1", int(sys.argv[6])
per_seed = collections.Counter()
results = collections.defaultdict(lambda: collections.Counter())
failing = collections.defaultdict(list)
use = {}  # (test suite, output) -> [max use, seed, test, count, sum of use]
partial = 0  # lines a killed process left half-written (its last write): not results
for line in open(log):
    f = line.rstrip("\n").split("\t")
    if (f[0], len(f)) not in (("result", 4), ("check", 7)) or (f[0] == "result" and f[3] not in ("pass", "fail", "skip")):
        partial += 1
        continue
    if f[0] == "result":
        _, test, seed, result = f
        results[test.split(".")[0]][result] += 1
        per_seed[int(seed)] += 1
        if result == "fail":
            failing[test].append(int(seed))
    elif f[0] == "check":
        _, test, what, seed, err, base, atol = f
        u = float(err) / (2 * float(base) + float(atol))
        key = (test.split(".")[0], what)
        e = use.setdefault(key, [0.0, 0, "", 0, 0.0])
        if u > e[0]:
            e[0], e[1], e[2] = u, int(seed), test
        e[3] += 1
        e[4] += u
print("seed sweep: %s, seeds %d..%d" % (suite, first, first + n - 1))
if interrupted:
    # A seed ran every test when it has a result for each (the processes' last seeds may not).
    done = sorted(s for s, c in per_seed.items() if c >= per_seed_tests)
    print("INTERRUPTED (deadline or signal): %d of %d seeds ran all %d tests: %s; %d cut short"
          % (len(done), n, per_seed_tests, " ".join(map(str, done)) or "none",
             sum(1 for c in per_seed.values() if c < per_seed_tests)))
if partial:
    print("skipped %d partial log line(s) (a process stopped while writing)" % partial)
for s in sorted(results):
    c = results[s]
    print("  %-40s pass %d, fail %d, skip %d" % (s, c["pass"], c["fail"], c["skip"]))
if use:
    print("tolerance used, max |out-ref| / (2 max |baseline-ref| + atol) (fails above 1):")
    print("  %-40s %-18s %8s %8s  %s" % ("suite", "output", "max", "mean", "worst seed (test)"))
    for (s, what), (mx, seed, test, count, total) in sorted(use.items()):
        print("  %-40s %-18s %8.3f %8.3f  %d (%s)" % (s, what, mx, total / count, seed, test))
if failing:
    print("failing seeds:")
    for test, seeds in sorted(failing.items()):
        print("  %s: %s" % (test, " ".join(map(str, seeds[:20])) + (" ..." if len(seeds) > 20 else "")))
    sys.exit(1)
print("no failing seed")
PY
[[ $rc -eq 0 && $status -eq 0 ]] && rm -f "$log".*.out || echo "gtest output: $log.*.out"
(( rc || status )) && exit 1
(( interrupted )) && exit 124
exit 0
