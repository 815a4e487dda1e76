#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing, build Release, then benchmark every schedule of
# the Qwen3-Next-80B-A3B MoE layer (real sizes, seeded bf16 weights) and trace one decode step.
# Results land in out/: bench.json, bench.svg, tuning.json (the table behind --schedule auto), trace.json
# (Perfetto / chrome://tracing), timeline.svg.
# Extra arguments go to `bench` (e.g. --tokens 1,8,32 --repeats 5, or --model DIR for a real checkpoint).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target moe-overlap
mkdir -p out
bin=build/tools/moe-overlap/moe-overlap
"$bin" bench --model qwen3-next-80b-a3b --json out/bench.json --svg out/bench.svg --tune out/tuning.json "$@"
"$bin" trace --model qwen3-next-80b-a3b --tokens 1 --schedule dual --out out/trace.json --svg out/timeline.svg
echo "results: out/bench.json out/bench.svg out/tuning.json out/trace.json out/timeline.svg"
