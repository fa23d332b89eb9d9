// Where the ranks of a multihost test run. netns_hosts.sh makes the hosts (network namespaces)
// and names them in BRAID_TEST_NETNS; rank r runs on host r % hosts, so consecutive ranks sit on
// different hosts and the library has to reorder its rings.
//
// Test binaries linked with -Wl,--wrap=braidCommInitRankConfig (multihost.cmake) move each rank's
// process into its host's namespace as it joins, so the multirank harness's forked ranks become
// ranks on several hosts without any change to it.
#pragma once

#include <string>
#include <vector>

namespace braid_test {

// The hosts' namespaces, host 0 first; empty when not run by netns_hosts.sh.
const std::vector<std::string>& testHosts();
int hostOfRank(int rank);
// The namespace of the bridge that joins the hosts; host i's port on it is named port<i>.
std::string switchNamespace();
// Moves the calling process (which must have one thread) into host `host`'s namespace; returns
// why it could not, or "". A process already there stays, whatever its threads (a rank that
// entered its host before starting threads of its own, such as a CUDA runtime's).
std::string enterHost(int host);

}  // namespace braid_test
