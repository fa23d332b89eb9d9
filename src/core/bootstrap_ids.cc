// The bootstrap's ids derived from the environment (BRAID_COMM_ID, MASTER_ADDR/MASTER_PORT, the
// job's id): the job's rendezvous address and secret, and the world communicators' ids.
#include "core/bootstrap_ids.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "base/error.h"
#include "base/log.h"
#include "base/params.h"
#include "base/random.h"
#include "base/socket.h"
#include "core/bootstrap.h"
#include "core/bootstrap_wire.h"

namespace braid {
using namespace bootstrap_detail;
namespace {

// ---- environment-derived ids ----

struct EnvRendezvous {
  std::string hostPort;
  std::string origin;
};

std::optional<EnvRendezvous> rendezvousFromEnv() {
  if (!param::CommId().empty()) return EnvRendezvous{param::CommId(), "BRAID_COMM_ID"};
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  if (addr == nullptr || *addr == '\0' || port == nullptr || *port == '\0') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(port, &end, 10);
  if (errno != 0 || *end != '\0' || value < 1 || value > 65534)
    fail(braidInvalidArgument,
         "MASTER_PORT='{}' is not a port between 1 and 65534 (braid's root listens on "
         "MASTER_PORT+1)",
         port);
  std::string host = addr;
  if (host.find(':') != std::string::npos && host.front() != '[') host = "[" + host + "]";
  // torchrun's TCPStore already listens on MASTER_PORT.
  return EnvRendezvous{fmt::format("{}:{}", host, value + 1), "MASTER_ADDR/MASTER_PORT"};
}

}  // namespace

namespace bootstrap_detail {

void deriveBytes(const std::string& seed, uint8_t* out, size_t bytes) {
  for (size_t lane = 0; lane < bytes / 8; ++lane) {
    const char laneByte = static_cast<char>(lane);
    const uint64_t hash = fnv1a(seed, fnv1a(std::string_view(&laneByte, 1)));
    for (int i = 0; i < 8; ++i) out[lane * 8 + i] = static_cast<uint8_t>(hash >> (8 * i));
  }
}

std::string secretSeedFromEnv(const std::string& hostPort) {
  if (!param::Secret().empty()) return "BRAID_SECRET=" + param::Secret();
  std::string seed;
  for (const char* name :
       {"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') seed += fmt::format("{}={};", name, value);
  }
  return seed + "@" + hostPort;
}

}  // namespace bootstrap_detail

BootstrapId rendezvousId(const std::string& hostPort, const std::string& secretSeed,
                         const std::string& origin) {
  auto [host, port] = splitHostPort(hostPort, origin);
  BootstrapId id;
  id.host = SocketAddress::resolve(host, port, origin).host();
  id.port = port;
  deriveBytes(secretSeed, id.secret, sizeof id.secret);
  deriveBytes(secretSeed + "|communicator", id.key.data(), id.key.size());
  id.rootHostedByRank0 = true;
  return id;
}

std::optional<BootstrapId> worldIdFromEnv(uint64_t ordinal) {
  std::optional<EnvRendezvous> env = rendezvousFromEnv();
  if (!env) return std::nullopt;
  const std::string seed = secretSeedFromEnv(env->hostPort);
  BootstrapId id = rendezvousId(env->hostPort, seed, env->origin);
  deriveBytes(fmt::format("{}|world communicator {}", seed, ordinal), id.key.data(), id.key.size());
  BRAID_INFO(log::kBootstrap,
             "world communicator {} from {}: communicator {}, root at {} port {}, rank 0 hosts it",
             ordinal, env->origin, keyName(id.key), id.host, id.port);
  return id;
}

}  // namespace braid
