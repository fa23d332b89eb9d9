#!/usr/bin/env bash
# Makes N "hosts" on this machine and runs a command on the first of them.
#
#   netns_hosts.sh [--hosts N] [--ipv6] -- command [args...]
#
# Each host is a network namespace with loopback and one veth link, eth0, whose other end is a port
# of a bridge that lives in a namespace of its own (the switch), so nothing is added to the
# machine's own network. Addresses exist only inside the namespaces: 10.77.0.<i+1>/24 (with
# --ipv6, fd77::<i+1>/64 and no IPv4 address). The command runs in host 0 with
#   BRAID_TEST_NETNS         the hosts' namespace names, comma-separated, host 0 first
#   BRAID_TEST_SWITCH_NETNS  the switch's namespace; host i's port there is named port<i>
# Namespaces are removed on every exit path. Exits 77 (ctest's skip code) with a message when
# namespaces cannot be made (not root, no CAP_SYS_ADMIN, no veth or bridge support).
set -euo pipefail

hosts=2
ipv6=0
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts="$2"; shift 2 ;;
    --ipv6) ipv6=1; shift ;;
    --) shift; break ;;
    *) echo "netns_hosts.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
if [ $# -eq 0 ] || [ "$hosts" -lt 1 ] || [ "$hosts" -gt 200 ]; then
  echo "usage: netns_hosts.sh [--hosts N (1..200)] [--ipv6] -- command [args...]" >&2
  exit 2
fi

skip() {
  echo "SKIPPED: multihost tests need network namespaces: $*" >&2
  exit 77
}
[ "$(id -u)" -eq 0 ] || skip "not running as root (uid $(id -u))"
command -v ip > /dev/null || skip "the ip command (iproute2) is not installed"

# Unique per run, so concurrent runs (ctest -j) never meet.
prefix="braid$$"
switch="${prefix}sw"
names=()
for ((i = 0; i < hosts; i++)); do names+=("${prefix}h$i"); done

created=()
cleanup() {
  for ns in "${created[@]}"; do ip netns del "$ns" 2> /dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

make_ns() {
  ip netns add "$1" 2> /dev/null || return 1
  created+=("$1")
  ip -n "$1" link set lo up
}

make_ns "$switch" || skip "'ip netns add' failed (no CAP_SYS_ADMIN, or /var/run/netns is not writable)"
ip -n "$switch" link add br0 type bridge 2> /dev/null || skip "the kernel cannot make a bridge"
ip -n "$switch" link set br0 up
for ((i = 0; i < hosts; i++)); do
  ns="${names[$i]}"
  make_ns "$ns" || skip "'ip netns add $ns' failed"
  # Both ends are created inside the namespaces: the machine's own namespace never sees them.
  ip -n "$ns" link add eth0 type veth peer name "port$i" netns "$switch" 2> /dev/null ||
    skip "the kernel cannot make veth pairs"
  ip -n "$switch" link set "port$i" master br0 up
  if [ "$ipv6" -eq 1 ]; then
    ip -n "$ns" -6 addr add "fd77::$((i + 1))/64" dev eth0 nodad
  else
    ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev eth0
  fi
  ip -n "$ns" link set eth0 up
done

# Every host must reach host 0 before the command starts: a connection to a closed port is refused
# (not dropped) once the link forwards.
first="${names[0]}"
for ((i = 1; i < hosts; i++)); do
  address="10.77.0.$((i + 1))"
  [ "$ipv6" -eq 1 ] && address="fd77::$((i + 1))"
  ok=0
  for _ in $(seq 1 50); do
    answer="$(ip netns exec "$first" timeout 1 bash -c "exec 3<>/dev/tcp/$address/9" 2>&1 || true)"
    if [[ "$answer" == *refused* ]]; then ok=1; break; fi
    sleep 0.1
  done
  [ "$ok" -eq 1 ] || { echo "netns_hosts.sh: host 0 cannot reach host $i ($address)" >&2; exit 1; }
done

export BRAID_TEST_NETNS
BRAID_TEST_NETNS="$(IFS=,; echo "${names[*]}")"
export BRAID_TEST_SWITCH_NETNS="$switch"
status=0
ip netns exec "$first" "$@" || status=$?
exit "$status"
