#!/usr/bin/env bash
# mpirun's remote shell for namespace hosts (--mca plm_rsh_agent): "netns_rsh.sh ADDRESS COMMAND..."
# runs COMMAND in the namespace of BRAID_TEST_NETNS whose eth0 holds ADDRESS.
set -euo pipefail
address="$1"
shift
for ns in ${BRAID_TEST_NETNS//,/ }; do
  if ip -n "$ns" -br addr show dev eth0 | grep -qw -- "$address"; then
    exec ip netns exec "$ns" sh -c "$*"
  fi
done
echo "netns_rsh.sh: no host in BRAID_TEST_NETNS has address $address" >&2
exit 1
