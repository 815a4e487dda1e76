#!/usr/bin/env bash
# A rank that dies or stalls mid-exchange: every other rank must fail within 10 s with one clear line naming
# the peer, and nothing may hang. Usage: ep_fault.sh MPIEXEC TEST_EP RANKS stall|kill
set -uo pipefail
mpiexec=$1 bin=$2 ranks=$3 fault=$4
start=$(date +%s%N)
out=$(timeout 60 "$mpiexec" -n "$ranks" --oversubscribe --bind-to none "$bin" --ep-fault "$fault" \
      --gtest_filter='EpFaults.*' 2>&1)
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "$out"
echo "ep_fault.sh: $fault, $ranks ranks: exit $rc after ${elapsed_ms} ms"
fail() { echo "ep_fault.sh: FAIL: $*"; exit 1; }
[ "$rc" -ne 124 ] || fail "the job hung"
[ "$elapsed_ms" -lt 10000 ] || fail "took ${elapsed_ms} ms, more than 10 s"
if [ "$fault" = stall ]; then
  # Every rank but the stalled one reports the timeout, naming rank 1.
  want=$((ranks - 1))
  got=$(grep -c "ep-fault verdict: rank [0-9]* PASS after .*timed out.*rank 1" <<<"$out")
  [ "$got" -eq "$want" ] || fail "$got of $want surviving ranks named rank 1 in a timeout"
  ! grep -q "ep-fault verdict: rank [0-9]* FAIL" <<<"$out" || fail "a rank's checks failed"
else
  # A killed rank: mpirun ends the job at once, non-zero, naming the rank and the signal.
  [ "$rc" -ne 0 ] || fail "exit 0 after a rank was killed"
  grep -Eq "rank 1 .*(signal 9|Killed)" <<<"$out" || fail "no line names rank 1 and its signal"
fi
echo "ep_fault.sh: PASS"
