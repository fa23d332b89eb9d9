#!/usr/bin/env bash
# The planner's predicted busbw against the measured one, for CPU ranks:
#   1. one host: 2, 3, 4 and 8 ranks as processes (braid-perf --np);
#   2. 2 and 3 hosts (network namespaces joined by veth and a bridge, tests/multihost/
#      netns_hosts.sh), one rank on each.
# braid-perf prints the prediction next to every measured row (braidCommPredict). Every
# configuration runs once per round, REPEAT rounds (default 5); the median measured busbw per size
# is compared with the prediction, and the spread over rounds is shown: the bar is +-25% from
# 1 MiB up.
# Usage (root for the namespace part): bench/plan_vs_measured.sh BUILD_DIR [OUTPUT]
#   OUTPUT defaults to bench/results/plan_vs_measured.txt.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
build="$(cd "${1:?usage: plan_vs_measured.sh BUILD_DIR [OUTPUT]}" && pwd)"
output="${2:-$repo/bench/results/plan_vs_measured.txt}"
perf="$build/tools/braid-perf"
repeat="${REPEAT:-5}"
sizes=(-b 1M -e 256M -f 4)
[ -x "$perf" ] || { echo "plan_vs_measured.sh: $perf is missing" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Rows of one braid-perf table as "size measured_busbw predicted_busbw" (out-of-place busbw).
rows() { awk '$1 ~ /^[0-9]+$/ { print $1, $8, $14 }' "$1"; }

# The median over runs of each size's measured busbw, with the prediction (the same every run).
summarize() {
  local label="$1"; shift
  for f in "$@"; do rows "$f"; done | sort -n -k1,1 -k2,2 | awk -v label="$label" -v runs=$# '
    { size[NR] = $1; bw[NR] = $2; pred[$1] = $3; count[$1]++ }
    END {
      n = NR; i = 1
      while (i <= n) {
        s = size[i]; k = count[s]; median = bw[i + int((k - 1) / 2)]
        if (k % 2 == 0) median = (bw[i + k / 2 - 1] + bw[i + k / 2]) / 2
        ratio = median > 0 ? pred[s] / median : 0
        ok = (ratio >= 0.75 && ratio <= 1.25) ? "ok" : "MISSED"
        printf "%-22s %12d %10.2f %6.2f-%-6.2f %10.2f %8.2f %7s\n", label, s, median, bw[i],
          bw[i + k - 1], pred[s], ratio, ok
        i += k
      }
    }'
}

{
  echo "# braid planner: predicted vs measured all-reduce busbw, CPU ranks"
  echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')," \
    "$(nproc) cores; Linux $(uname -r); braid $(git -C "$repo" describe --always --dirty 2> /dev/null || echo '?')"
  echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg); rounds: $repeat (every configuration once per round; median and range)"
  echo "# measured: braid-perf out-of-place busbw (mean of -n iterations); predicted: braidCommPredict"
  echo
} > "$work/header"

: > "$work/summary"
# Rounds: every configuration once per round, so that a shared machine's drift over the run falls
# on all configurations alike; the median over rounds is compared with the prediction.
netns=0
[ -z "${BRAID_TEST_NETNS:-}" ] && [ "$(id -u)" -eq 0 ] && netns=1
for run in $(seq "$repeat"); do
  for np in 2 3 4 8; do
    "$perf" allreduce "${sizes[@]}" -n 20 -w 5 -c 1 --np "$np" > "$work/local$np.$run" 2>&1
  done
  # One rank per namespace host, started the way a launcher would (RANK, WORLD_SIZE).
  [ "$netns" -eq 1 ] || continue
  for hosts in 2 3; do
    "$repo/tests/multihost/netns_hosts.sh" --hosts "$hosts" -- bash -c '
      IFS=, read -r -a ns <<< "$BRAID_TEST_NETNS"
      for ((r = ${#ns[@]} - 1; r >= 0; r--)); do
        BRAID_COMM_ID=10.77.0.1:29500 RANK=$r WORLD_SIZE=${#ns[@]} ip netns exec "${ns[$r]}" \
          '"$perf"' allreduce '"${sizes[*]}"' -n 20 -w 5 -c 1 > '"$work"'/net'"$hosts"'.'"$run"'.$r 2>&1 &
      done
      wait'
  done
done
for np in 2 3 4 8; do
  summarize "1 host, $np ranks" $(for run in $(seq "$repeat"); do echo "$work/local$np.$run"; done) \
    >> "$work/summary"
done
if [ "$netns" -eq 1 ]; then
  for hosts in 2 3; do
    summarize "$hosts hosts x 1 rank" \
      $(for run in $(seq "$repeat"); do echo "$work/net$hosts.$run.0"; done) >> "$work/summary"
  done
fi

{
  cat "$work/header"
  printf "%-22s %12s %10s %13s %10s %8s %7s\n" "# configuration" "size(B)" "measured" \
    "(min-max)" "predicted" "pred/meas" "+-25%"
  cat "$work/summary"
  echo
  echo "# the plan and model, as braid-perf printed them (last run of each configuration):"
  for f in "$work"/local*."$repeat" "$work"/net*."$repeat".0; do
    [ -f "$f" ] || continue
    grep -E "^# (nThread|plan:)" "$f"
  done
} | tee "$output"
