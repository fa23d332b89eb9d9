#!/usr/bin/env bash
# braid's all-reduce as the model chooses it (recursive doubling, halving, one-shot or ring) against
# braid's ring (a communicator allowed the ring alone) and Open MPI's MPI_Allreduce, interleaved in
# one run (bench/allreduce_vs_mpi --ring), on namespace hosts of this machine joined by veth and a
# bridge (tests/multihost/netns_hosts.sh): 8 hosts x 1 rank and 4 hosts x 2 ranks.
# Open MPI runs with --mca btl self,vader,tcp and yields when idle (its advice for more ranks than
# cores: without it, ranks spinning in MPI's barrier between timed calls starve the others, and
# both libraries measured 15-60 ms per call).
# Usage (root): bench/trees/run.sh BUILD_DIR [OUTPUT] [benchmark options, default -b 8 -e 4M -f 4 -r 3 -n 0.1]
#   OUTPUT defaults to bench/results/trees_vs_ring_vs_mpi.txt.
#   BRAID_ALGO, when set, forces braid's first column (e.g. halving) as it would any program, and
#   BRAID_HALVING_LEVELS with it how many of halving's exchanges halve;
#   BRAID_TREES_SHAPES picks the shapes ("hosts ranks_per_host" pairs, ';' between them).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
if [ -z "${BRAID_TEST_NETNS:-}" ]; then
  [ $# -ge 1 ] || { echo "usage: run.sh BUILD_DIR [OUTPUT] [benchmark options]" >&2; exit 2; }
  build="$(cd "$1" && pwd)"
  output="${2:-$repo/bench/results/trees_vs_ring_vs_mpi.txt}"
  extra=("${@:3}")
  [ -x "$build/bench/allreduce_vs_mpi" ] || { echo "run.sh: $build/bench/allreduce_vs_mpi is missing" >&2; exit 1; }
  {
    echo "# bench/trees/run.sh ${extra[*]:-(defaults)}: braid (model's choice) vs braid ring vs Open MPI, all-reduce float32 sum"
    echo "# BRAID_ALGO=${BRAID_ALGO:-(unset: the model chooses)}"
    echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); braid $(git -C "$repo" describe --always --dirty 2> /dev/null || echo '?');" \
      "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  } > "$output"
  IFS=';' read -r -a shapes <<< "${BRAID_TREES_SHAPES:-8 1;4 2}"
  for shape in "${shapes[@]}"; do
    read -r hosts per_host <<< "$shape"
    BRAID_TREES_SHAPE="$shape" "$repo/tests/multihost/netns_hosts.sh" --hosts "$hosts" -- \
      "$0" "$build" "$output" "${extra[@]}"
  done
  exit 0
fi
build="$1"
output="$2"
shift 2
read -r hosts per_host <<< "$BRAID_TREES_SHAPE"
[ $# -gt 0 ] || set -- -b 8 -e 4M -f 4 -r 3 -n 0.1
{
  echo
  echo "## $hosts hosts x $per_host ranks (network namespaces; ranks of a host share memory)"
  "$here/mpirun_netns.sh" "$hosts" "$per_host" 600 \
    --mca mpi_yield_when_idle 1 --mca pml ob1 --mca btl self,vader,tcp --mca btl_tcp_if_include eth0 \
    ${BRAID_ALGO:+-x BRAID_ALGO="$BRAID_ALGO"} \
    ${BRAID_HALVING_LEVELS:+-x BRAID_HALVING_LEVELS="$BRAID_HALVING_LEVELS"} \
    "$build/bench/allreduce_vs_mpi" --ring "$@" ||
    echo "# this run ended with status $? (124: stopped)"
} | tee -a "$output"
