// Out-of-band rendezvous over TCP. The unique id carries the root's address and a random secret;
// every connection proves the secret first, anything else is dropped and logged.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "braid/braid.h"
#include "core/wait.h"

namespace braid {

// The decoded contents of a braidUniqueId.
struct BootstrapId {
  std::string host;  // numeric IPv4 or IPv6 address of the root
  uint16_t port = 0;
  uint8_t secret[32] = {};
  bool rootHostedByRank0 = false;  // env-derived id: rank 0 starts the root inside its init

  braidUniqueId encode() const;
  static BootstrapId decode(const braidUniqueId& id);  // throws braidInvalidArgument if not ours
};

// braidGetUniqueId: from BRAID_COMM_ID / MASTER_ADDR+MASTER_PORT when set (every rank gets the
// same id, rank 0 hosts the root); else a random secret and a root thread started in this
// process on an ephemeral port of the bootstrap interface.
//
// With torchrun's MASTER_ADDR/MASTER_PORT the root listens on MASTER_PORT+1: torchrun's own
// TCPStore already listens on MASTER_PORT.
BootstrapId makeUniqueId();

// The environment-derived id alone (BRAID_COMM_ID or MASTER_ADDR/MASTER_PORT), or nothing if
// neither is set; never starts a root. For braidCommInitFromEnv.
std::optional<BootstrapId> uniqueIdFromEnv();

// The id of an environment-started job, as makeUniqueId derives it: the root at `hostPort`
// ("host:port" or "[ipv6]:port", the host resolved to a numeric address), a secret derived from
// `secretSeed`, hosted by rank 0. Equal inputs give equal ids on every rank. `origin` names where
// hostPort came from, for errors.
BootstrapId rendezvousId(const std::string& hostPort, const std::string& secretSeed,
                         const std::string& origin);

// Starts a root thread in this process on an ephemeral port of the bootstrap interface, with a
// random secret. It serves one rendezvous, then exits; it gives up after BRAID_TIMEOUT, or at
// the deadlines of the ranks that arrived, telling them which ranks never did.
BootstrapId startRootInThisProcess();

class Bootstrap {
 public:
  // Joins the rendezvous as `rank` of `nranks`, publishing `localInfo` (an opaque blob of the
  // caller's, the same size on every rank). Returns once every rank has arrived and the ring of
  // bootstrap connections is formed. Fails with braidTimeout naming the missing ranks if the
  // deadline passes, with braidInvalidArgument if ranks disagree on nranks or blob size.
  static std::unique_ptr<Bootstrap> join(const BootstrapId& id, int rank, int nranks,
                                         const std::string& localInfo, Clock::time_point deadline);
  virtual ~Bootstrap() = default;

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  // Every rank's blob, indexed by rank.
  const std::vector<std::string>& infos() const { return infos_; }

  // data holds nranks slices of `bytes`; this rank's slice is filled; on return all are.
  virtual void allGather(void* data, size_t bytes, Clock::time_point deadline) = 0;
  virtual void barrier(Clock::time_point deadline) = 0;

 protected:
  int rank_ = 0;
  int nranks_ = 0;
  std::vector<std::string> infos_;
};

}  // namespace braid
