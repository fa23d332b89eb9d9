#include "multihost/netns_ranks.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "braid/braid.h"

namespace braid_test {

const std::vector<std::string>& testHosts() {
  static const std::vector<std::string> hosts = [] {
    std::vector<std::string> names;
    const char* list = std::getenv("BRAID_TEST_NETNS");
    std::stringstream in(list ? list : "");
    for (std::string name; std::getline(in, name, ',');)
      if (!name.empty()) names.push_back(name);
    return names;
  }();
  return hosts;
}

int hostOfRank(int rank) {
  return testHosts().empty() ? 0 : rank % static_cast<int>(testHosts().size());
}

std::string switchNamespace() {
  const char* name = std::getenv("BRAID_TEST_SWITCH_NETNS");
  return name ? name : "";
}

namespace {

int threadCount() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  return -1;
}

}  // namespace

std::string enterHost(int host) {
  if (host < 0 || host >= static_cast<int>(testHosts().size()))
    return "no host " + std::to_string(host) + " in BRAID_TEST_NETNS";
  const std::string path = "/var/run/netns/" + testHosts()[host];
  struct stat target {
  }, current{};
  if (stat(path.c_str(), &target) == 0 && stat("/proc/self/ns/net", &current) == 0 &&
      target.st_dev == current.st_dev && target.st_ino == current.st_ino)
    return "";
  // A thread's namespace is its own: with several threads the process would straddle hosts.
  if (const int threads = threadCount(); threads != 1)
    return "the process has " + std::to_string(threads) +
           " threads; only single-threaded rank processes can move to a host";
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "open " + path + ": " + std::strerror(errno);
  const int rc = setns(fd, CLONE_NEWNET);
  const int err = errno;
  close(fd);
  if (rc != 0) return "setns " + path + ": " + std::strerror(err);
  return "";
}

}  // namespace braid_test

// Rank r joins from host r % hosts. Without BRAID_TEST_NETNS it changes nothing.
extern "C" braidResult_t __real_braidCommInitRankConfig(braidComm_t* comm, int nranks,
                                                        braidUniqueId commId, int rank,
                                                        braidConfig_t* config);

extern "C" braidResult_t __wrap_braidCommInitRankConfig(braidComm_t* comm, int nranks,
                                                        braidUniqueId commId, int rank,
                                                        braidConfig_t* config) {
  if (!braid_test::testHosts().empty()) {
    const std::string why = braid_test::enterHost(braid_test::hostOfRank(rank));
    if (!why.empty()) {
      std::fprintf(stderr, "multihost: rank %d cannot move to its host: %s\n", rank, why.c_str());
      return braidSystemError;
    }
  }
  return __real_braidCommInitRankConfig(comm, nranks, commId, rank, config);
}
