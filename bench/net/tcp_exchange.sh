#!/usr/bin/env bash
# The TCP floor of a small exchange between two namespace hosts (tests/multihost/netns_hosts.sh):
# bench/net/tcp_exchange over one duplex connection and over two one-way connections, alternating
# in rounds so that drift hits both. Usage (root): bench/net/tcp_exchange.sh BUILD_DIR [OUTPUT]
# (OUTPUT defaults to bench/results/net_tcp_exchange.txt).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
if [ -z "${BRAID_TEST_NETNS:-}" ]; then
  [ $# -ge 1 ] || { echo "usage: tcp_exchange.sh BUILD_DIR [OUTPUT]" >&2; exit 2; }
  build="$(cd "$1" && pwd)"
  output="${2:-$repo/bench/results/net_tcp_exchange.txt}"
  exec "$repo/tests/multihost/netns_hosts.sh" --hosts 2 -- "$0" "$build" "$output"
fi
build="$1"
output="$2"
probe="$build/bench/tcp_exchange"
[ -x "$probe" ] || { echo "tcp_exchange.sh: $probe is missing" >&2; exit 1; }
IFS=, read -r h0 h1 <<< "$BRAID_TEST_NETNS"
{
  echo "# Plain TCP exchange between 2 namespace hosts (veth + bridge): both send, then busy-poll"
  echo "# for the other's message; 20000 exchanges per run; $(date -u '+%Y-%m-%d %H:%M UTC');"
  echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; Linux $(uname -r)"
  for round in 1 2 3; do
    for bytes in 8 1024; do
      for mode in duplex oneway; do
        ip netns exec "$h1" "$probe" "$mode" 10.77.0.2 10.77.0.1 "$bytes" > /dev/null &
        ip netns exec "$h0" "$probe" "$mode" 10.77.0.1 10.77.0.2 "$bytes"
        wait
      done
    done
  done
} | tee "$output"
