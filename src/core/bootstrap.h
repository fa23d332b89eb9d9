// Out-of-band rendezvous over TCP. The unique id carries the root's address and a random secret;
// every connection proves the secret first, anything else is dropped and logged.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/wait.h"
#include "braid/braid.h"

namespace braid {

// Which communicator a rank belongs to: ranks meet only ranks with the same key.
constexpr size_t kCommKeyBytes = 16;
using CommKey = std::array<uint8_t, kCommKeyBytes>;

// The decoded contents of a braidUniqueId.
struct BootstrapId {
  std::string host;  // numeric IPv4 or IPv6 address of the root
  uint16_t port = 0;
  uint8_t secret[32] = {};         // proves a connection belongs to the job
  CommKey key{};                   // names the communicator among the job's
  bool rootHostedByRank0 = false;  // the job's service at an environment-given address

  braidUniqueId encode() const;
  static BootstrapId decode(const braidUniqueId& id);  // throws braidInvalidArgument if not ours
};

// braidGetUniqueId: a new communicator on every call. By default a root thread in this process,
// on an ephemeral port of the bootstrap interface, serves its rendezvous once. With BRAID_COMM_ID
// (NCCL_COMM_ID's counterpart) the root is the job's rendezvous service at that address, which
// rank 0 of a communicator starts unless another process of the job already serves there. Either
// way the caller hands the id to the other ranks.
BootstrapId makeUniqueId();

// braidCommInitFromEnv: the id of the `ordinal`-th world communicator (1, 2, ...) of a job started
// by a launcher, the same on every rank that asks for the same ordinal: the root is the job's
// service at BRAID_COMM_ID or at MASTER_ADDR:MASTER_PORT+1 (torchrun's TCPStore already listens
// on MASTER_PORT), the secret comes from the job's id. Nothing when neither is set.
std::optional<BootstrapId> worldIdFromEnv(uint64_t ordinal);

// The id of an environment-started job, as worldIdFromEnv derives it: the root at `hostPort`
// ("host:port" or "[ipv6]:port", the host resolved to a numeric address), secret and key derived
// from `secretSeed`, hosted by rank 0. Equal inputs give equal ids on every rank. `origin` names
// where hostPort came from, for errors.
BootstrapId rendezvousId(const std::string& hostPort, const std::string& secretSeed,
                         const std::string& origin);

// Starts a root thread in this process on an ephemeral port of the bootstrap interface, with a
// random secret and key. It serves one rendezvous, then exits; it gives up after BRAID_TIMEOUT,
// or at the deadlines of the ranks that arrived, telling them which ranks never did. Ranks of
// another communicator that reach it are refused, told which communicator they reached.
BootstrapId startRootInThisProcess();

// What the bootstrap makes of bytes a stranger on the network can send, for the fuzz targets:
// each call parses or throws braid::Error, and touches nothing beyond its input.
namespace bootstrap_wire {
// A connection's first bytes as a root or a rank's listener reads them: the hello, checked
// against `secret`, then a root hello's payload.
void decodeRootConnection(std::string_view bytes, const uint8_t* secret);
// The root's reply as a rank of `nranks` publishing `infoBytes` reads it: header, then the rank
// table or an error's sentence.
void decodeRootReply(std::string_view bytes, int nranks, size_t infoBytes);
}  // namespace bootstrap_wire

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

  // braidCommShrink: the id of a communicator of `survivors` (ranks of this one, ascending, this
  // rank among them). Every survivor derives the same id with no exchange, so the excluded ranks
  // (dead ones too) take no part: the root is the first survivor's bootstrap listener, kept open
  // for this since the ring formed, and the key is derived from this communicator's key, the
  // survivors and `ordinal` (which shrink to these survivors it is). The first survivor starts
  // that root; a survivor that derived another key is refused by it, naming both.
  virtual BootstrapId shrunkId(const std::vector<int>& survivors, uint64_t ordinal) = 0;

 protected:
  int rank_ = 0;
  int nranks_ = 0;
  std::vector<std::string> infos_;
};

}  // namespace braid
