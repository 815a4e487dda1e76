#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan) and runs each parser's target from its committed seed
# corpus for at least the given CPU-seconds. Exits non-zero if a target crashes, leaks, times out or trips a
# sanitizer; the inputs that did are copied to fuzz-artifacts/.
#   scripts/fuzz.sh [cpu-seconds-per-target=60] [build-dir=build-fuzz]
# MOE_FUZZ_SOURCE overrides the CMake source directory (default: the repository root). MOE_FUZZ_JOBS is how many
# targets run at once (default: the number of cores, at most the number of targets).
#
# The budget is CPU time, not wall time: on a busy machine a target runs on (in further runs over the corpus
# it grew) until its own CPU time reaches the budget.
set -euo pipefail
secs="${1:-60}"
build="${2:-build-fuzz}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# target:corpus-and-dictionary name (fuzz/fuzz_<target>.cpp, fuzz/corpus/<name>/, fuzz/<name>.dict)
targets=(safetensors_header:safetensors hf_config:hf_config npy:npy shard_index:shard_index)
CC=clang CXX=clang++ cmake -S "${MOE_FUZZ_SOURCE:-.}" -B "$build" -G Ninja -DMOE_BUILD_FUZZ=ON -DMOE_SANITIZE=address \
  -DMOE_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" --target $(for t in "${targets[@]}"; do echo "fuzz_${t%%:*}"; done) -j"$(nproc)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Runs one target until it has used $secs CPU-seconds; returns non-zero on a finding.
fuzz_one() {
  local target="fuzz_${1%%:*}" name="${1##*:}"
  local log="$work/$target.log" cpu=0 runs=0 execs=0 rc=0 left start=$SECONDS
  mkdir -p "$work/$target"
  while :; do
    # CPU-seconds still to go, rounded up; each further run at least 5 s so that start-up stays a small part.
    left=$(awk -v s="$secs" -v c="$cpu" 'BEGIN { l = s - c; if (l <= 0) print 0; else print (l < 5 ? 5 : int(l) + (l > int(l))) }')
    [ "$left" -gt 0 ] || break
    if [ $((SECONDS - start)) -gt $((10 * secs + 60)) ]; then
      echo "== $target: FAILED: only $cpu of $secs CPU-seconds in $((SECONDS - start)) s (the machine is starved)"
      return 1
    fi
    runs=$((runs + 1))
    # The corpus grows in $work (the committed seeds stay as they are); crash files land in $work too.
    rc=0
    { TIMEFORMAT='%3U %3S'; time UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 TMPDIR="$work" \
        "$build/fuzz/$target" "$work/$target" "fuzz/corpus/$name" -dict="fuzz/$name.dict" -max_total_time="$left" \
        -max_len=4096 -timeout=25 -rss_limit_mb=2048 -artifact_prefix="$work/$target-" -print_final_stats=1 \
        >>"$log" 2>&1; } 2>"$work/$target.time" || rc=$?
    cpu=$(awk -v c="$cpu" '{ print c + $1 + $2 }' "$work/$target.time")
    execs=$((execs + $(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || echo 0)))
    [ "$rc" -eq 0 ] || break
  done
  if [ "$rc" -ne 0 ]; then
    echo "== $target: FAILED (exit $rc) after $cpu CPU-seconds"
    tail -60 "$log"
    for f in "$work/$target"-crash-* "$work/$target"-leak-* "$work/$target"-oom-* "$work/$target"-timeout-*; do
      [ -e "$f" ] && { mkdir -p fuzz-artifacts; cp "$f" fuzz-artifacts/; echo "kept fuzz-artifacts/$(basename "$f")"; }
    done
    return 1
  fi
  echo "== $target: $cpu CPU-seconds in $runs run(s), $execs executions, no crash;" \
    "$(grep -E '^#[0-9]+.*(DONE|pulse|NEW|REDUCE)' "$log" | tail -1 | grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9a-zA-Z]+' || true)"
}

jobs="${MOE_FUZZ_JOBS:-$(nproc)}"
[ "$jobs" -ge 1 ] || jobs=1
status=0
pids=()
for t in "${targets[@]}"; do
  fuzz_one "$t" > "$work/${t%%:*}.summary" 2>&1 &
  pids+=("$!")
  if [ "${#pids[@]}" -ge "$jobs" ]; then
    wait "${pids[0]}" || status=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
for t in "${targets[@]}"; do cat "$work/${t%%:*}.summary"; done
exit $status
