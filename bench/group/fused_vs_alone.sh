#!/usr/bin/env bash
# A group's small collectives fused into one pass (coll/group_plan.h) against the same calls one
# by one (BRAID_GROUP_FUSE_BYTES=0), in the same run: braid-perf all-reduce, float32 sum, 8 B - 1 MiB
# by 4, -m 8 (8 calls per group, as nccl-tests' agg_iters), on
#   1. 2 processes of one host (shared memory),
#   2. 4 processes of one host, unbound (more ranks than this machine's 2 cores),
#   3. 2 namespace hosts, one rank each (TCP over veth; tests/multihost/netns_hosts.sh, root).
# Each configuration alternates the two settings for ROUNDS rounds; the table gives the median
# per-call time (out of place) of each and their ratio (fused / alone: below 1 is faster).
# Usage: bench/group/fused_vs_alone.sh BUILD_DIR [ROUNDS (5)] [OUTPUT]
#   MIN_BYTES, MAX_BYTES and FACTOR (8, 1M, 4) set the sizes; FUSE_BYTES the fused side's
#   BRAID_GROUP_FUSE_BYTES in bytes (braid's default where unset); ITERS (500) the timed groups per
#   size: 20 groups of 1 us calls are timer noise; KEEP_WORK=1 keeps the runs' outputs.
# braid-perf's -c checks one call of each row, not a group: the fused results are checked by
# tests/multirank/test_group_passes.cc.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
if [ -n "${BRAID_TEST_NETNS:-}" ]; then  # inside netns_hosts.sh: one two-host run
  IFS=, read -r h0 h1 <<< "$BRAID_TEST_NETNS"
  perf="$1"
  shift
  rank() { env BRAID_COMM_ID=10.77.0.1:29500 RANK=$1 WORLD_SIZE=2 ip netns exec "$2" "$perf" "${@:3}"; }
  rank 1 "$h1" "$@" > /dev/null 2>&1 &
  rank 0 "$h0" "$@"
  wait
  exit
fi
[ $# -ge 1 ] || { echo "usage: fused_vs_alone.sh BUILD_DIR [ROUNDS] [OUTPUT]" >&2; exit 2; }
build="$(cd "$1" && pwd)"
rounds="${2:-5}"
output="${3:-$repo/bench/results/group_fusion.txt}"
perf="$build/tools/braid-perf"
work="$(mktemp -d)"
[ -n "${KEEP_WORK:-}" ] || trap 'rm -rf "$work"' EXIT
args=(allreduce -b "${MIN_BYTES:-8}" -e "${MAX_BYTES:-1M}" -f "${FACTOR:-4}" -m 8 -n "${ITERS:-500}" -w 50 -c 1)

run() {  # config fuse(0 or default) round
  local out="$work/$1.$2.$3" setting=()
  if [ "$2" != default ]; then
    setting=("BRAID_GROUP_FUSE_BYTES=$2")
  elif [ -n "${FUSE_BYTES:-}" ]; then
    setting=("BRAID_GROUP_FUSE_BYTES=$FUSE_BYTES")
  fi
  case "$1" in
    2procs) env "${setting[@]}" "$perf" "${args[@]}" --np 2 > "$out" 2>&1 || true ;;
    4procs) env "${setting[@]}" "$perf" "${args[@]}" --np 4 --bind none > "$out" 2>&1 || true ;;
    2hosts)
      env "${setting[@]}" "$repo/tests/multihost/netns_hosts.sh" --hosts 2 -- "$0" "$perf" \
        "${args[@]}" > "$out" 2>&1 || true ;;
  esac
  grep -q "Out of bounds values : 0 OK" "$out" || { echo "a run failed: $out" >&2; cat "$out" >&2; exit 1; }
}

configs=(2procs 4procs 2hosts)
for ((r = 0; r < rounds; r++)); do
  for config in "${configs[@]}"; do
    run "$config" 0 "$r"
    run "$config" default "$r"
  done
done

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
{
  echo "# A group's calls fused against one by one: braid-perf ${args[*]}"
  echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); braid $(git -C "$repo" describe --always --dirty); $(nproc) cores;" \
    "$rounds interleaved rounds; median out-of-place us per call"
  echo "# fused: BRAID_GROUP_FUSE_BYTES=${FUSE_BYTES:-default}; alone: BRAID_GROUP_FUSE_BYTES=0"
  for config in "${configs[@]}"; do
    echo
    echo "## $config"
    printf "%10s %10s %10s %8s\n" bytes alone fused ratio
    for size in $(awk '$1 ~ /^[0-9]+$/ && NF >= 10 { print $1 }' "$work/$config.0.0"); do
      alone="$(for f in "$work/$config.0".*; do awk -v s="$size" '$1 == s { print $6 }' "$f"; done | median)"
      fused="$(for f in "$work/$config.default".*; do awk -v s="$size" '$1 == s { print $6 }' "$f"; done | median)"
      printf "%10d %10.2f %10.2f %8.2f\n" "$size" "$alone" "$fused" "$(echo "$fused / $alone" | bc -l)"
    done
  done
} | tee "$output"
