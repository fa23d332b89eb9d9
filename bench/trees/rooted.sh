#!/usr/bin/env bash
# A collective as braid's model chooses it (broadcast and reduce: the double binary trees for small
# calls, coll/host_tree.h; all-gather and reduce-scatter: Bruck's log-step algorithm,
# coll/host_bruck.h) against braid's ring (BRAID_ALGO=ring), interleaved, braid-perf under mpirun
# on namespace hosts of this machine (tests/multihost/netns_hosts.sh), one rank per host or
# several. Prints size, time (us, out of place), wrong elements and time in place per row.
# Usage (root): bench/trees/rooted.sh BUILD_DIR HOSTS RANKS_PER_HOST COLLECTIVE [ROUNDS]
#   COLLECTIVE: broadcast, reduce, allgather or reducescatter (braid-perf's names).
#   BRAID_AGAINST=ALGO sets BRAID_ALGO for the second column instead of leaving the model to choose;
#   BRAID_PERF_MAX_BYTES (default 1M) is the largest size; BRAID_PERF_ITERS and BRAID_PERF_WARMUP
#   (default 50 and 5) braid-perf's timed and warm-up iterations per size.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

# One braid-perf run per BRAID_ALGO per round; inside netns_hosts.sh (BRAID_TEST_NETNS set).
interleaved_rounds() {
  local build="$1" hosts="$2" per="$3" coll="$4" rounds="${5:-3}" status
  for round in $(seq 1 "$rounds"); do
    for algo in ring "${BRAID_AGAINST:-}"; do
      echo "## round $round, $hosts hosts x $per, $coll, BRAID_ALGO=${algo:-(unset: the model chooses)}"
      echo "#     size(B)  time(us)  wrong  in-place(us)"
      set +e
      "$here/mpirun_netns.sh" "$hosts" "$per" 300 ${algo:+-x BRAID_ALGO=$algo} \
        "$build/tools/braid-perf" "$coll" -b 8 -e "${BRAID_PERF_MAX_BYTES:-1M}" -f 8 \
        -n "${BRAID_PERF_ITERS:-50}" -w "${BRAID_PERF_WARMUP:-5}" -r 1 2>&1 |
        awk '/^ +[0-9]/ {printf "%14s %9s %6s %13s\n", $1, $6, $9, $10}'
      status=("${PIPESTATUS[@]}")
      set -e
      # A run that fails or is stopped is said, and the rounds go on.
      [ "${status[0]}" = 0 ] || echo "# this run ended with status ${status[0]} (124: stopped)"
      # The next run starts once this one's ranks are gone (up to 10 s): ranks of a stopped launch
      # left spinning would take the cores from it.
      for _ in $(seq 1 100); do pgrep -f "$build/tools/braid-perf" > /dev/null || break; sleep 0.1; done
    done
  done
}

if [ "${1:-}" = --inside ]; then
  shift
  interleaved_rounds "$@"
  exit 0
fi
[ $# -ge 4 ] || { echo "usage: rooted.sh BUILD_DIR HOSTS RANKS_PER_HOST COLLECTIVE [ROUNDS]" >&2; exit 2; }
build="$(cd "$1" && pwd)"
echo "# bench/trees/rooted.sh $*: braid $(git -C "$here" describe --always --dirty 2> /dev/null || echo '?')," \
  "$(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)," \
  "against the ring: ${BRAID_AGAINST:-the model choosing}"
exec "$here/../../tests/multihost/netns_hosts.sh" --hosts "$2" -- "$0" --inside "$build" "${@:2}"
