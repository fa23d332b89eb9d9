#!/usr/bin/env bash
# Sockets per rank with 16 ranks on 4 namespace hosts (4 per host; tests/multihost/netns_hosts.sh),
# counted by each rank after communicator init and after one ring all-reduce
# (bench/net/count_sockets.c). Usage (root): bench/net/count_sockets.sh BUILD_DIR [OUTPUT]
# (OUTPUT defaults to bench/results/net_sockets.txt).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
if [ -z "${BRAID_TEST_NETNS:-}" ]; then
  [ $# -ge 1 ] || { echo "usage: count_sockets.sh BUILD_DIR [OUTPUT]" >&2; exit 2; }
  build="$(cd "$1" && pwd)"
  output="${2:-$repo/bench/results/net_sockets.txt}"
  exec "$repo/tests/multihost/netns_hosts.sh" --hosts 4 -- "$0" "$build" "$output"
fi
build="$1"
output="$2"
probe="$build/bench/count_sockets"
[ -x "$probe" ] || { echo "count_sockets.sh: $probe is missing" >&2; exit 1; }
IFS=, read -r -a hosts <<< "$BRAID_TEST_NETNS"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
ranks=16
# Before the output (a tracked file) is rewritten, which would make the tree look dirty.
version="$(git -C "$repo" describe --always --dirty 2> /dev/null || echo '?')"
run() {  # $1: the network (BRAID_NET)
  local env=(BRAID_NET="$1")
  [ "$1" = ucx ] && env+=(UCX_TLS=tcp)
  for ((r = 0; r < ranks; ++r)); do
    env "${env[@]}" BRAID_COMM_ID=10.77.0.1:29500 RANK=$r WORLD_SIZE=$ranks \
      ip netns exec "${hosts[$((r % ${#hosts[@]}))]}" "$probe" > "$work/$1.rank$r" 2>&1 &
  done
  wait
}
nets=(socket)
ldd "$probe" | grep -q libucp && nets+=(ucx)  # built with UCX
for net in "${nets[@]}"; do run "$net"; done
{
  echo "# Sockets per rank: $ranks ranks on ${#hosts[@]} namespace hosts (rank r on host r % ${#hosts[@]}),"
  echo "# CPU communicators; counted by each rank after init and after one ring all-reduce (4 MiB)."
  echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); braid $version"
  echo "# Before connections on first use (86740ff, sockets): 27 at init and after (28 on rank 0)."
  for net in "${nets[@]}"; do
    echo "## BRAID_NET=$net"
    for ((r = 0; r < ranks; ++r)); do grep -v "^\[" "$work/$net.rank$r"; done
  done
} | tee "$output"
