#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan) and runs each for a bounded time from the committed seed
# corpus. Exits non-zero if a target crashes, leaks or trips a sanitizer.
#   scripts/fuzz.sh [seconds-per-target=30] [build-dir=build-fuzz]
# MOE_FUZZ_SOURCE overrides the CMake source directory (default: the repository root).
set -euo pipefail
secs="${1:-30}"
build="${2:-build-fuzz}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
CC=clang CXX=clang++ cmake -S "${MOE_FUZZ_SOURCE:-.}" -B "$build" -G Ninja -DMOE_BUILD_FUZZ=ON -DMOE_SANITIZE=address \
  -DMOE_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" --target fuzz_safetensors_header fuzz_hf_config -j"$(nproc)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
status=0
for t in safetensors_header:safetensors hf_config:hf_config; do
  target="fuzz_${t%%:*}"
  seeds="fuzz/corpus/${t##*:}"
  mkdir -p "$work/$target"
  echo "== $target for ${secs}s"
  # The corpus grows in $work (the committed seeds stay as they are); crash files land in $work too.
  if ! UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "$build/fuzz/$target" "$work/$target" "$seeds" \
      -dict="fuzz/${t##*:}.dict" -max_total_time="$secs" -max_len=4096 -rss_limit_mb=2048 \
      -artifact_prefix="$work/$target-" -print_final_stats=1 2>"$work/$target.log"; then
    status=1
    tail -50 "$work/$target.log"
    for f in "$work/$target"-crash-* "$work/$target"-leak-* "$work/$target"-oom-* "$work/$target"-timeout-*; do
      [ -e "$f" ] && { mkdir -p fuzz-artifacts; cp "$f" fuzz-artifacts/; echo "kept fuzz-artifacts/$(basename "$f")"; }
    done
  else
    grep -E "stat::number_of_executed_runs|cov:" "$work/$target.log" | tail -2
  fi
done
exit $status
