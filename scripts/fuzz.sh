#!/usr/bin/env bash
# Long fuzzing runs (docs/FUZZING.md). Builds the libFuzzer targets of tests/fuzz with clang and
# ASan+UBSan into build-fuzz/ (or $FUZZ_BUILD_DIR), then runs them one at a time (the fuzzers
# share the machine with everything else) for the given seconds each, default 600:
#   scripts/fuzz.sh [seconds-per-target]
# FUZZ_RUNS=N stops a target after N executions instead (the seconds stay a cap).
# FUZZ_TARGETS="fuzz_config fuzz_cursor" runs only those targets (two such runs can share the
# build directory, one per core, once the first has built).
# Each target grows a corpus of its own under build-fuzz/fuzz-corpus/<target>, seeded from
# tests/fuzz/corpus/<target> (read, never written). Prints executions and crashes per target;
# exits 1 when a target crashed, leaked, hung or ran out of memory (the input is kept under
# build-fuzz/fuzz-artifacts/, the log under build-fuzz/fuzz-logs/).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
runs=${FUZZ_RUNS:--1}
build_dir=${FUZZ_BUILD_DIR:-build-fuzz}
read -r -a targets <<<"${FUZZ_TARGETS:-fuzz_frame_reader fuzz_client_message fuzz_cursor fuzz_credentials fuzz_config fuzz_http_request fuzz_jwt fuzz_hook_answers fuzz_nats_wire}"

export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true
cmake -S . -B "$build_dir" -DCMAKE_CXX_COMPILER="${FUZZ_CXX:-clang++-16}" \
  -DOUTLIVE_SANITIZE=address,undefined -DOUTLIVE_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build_dir" -j"$(nproc)" --target "${targets[@]}"

# A UBSan report is a finding: halt, so that libFuzzer keeps the input.
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
mkdir -p "$build_dir/fuzz-logs" "$build_dir/fuzz-artifacts"
status=0
report=()
for target in "${targets[@]}"; do
  corpus=$build_dir/fuzz-corpus/$target
  log=$build_dir/fuzz-logs/$target.log
  mkdir -p "$corpus"
  dict=()
  if [[ -f tests/fuzz/$target.dict ]]; then dict=(-dict="tests/fuzz/$target.dict"); fi
  before=$(find "$build_dir/fuzz-artifacts" -name "$target-*" | wc -l)
  echo "== $target: ${seconds} s"
  # New inputs go to the first corpus folder only, so the seeds in the tree stay as they are.
  rc=0
  "$build_dir/tests/fuzz/$target" -max_total_time="$seconds" -runs="$runs" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 "${dict[@]}" \
    -artifact_prefix="$build_dir/fuzz-artifacts/$target-" \
    "$corpus" "tests/fuzz/corpus/$target" >"$log" 2>&1 || rc=$?
  after=$(find "$build_dir/fuzz-artifacts" -name "$target-*" | wc -l)
  executed=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  crashes=$((after - before))
  if [[ $rc -ne 0 && $crashes -eq 0 ]]; then crashes=1; fi  # died without leaving an input
  line="$target: ${executed:-?} executions (${rate:-?}/s), $crashes crashes, corpus $(ls "$corpus" | wc -l) files"
  echo "$line"
  report+=("$line")
  if [[ $crashes -ne 0 ]]; then
    status=1
    grep -m1 -A3 -E "ERROR: (AddressSanitizer|libFuzzer|LeakSanitizer)|runtime error:" "$log" || true
  fi
done
echo "== $(date -u +%Y-%m-%d) $(git rev-parse --short HEAD 2>/dev/null || true), ${seconds} s per target"
printf '%s\n' "${report[@]}"
exit $status
