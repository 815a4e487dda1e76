#!/usr/bin/env bash
# `moe-overlap run --ep N` under mpirun against the one-process `run`, bitwise, and its argument errors.
# Usage: ep_cli.sh MPIEXEC MOE_OVERLAP_BIN
set -euo pipefail
mpiexec=$1 bin=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mpi() { timeout 120 "$mpiexec" --oversubscribe --bind-to none "$@"; }
fail() { echo "ep_cli.sh: FAIL: $*"; exit 1; }

"$bin" make-checkpoint --preset deepseek-v3 --hidden 256 --intermediate 128 --num-experts 12 --dtype fp8 \
  --out "$dir/ck" >/dev/null
# 12 rows of input: the output of another run serves as one (a [12, 256] float32 .npy).
"$bin" run --model "$dir/ck" --tokens 12 --seed 5 --output "$dir/x.npy" --threads 1 >/dev/null
"$bin" run --model "$dir/ck" --input "$dir/x.npy" --output "$dir/y1.npy" --threads 1 >/dev/null
for n in 2 3 4; do
  for mode in normal low-latency; do
    for s in dual phased; do
      rm -f "$dir/yn.npy"
      mpi -n "$n" "$bin" run --model "$dir/ck" --input "$dir/x.npy" --output "$dir/yn.npy" --ep "$n" \
        --ep-mode "$mode" --schedule "$s" --threads 1 >"$dir/log" 2>&1 || { cat "$dir/log"; fail "--ep $n $mode $s"; }
      cmp -s "$dir/y1.npy" "$dir/yn.npy" || fail "--ep $n $mode $s: output differs from one process"
    done
  done
done
echo "ep_cli.sh: --ep 2, 3, 4 x normal, low-latency x dual, phased: bitwise equal to one process"

# Errors: one line naming both numbers, non-zero exit, no output file.
expect_error() {
  local what=$1 pattern=$2; shift 2
  rm -f "$dir/ye.npy"
  if "$@" >"$dir/log" 2>&1; then cat "$dir/log"; fail "$what: exit 0"; fi
  grep -q -- "$pattern" "$dir/log" || { cat "$dir/log"; fail "$what: no line matching '$pattern'"; }
  [ ! -e "$dir/ye.npy" ] || fail "$what: wrote an output file"
}
expect_error "rows not divisible" "12 rows do not split over --ep 5" \
  mpi -n 5 "$bin" run --model "$dir/ck" --input "$dir/x.npy" --output "$dir/ye.npy" --ep 5 --threads 1
expect_error "world size" "--ep 3: the MPI world has 2 rank(s)" \
  mpi -n 2 "$bin" run --model "$dir/ck" --input "$dir/x.npy" --output "$dir/ye.npy" --ep 3 --threads 1
echo "ep_cli.sh: PASS"
