#!/usr/bin/env bash
# Launch agent for the expert-parallel network test bed (see docs/ep-testbed.md).
#
# Open MPI's rsh launcher calls its agent as "AGENT [options] HOST COMMAND...", the way it
# would call ssh. This agent maps HOST to one of the test bed's network namespaces and runs
# COMMAND there through a shell, in a fresh UTS namespace whose host name is the namespace
# name, so every Open MPI daemon (and the ranks it starts) lives in its own namespace and
# reports its own node name. Nothing leaves the machine.
#
#   HOST = moe-ep<r>          -> namespace moe-ep<r>
#   HOST = <prefix>.<r+1>     -> namespace moe-ep<r>   (prefix: EP_TESTBED_NET, default 10.77.0)
set -euo pipefail

net="${EP_TESTBED_NET:-10.77.0}"

# Skip ssh-style options that a caller may pass through plm_rsh_args (-x, -o X, -l user, ...).
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-l|-p|-i|-F) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
if [ $# -lt 2 ]; then
  echo "ep-testbed-agent: usage: ep-testbed-agent.sh HOST COMMAND..." >&2
  exit 2
fi
host="$1"
shift

case "$host" in
  moe-ep[0-9]*)
    ns="$host"
    ;;
  "$net".[0-9]*)
    last="${host##*.}"
    case "$last" in *[!0-9]*) last="" ;; esac
    if [ -z "$last" ] || [ "$last" -lt 1 ] || [ "$last" -gt 64 ]; then
      echo "ep-testbed-agent: $host is not a test bed address" >&2
      exit 2
    fi
    ns="moe-ep$((last - 1))"
    ;;
  *)
    echo "ep-testbed-agent: unknown host '$host' (expected moe-ep<r> or $net.<r+1>)" >&2
    exit 2
    ;;
esac

if [ ! -e "/run/netns/$ns" ]; then
  echo "ep-testbed-agent: namespace $ns does not exist (run scripts/ep-testbed.sh up first)" >&2
  exit 2
fi

# ssh hands the remote shell the arguments joined by spaces; do the same.
cmd="$*"
# shellcheck disable=SC2016  # $0/$1 are expanded by the inner shell
exec ip netns exec "$ns" unshare --uts sh -c 'echo "$0" > /proc/sys/kernel/hostname && exec sh -c "$1"' "$ns" "$cmd"
