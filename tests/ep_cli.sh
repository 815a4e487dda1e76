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

# trace --ep: one Chrome trace with a process per rank, each holding its exchanges; the SVG has each rank's lanes.
mpi -n 2 "$bin" trace --model "$dir/ck" --tokens 3 --ep 2 --schedule phased --threads 1 --out "$dir/t.json" \
  --svg "$dir/t.svg" >"$dir/log" 2>&1 || { cat "$dir/log"; fail "trace --ep 2"; }
/usr/bin/python3 - "$dir/t.json" <<'PY' || fail "trace --ep 2: the JSON is not a process per rank with its exchanges"
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
assert sorted(names.values()) == ["rank 0", "rank 1"], names
for pid in names:
    ops = {e["name"] for e in events if e.get("cat") == "op" and e["pid"] == pid}
    assert {"ep.dispatch", "ep.combine", "shared.gate_up", "sum"} <= ops, (names[pid], ops)
PY
grep -q 'rank 1: stream' "$dir/t.svg" || fail "trace --ep 2: no lanes of rank 1 in the SVG"
grep -q 'rank 1: ' "$dir/log" || fail "trace --ep 2: no figures of rank 1"
echo "ep_cli.sh: trace --ep 2 writes one file with both ranks"

# bench --ep --tune: the fastest eager schedule per token count, which run --ep --schedule auto then follows
# (bitwise equal to one process, like every schedule). `--tune=FILE`: mpirun takes a separate `--tune` as its own.
mpi -n 2 "$bin" bench --model "$dir/ck" --ep 2 --tokens 1,6 --threads 1 --repeats 2 --warmup 1 --graph \
  --tune="$dir/tune.json" >"$dir/log" 2>&1 || { cat "$dir/log"; fail "bench --ep 2 --tune"; }
grep -q 'dual+graph us' "$dir/log" || { cat "$dir/log"; fail "bench --ep 2 --graph: no replay column"; }
/usr/bin/python3 - "$dir/tune.json" <<'PY' || fail "bench --ep 2 --tune: not a table for tokens 1 and 6"
import json, sys
table = json.load(open(sys.argv[1]))["table"]
assert [e["tokens"] for e in table] == [1, 6], table
assert all(e["schedule"] in ("serial", "dual", "phased", "fused") for e in table), table
PY
rm -f "$dir/yn.npy"
mpi -n 2 "$bin" run --model "$dir/ck" --input "$dir/x.npy" --output "$dir/yn.npy" --ep 2 --schedule auto \
  --tuning "$dir/tune.json" --threads 1 >"$dir/log" 2>&1 || { cat "$dir/log"; fail "run --ep 2 --schedule auto"; }
cmp -s "$dir/y1.npy" "$dir/yn.npy" || fail "run --ep 2 --schedule auto: output differs from one process"
echo "ep_cli.sh: bench --ep 2 --tune writes the table run --ep 2 --schedule auto follows"

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
