#!/usr/bin/env bash
# Network test bed for expert parallelism over MPI/TCP on one machine (see docs/ep-testbed.md).
#
#   scripts/ep-testbed.sh up N RATE        N namespaces moe-ep0..moe-ep<N-1> on a bridge, links shaped to RATE
#   scripts/ep-testbed.sh down             remove everything 'up' created (idempotent)
#   scripts/ep-testbed.sh status           show what exists now
#   scripts/ep-testbed.sh run N RATE [MPIRUN_OPTION...] -- COMMAND [ARG...]
#                                          up, mpirun COMMAND with rank r in moe-ep<r> over TCP, down
#   scripts/ep-testbed.sh mpirun-args N    print the mpirun options 'run' uses (test bed must be up)
#   scripts/ep-testbed.sh selftest         measure MPI bandwidth unshaped and at two tc rates
#
# RATE is a tc rate (1gbit, 200mbit, 50mbit, 500kbit, 10mbps, ...) or 'none' for unshaped links.
# Needs root, iproute2 (ip, tc), util-linux (unshare, flock, timeout) and Open MPI (mpirun, mpicc).
#
# Environment (all optional):
#   EP_TESTBED_NET          first three octets of the private /24 (default 10.77.0)
#   EP_TESTBED_STATE        state folder holding the hostfile (default /run/moe-ep-testbed)
#   EP_TESTBED_TIMEOUT      seconds 'run' lets mpirun live before killing it (default 900)
#   EP_TESTBED_TBF_LATENCY  tbf queue length, as time (default 20ms)
#   EP_TESTBED_TBF_BURST    tbf bucket in bytes (default max(1 ms at RATE, 128 KiB))
#   EP_TESTBED_SELFTEST_RATES  rates the selftest checks (default "1gbit 100mbit")
set -euo pipefail

SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
AGENT="$(dirname "$SELF")/ep-testbed-agent.sh"
NET="${EP_TESTBED_NET:-10.77.0}"
SUBNET="$NET.0/24"
HNP_ADDR="$NET.254"
STATE="${EP_TESTBED_STATE:-/run/moe-ep-testbed}"
HOSTFILE="$STATE/hostfile"
BR="moe-epbr"
NS_PREFIX="moe-ep"
MAX_N=64
TBF_LATENCY="${EP_TESTBED_TBF_LATENCY:-20ms}"

log() { echo "ep-testbed: $*" >&2; }
die() { echo "ep-testbed: error: $*" >&2; exit 1; }

usage() {
  sed -n '2,21p' "$SELF" | sed 's/^# \{0,1\}//' >&2
  exit "${1:-2}"
}

# ----------------------------------------------------------------------------------------------
# Checks

need_root() {
  [ "$(id -u)" = 0 ] || die "needs root (network namespaces, veth, bridge and tc)"
}

need_tools() {
  local t
  for t in "$@"; do
    command -v "$t" >/dev/null 2>&1 || die "'$t' not found in PATH"
  done
}

check_net() {
  case "$NET" in
    10.[0-9]*.[0-9]*|192.168.[0-9]*|172.1[6-9].[0-9]*|172.2[0-9].[0-9]*|172.3[01].[0-9]*) ;;
    *) die "EP_TESTBED_NET=$NET is not the start of a private /24 (e.g. 10.77.0)" ;;
  esac
  [[ "$NET" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "EP_TESTBED_NET=$NET must be three octets, e.g. 10.77.0"
}

check_n() {
  if ! [[ "$1" =~ ^[0-9]+$ ]] || [ "$1" -lt 1 ] || [ "$1" -gt "$MAX_N" ]; then
    die "N must be a whole number from 1 to $MAX_N (got '$1')"
  fi
}

# Prints the rate in bit/s; fails on anything that is not a plain tc rate.
rate_bits() {
  local r="$1" num unit
  [[ "$r" =~ ^([0-9]+(\.[0-9]+)?)([a-zA-Z]*)$ ]] || return 1
  num="${BASH_REMATCH[1]}"
  unit="$(echo "${BASH_REMATCH[3]}" | tr '[:upper:]' '[:lower:]')"
  awk -v n="$num" -v u="$unit" 'BEGIN {
    m["bit"]=1; m["kbit"]=1e3; m["mbit"]=1e6; m["gbit"]=1e9; m["tbit"]=1e12;
    m["kibit"]=1024; m["mibit"]=1048576; m["gibit"]=1073741824;
    m["bps"]=8; m["kbps"]=8e3; m["mbps"]=8e6; m["gbps"]=8e9;
    if (!(u in m)) exit 1;
    v = n * m[u]; if (v < 8000) exit 1;
    printf "%.0f\n", v }'
}

check_rate() {
  [ "$1" = none ] && return 0
  rate_bits "$1" >/dev/null ||
    die "RATE must be 'none' or a tc rate such as 1gbit, 200mbit, 50mbit, 500kbit (got '$1')"
}

# The /24 must not already be used by an interface that is not ours.
check_subnet_free() {
  local line
  line="$(ip -4 -o addr show | awk -v net="$NET." -v br="$BR" \
    '$2 != br && index($4, net) == 1 { print $2 " " $4; exit }')"
  [ -z "$line" ] || die "$SUBNET is already in use in the root namespace ($line); set EP_TESTBED_NET"
  line="$(ip -4 route show | awk -v s="$SUBNET" -v br="$BR" '$1 == s && $0 !~ ("dev " br " ") { print; exit }')"
  [ -z "$line" ] || die "a route for $SUBNET already exists ($line); set EP_TESTBED_NET"
}

# ----------------------------------------------------------------------------------------------
# Locking: one test bed command at a time (the lock is on this script, so nothing is left behind).

take_lock() {
  [ "${EP_TESTBED_LOCKED:-0}" = 1 ] && return 0
  exec 9<"$SELF"
  flock -w 120 9 || die "another ep-testbed command has held the lock for 120 s"
  export EP_TESTBED_LOCKED=1
}

# ----------------------------------------------------------------------------------------------
# down

our_namespaces() {
  ip netns list 2>/dev/null | awk '{ print $1 }' | grep -E "^${NS_PREFIX}[0-9]+$" || true
}

our_links() {
  ip -o link show 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }' |
    grep -E "^(${NS_PREFIX}[0-9]+[hn]|$BR)$" || true
}

# Processes still running in one of our namespaces (left over from a killed run) were started
# by this test bed; end them by id, TERM first, KILL after a bounded grace period.
end_namespace_processes() {
  local ns="$1" pids
  pids="$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
  [ -n "${pids// /}" ] || return 0
  log "ending processes left in $ns: $pids"
  # shellcheck disable=SC2086
  kill -TERM $pids 2>/dev/null || true
  for _ in $(seq 1 10); do
    pids="$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
    [ -n "${pids// /}" ] || return 0
    sleep 0.2
  done
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null || true
}

do_down() {
  local ns l
  for ns in $(our_namespaces); do
    end_namespace_processes "$ns"
    ip netns del "$ns" 2>/dev/null || log "could not delete namespace $ns"
  done
  # A veth dies with its namespace; links left in the root namespace (e.g. by a crash between
  # 'ip link add' and moving the peer) and the bridge are removed here.
  for l in $(our_links); do
    [ "$l" = "$BR" ] && continue
    ip link del "$l" 2>/dev/null || true
  done
  if ip link show "$BR" >/dev/null 2>&1; then
    ip link del "$BR" 2>/dev/null || log "could not delete bridge $BR"
  fi
  rm -rf "$STATE"
  # Deleting a namespace frees its veth asynchronously; wait (bounded) until they are gone.
  for _ in $(seq 1 25); do
    [ -z "$(our_links)" ] && [ -z "$(our_namespaces)" ] && return 0
    sleep 0.2
  done
  die "left behind after down: $(our_namespaces | tr '\n' ' ') $(our_links | tr '\n' ' ')"
}

# ----------------------------------------------------------------------------------------------
# up

# Runs "$@"; on failure names the step and exits (the EXIT trap then tears down).
step() {
  local what="$1" out
  shift
  if ! out="$("$@" 2>&1)"; then
    die "up failed while trying to $what: ${out:-exit status $?}"
  fi
}

tbf_burst() {
  local bits="$1"
  if [ -n "${EP_TESTBED_TBF_BURST:-}" ]; then
    echo "$EP_TESTBED_TBF_BURST"
  else
    awk -v b="$bits" 'BEGIN { x = b / 8 / 1000; if (x < 131072) x = 131072; printf "%.0f\n", x }'
  fi
}

shape() { # shape NS_OR_EMPTY DEV RATE
  local ns="$1" dev="$2" rate="$3" bits burst
  bits="$(rate_bits "$rate")"
  burst="$(tbf_burst "$bits")"
  if [ -n "$ns" ]; then
    step "shape $dev in $ns to $rate" ip netns exec "$ns" \
      tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency "$TBF_LATENCY"
  else
    step "shape $dev to $rate" \
      tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency "$TBF_LATENCY"
  fi
}

no_ipv6() { # best effort; keeps IPv6 link-local chatter off the shaped links
  local ns="$1" dev="$2"
  if [ -n "$ns" ]; then
    ip netns exec "$ns" sh -c "echo 1 > /proc/sys/net/ipv6/conf/$dev/disable_ipv6" 2>/dev/null || true
  else
    sh -c "echo 1 > /proc/sys/net/ipv6/conf/$dev/disable_ipv6" 2>/dev/null || true
  fi
}

# mpirun (under timeout) started by 'run'; TERM goes to timeout, which passes it on to mpirun.
RUN_PID=""
stop_run() {
  [ -n "$RUN_PID" ] && kill -0 "$RUN_PID" 2>/dev/null || return 0
  log "stopping mpirun"
  kill -TERM "$RUN_PID" 2>/dev/null || true
  for _ in $(seq 1 50); do
    kill -0 "$RUN_PID" 2>/dev/null || break
    sleep 0.2
  done
  kill -KILL "$RUN_PID" 2>/dev/null || true
  wait "$RUN_PID" 2>/dev/null || true
  RUN_PID=""
}

UP_CLEANUP=0
TMP_DIR=""
on_exit() {
  local rc=$?
  trap - EXIT INT TERM
  stop_run
  [ -z "$TMP_DIR" ] || rm -rf "$TMP_DIR"
  if [ "$UP_CLEANUP" = 1 ]; then
    [ "$rc" = 0 ] || log "tearing down what was created (exit status $rc)"
    ( do_down ) || rc=1
  fi
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

do_up() {
  local n="$1" rate="$2" r ns h p addr state
  check_subnet_free
  do_down # clean slate: makes 'up' idempotent and recovers from a crash half way
  UP_CLEANUP=1
  mkdir -p "$STATE"
  step "create bridge $BR" ip link add "$BR" type bridge stp_state 0 forward_delay 0
  no_ipv6 "" "$BR"
  step "address bridge $BR" ip addr add "$HNP_ADDR/24" dev "$BR"
  step "bring up bridge $BR" ip link set "$BR" up
  : >"$HOSTFILE.tmp"
  for ((r = 0; r < n; r++)); do
    ns="$NS_PREFIX$r"
    h="${ns}h"
    p="${ns}n"
    addr="$NET.$((r + 1))"
    step "create namespace $ns" ip netns add "$ns"
    step "create veth $h/$p" ip link add "$h" type veth peer name "$p" netns "$ns"
    no_ipv6 "" "$h"
    no_ipv6 "$ns" "$p"
    step "attach $h to $BR" ip link set "$h" master "$BR"
    step "bring up $h" ip link set "$h" up
    step "bring up lo in $ns" ip netns exec "$ns" ip link set lo up
    step "address $p in $ns" ip netns exec "$ns" ip addr add "$addr/24" dev "$p"
    step "bring up $p in $ns" ip netns exec "$ns" ip link set "$p" up
    if [ "$rate" != none ]; then
      shape "$ns" "$p" "$rate" # namespace egress
      shape "" "$h" "$rate"    # namespace ingress (egress of the bridge port towards it)
    fi
    echo "$addr slots=1" >>"$HOSTFILE.tmp"
  done
  # Bridge ports forward at once with STP off; wait (bounded) until each one does.
  for ((r = 0; r < n; r++)); do
    h="$NS_PREFIX${r}h"
    for _ in $(seq 1 50); do
      state="$(cat "/sys/class/net/$h/brport/state" 2>/dev/null || echo 0)"
      [ "$state" = 3 ] && break
      sleep 0.1
    done
    [ "$state" = 3 ] || die "bridge port $h does not forward (state $state)"
  done
  printf 'N=%s\nRATE=%s\nNET=%s\n' "$n" "$rate" "$NET" >"$STATE/testbed"
  mv "$HOSTFILE.tmp" "$HOSTFILE"
}

# ----------------------------------------------------------------------------------------------
# mpirun options

# One option per line, for callers that build their own mpirun line.
mpirun_args() {
  local n="$1"
  [ -f "$HOSTFILE" ] || die "no test bed is up ($HOSTFILE missing); run: $0 up N RATE"
  [ "$(id -u)" = 0 ] && echo "--allow-run-as-root"
  printf '%s\n' \
    -np "$n" \
    --hostfile "$HOSTFILE" \
    --map-by node \
    --bind-to none \
    --oversubscribe \
    --mca plm rsh \
    --mca plm_rsh_agent "$AGENT" \
    --mca plm_rsh_no_tree_spawn 1 \
    --mca pml ob1 \
    --mca btl tcp,self \
    --mca btl_tcp_if_include "$SUBNET" \
    --mca oob_tcp_if_include "$SUBNET"
}

# ----------------------------------------------------------------------------------------------
# commands

cmd_up() {
  [ $# = 2 ] || usage
  check_n "$1"
  check_rate "$2"
  need_root
  need_tools ip tc flock
  check_net
  take_lock
  do_up "$1" "$2"
  UP_CLEANUP=0
  log "up: $1 namespaces ${NS_PREFIX}0..$NS_PREFIX$(($1 - 1)) on $BR ($HNP_ADDR), $SUBNET, rate $2"
  log "hostfile: $HOSTFILE"
}

cmd_down() {
  [ $# = 0 ] || usage
  need_root
  need_tools ip flock
  take_lock
  do_down
  log "down: nothing left"
}

cmd_status() {
  local ns
  echo "bridge:"
  ip -br addr show "$BR" 2>/dev/null || echo "  (none)"
  for ns in $(our_namespaces); do
    echo "$ns:"
    ip netns exec "$ns" ip -br addr show | sed 's/^/  /'
    ip netns exec "$ns" tc qdisc show | grep -v 'noqueue' | sed 's/^/  /' || true
  done
  tc qdisc show 2>/dev/null | grep "dev ${NS_PREFIX}" | sed 's/^/  root ns: /' || true
  [ -f "$HOSTFILE" ] && { echo "hostfile $HOSTFILE:"; sed 's/^/  /' "$HOSTFILE"; }
  return 0
}

cmd_run() {
  [ $# -ge 3 ] || usage
  local n="$1" rate="$2" rc timeout_s
  shift 2
  local extra=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    extra+=("$1")
    shift
  done
  [ "${1:-}" = "--" ] || die "run: missing '--' before COMMAND"
  shift
  [ $# -ge 1 ] || die "run: no COMMAND after '--'"
  check_n "$n"
  check_rate "$rate"
  need_root
  need_tools ip tc flock mpirun timeout unshare
  check_net
  [ -x "$AGENT" ] || die "launch agent $AGENT is missing or not executable"
  timeout_s="${EP_TESTBED_TIMEOUT:-900}"
  [[ "$timeout_s" =~ ^[0-9]+$ ]] || die "EP_TESTBED_TIMEOUT must be whole seconds"
  take_lock
  do_up "$n" "$rate" # sets UP_CLEANUP=1: the EXIT trap takes it down again, always
  local args
  mapfile -t args < <(mpirun_args "$n")
  # Every daemon sees the whole machine and one slot, so Open MPI does not know that the ranks
  # share its cores and would busy-poll; yield instead. Set in the environment (not on the
  # command line) so that a caller's own --mca mpi_yield_when_idle wins.
  export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"
  log "run: $n ranks, rate $rate: OMPI_MCA_mpi_yield_when_idle=$OMPI_MCA_mpi_yield_when_idle mpirun ${args[*]} ${extra[*]:-} $*"
  # In the background (stdin kept) so that a TERM/INT to this script is acted on at once: the
  # EXIT trap stops mpirun (stop_run) before it takes the test bed down.
  set +e
  timeout -k 10 "$timeout_s" mpirun "${args[@]}" "${extra[@]}" "$@" <&0 &
  RUN_PID=$!
  wait "$RUN_PID"
  rc=$?
  RUN_PID=""
  set -e
  [ "$rc" = 124 ] && log "run: mpirun killed after ${timeout_s} s (EP_TESTBED_TIMEOUT)"
  return "$rc"
}

cmd_mpirun_args() {
  [ $# = 1 ] || usage
  check_n "$1"
  mpirun_args "$1"
}

# ----------------------------------------------------------------------------------------------
# selftest

# Open MPI's TCP btl flags without "put": large messages go as send fragments, not as one
# emulated put, so a rank's outgoing data and its handshake replies can interleave.
NO_PUT_FLAGS="send,inplace,need-ack,need-csum"

# selftest_run LABEL RATE BYTES SECS PROBE [MPIRUN_OPTION...]: prints the probe's lines, sets RESULT.
selftest_run() {
  local label="$1" rate="$2" bytes="$3" secs="$4" probe="$5" out
  shift 5
  out="$(EP_TESTBED_TIMEOUT=40 bash "$SELF" run 2 "$rate" "$@" -- "$probe" "$bytes" "$secs" 2>&1)" || {
    echo "$out" >&2
    die "selftest: run '$label' failed"
  }
  RESULT="$(echo "$out" | grep '^RESULT ' || true)"
  [ -n "$RESULT" ] || { echo "$out" >&2; die "selftest: no result from run '$label'"; }
  echo "$out" | grep -E '^(ranks|pingpong|exchange|alltoall)' | sed "s/^/  [$label] /"
}

field() { echo "$RESULT" | sed -E "s/.*$1=([0-9.a-zA-Z]+).*/\1/"; }

cmd_selftest() {
  [ $# = 0 ] || usage
  need_root
  need_tools ip tc flock mpirun mpicc timeout unshare
  check_net
  local rates="${EP_TESTBED_SELFTEST_RATES:-1gbit 100mbit}"
  local tmp rate pp ex a2a expect ratio ok=1 unshaped="" verdict summary="" shown=0
  local bytes secs=1.2 t_start=$SECONDS cpu slowest="" slowest_bits=0 bits
  for rate in $rates; do
    check_rate "$rate"
    [ "$rate" != none ] || die "selftest rates must be shaped"
    bits="$(rate_bits "$rate")"
    if [ -z "$slowest" ] || [ "$bits" -lt "$slowest_bits" ]; then slowest="$rate"; slowest_bits="$bits"; fi
  done
  tmp="$(mktemp -d)"
  TMP_DIR="$tmp" # removed by on_exit
  mpicc -O2 -o "$tmp/bw" "$(dirname "$SELF")/ep-testbed-bw.c" || die "mpicc could not build the probe"
  cpu="$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
  echo "selftest: 2 ranks in moe-ep0/moe-ep1; CPU: ${cpu:-unknown}, $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
  for rate in none $rates; do
    # 16 MiB messages from 500 Mbit/s up (and unshaped), so that one takes >= ~0.1 s and Open
    # MPI's per-message handshake does not dominate; 4 MiB below.
    bytes=$((16 << 20))
    if [ "$rate" != none ] && [ "$(rate_bits "$rate")" -lt 500000000 ]; then bytes=$((4 << 20)); fi
    selftest_run "$rate" "$rate" "$bytes" "$secs" "$tmp/bw"
    pp="$(field pingpong_mbit)"
    ex="$(field exchange_mbit)"
    a2a="$(field alltoall_mbit)"
    [ "$(field data)" = ok ] || { log "selftest: payload check FAILED at rate $rate"; ok=0; }
    if [ "$rate" = none ]; then
      unshaped="$pp"
      summary+="$(printf '%-8s ping-pong %7.1f  exchange %7.1f  alltoall %7.1f Mbit/s  (unshaped)' \
        "$rate" "$pp" "$ex" "$a2a")"$'\n'
      continue
    fi
    expect="$(awk -v b="$(rate_bits "$rate")" 'BEGIN { printf "%.1f", b / 1e6 }')"
    ratio="$(awk -v m="$pp" -v e="$expect" 'BEGIN { printf "%.2f", m / e }')"
    verdict="ok"
    if ! awk -v x="$ratio" 'BEGIN { exit !(x >= 0.70 && x <= 1.30) }'; then
      verdict="FAIL: ping-pong not within 30% of $rate"
      ok=0
    elif ! awk -v m="$pp" -v u="$unshaped" 'BEGIN { exit !(m * 1.3 <= u) }'; then
      verdict="inconclusive: unshaped is not 30% faster than $rate on this machine"
    else
      shown=1
    fi
    summary+="$(printf '%-8s ping-pong %7.1f  exchange %7.1f  alltoall %7.1f Mbit/s  ping-pong/rate %s  %s' \
      "$rate" "$pp" "$ex" "$a2a" "$ratio" "$verdict")"$'\n'
  done
  # For information (not checked): the same probe at the slowest rate with the TCP btl's put
  # protocol off, which lets both directions of a link carry data at once.
  selftest_run "$slowest, no put" "$slowest" $((4 << 20)) "$secs" "$tmp/bw" --mca btl_tcp_flags "$NO_PUT_FLAGS"
  [ "$(field data)" = ok ] || { log "selftest: payload check FAILED at $slowest without put"; ok=0; }
  summary+="$(printf '%-8s ping-pong %7.1f  exchange %7.1f  alltoall %7.1f Mbit/s  (btl_tcp_flags %s; information)' \
    "$slowest" "$(field pingpong_mbit)" "$(field exchange_mbit)" "$(field alltoall_mbit)" "$NO_PUT_FLAGS")"$'\n'

  echo "selftest summary ($((SECONDS - t_start)) s; Mbit/s of payload, per direction):"
  printf '%s' "$summary" | sed 's/^/  /'
  [ "$shown" = 1 ] || { log "selftest: no rate showed that shaping has an effect"; ok=0; }
  if [ -n "$(our_namespaces)" ] || [ -n "$(our_links)" ]; then
    log "selftest: test bed left behind"
    ok=0
  fi
  if [ "$ok" = 1 ]; then
    echo "selftest: PASS"
  else
    echo "selftest: FAIL"
    return 1
  fi
}

# ----------------------------------------------------------------------------------------------

[ $# -ge 1 ] || usage
cmd="$1"
shift
case "$cmd" in
  up) cmd_up "$@" ;;
  down) cmd_down "$@" ;;
  status) cmd_status "$@" ;;
  run) cmd_run "$@" ;;
  mpirun-args) cmd_mpirun_args "$@" ;;
  selftest) cmd_selftest "$@" ;;
  -h|--help|help) usage 0 ;;
  *) usage ;;
esac
