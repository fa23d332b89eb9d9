#!/usr/bin/env bash
# mpirun's remote shell for namespace hosts (--mca plm_rsh_agent), as tests/multihost/netns_rsh.sh,
# except that each host gets a host name of its own (a UTS namespace) and its own directory for
# Open MPI's shared-memory segments: otherwise Open MPI takes every namespace host for one node,
# and its vader segments of different hosts collide (a crash in mca_btl_vader_poll_handle_frag).
# braid tells hosts by network namespace and machines by boot id, so names change nothing for it.
# Usage: netns_rsh_named.sh ADDRESS COMMAND...
set -euo pipefail
address="$1"
shift
for ns in ${BRAID_TEST_NETNS//,/ }; do
  if ip -n "$ns" -br addr show dev eth0 | grep -qw -- "$address"; then
    mkdir -p "/dev/shm/nshost-$address"
    exec ip netns exec "$ns" unshare --uts sh -c \
      "hostname nshost-$address && OMPI_MCA_btl_vader_backing_directory=/dev/shm/nshost-$address $*"
  fi
done
echo "netns_rsh_named.sh: no host in BRAID_TEST_NETNS has address $address" >&2
exit 1
