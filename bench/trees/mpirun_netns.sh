#!/usr/bin/env bash
# mpirun across this machine's namespace hosts (tests/multihost/netns_hosts.sh; BRAID_TEST_NETNS
# set), with the options every bench/trees run shares. mpirun's launch there now and then hangs
# before any rank starts (one of its daemons never reports: about one launch in ten of 4 hosts x 2,
# seen with gdb: mpirun and two of three orteds waiting, no rank process), so a launch that prints
# nothing within 30 s is stopped and tried again, up to 3 times; a run that started and does not end
# within LIMIT seconds is stopped. Prints the program's output without Open MPI's own lines, and
# exits with mpirun's status (124: stopped).
# Usage: mpirun_netns.sh HOSTS RANKS_PER_HOST LIMIT [mpirun options] PROGRAM ARGS...
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
hosts="$1" per="$2" limit="$3"
shift 3
list=""
for i in $(seq 1 "$hosts"); do list+="${list:+,}10.77.0.$i:$per"; done
program=""  # the first executable path among the arguments: its ranks are stopped with the run
for arg in "$@"; do
  if [ -z "$program" ] && [[ "$arg" == */* ]] && [ -x "$arg" ] && [ -f "$arg" ]; then program="$arg"; fi
done
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

# Whether the program has printed a line of its own.
started() { grep -qvE "^vm:|^\[|^ *$" "$log"; }

for attempt in 1 2 3; do
  setsid mpirun --allow-run-as-root --bind-to none -np $((hosts * per)) --host "$list" \
    --mca plm_rsh_agent "$here/netns_rsh_named.sh" --mca plm_rsh_no_tree_spawn 1 \
    --mca routed direct --mca oob_tcp_if_include eth0 -x BRAID_COMM_ID=10.77.0.1:29500 \
    "$@" > "$log" 2>&1 &
  pid=$!
  status=""
  for tick in $(seq 1 $((limit * 10))); do
    if ! kill -0 "$pid" 2> /dev/null; then
      wait "$pid"
      status=$?
      break
    fi
    if [ "$tick" -eq 300 ] && ! started; then break; fi
    sleep 0.1
  done
  if [ -z "$status" ]; then
    kill -9 -- "-$pid" 2> /dev/null
    wait "$pid" 2> /dev/null
    pkill -9 -f "orted.*$here/netns_rsh_named.sh" 2> /dev/null
    [ -z "$program" ] || pkill -9 -f "^$program" 2> /dev/null
    status=124
    if ! started; then
      echo "# mpirun's launch printed nothing in 30 s (attempt $attempt of 3): stopped" >&2
      continue
    fi
  fi
  break
done
grep -vE "^vm:|^\[" "$log"
exit "$status"
