#!/usr/bin/env bash
# braid-perf under a plan file: the communicator must run the file's ring order (the plan in the
# header) and every result must check. Usage: run_with_plan.sh BRAID_PERF PLAN_FILE
set -euo pipefail
out="$(BRAID_PLAN_FILE="$2" "$1" allreduce -b 8 -e 4M -f 8 -c 1 -n 2 -w 1 --np 4 2>&1)"
echo "$out"
grep -q "plan: channel  0: 0 -> 2 -> 1 -> 3 -> 0" <<< "$out"
grep -q "Out of bounds values : 0 OK" <<< "$out"
