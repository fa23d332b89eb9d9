// The bootstrap's root: collects the ranks of each communicator and sends them the rank table,
// or tells the ranks that arrived why it failed; and the unique ids that start one.
#include "core/bootstrap_root.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "base/params.h"
#include "base/random.h"
#include "base/socket.h"
#include "core/bootstrap_gate.h"
#include "core/bootstrap_ids.h"
#include "core/bootstrap_wire.h"

namespace braid {
using namespace bootstrap_detail;
namespace {

using std::chrono::milliseconds;

// The root reports missing ranks this long before the earliest arrived rank's deadline, so the
// report lands before that rank gives up on its own.
constexpr auto kReportMargin = milliseconds(100);
// How long the job's rendezvous service waits for communicators: as long as the process lives.
constexpr auto kServiceLifetime = std::chrono::hours(24 * 365);

// "rank 3", "ranks 1, 4-6".
std::string formatRanks(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out += ", ";
    out += j == i ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return out;
}

// ---- the root ----

// Best effort: a rank that cannot be told is logged, the others are still served.
void sendReply(Socket& to, Clock::time_point rankDeadline, braidResult_t code,
               const std::string& payload, const std::string& where) {
  std::string message = encodeReply(code, payload);
  try {
    to.sendAll(message.data(), message.size(), std::max(rankDeadline, Clock::now() + kHelloTimeout),
               where + ": replying");
  } catch (const Error& e) {
    BRAID_WARN(log::kBootstrap, "{}", e.what());
  }
}

// The ranks of one communicator at the root: collects every rank's hello, then sends each the
// table of all ranks' listen addresses and infos. Failures are told to the ranks that arrived.
class Rendezvous {
 public:
  Rendezvous(std::string where, const CommKey& key) : where_(std::move(where)), key_(key) {}

  bool complete() const { return arrived_ > 0 && arrived_ == nranks(); }
  // When the first rank to give up stops waiting (less a margin, so the report reaches it first).
  Clock::time_point reportBy() const {
    Clock::time_point by = Clock::time_point::max();
    for (const std::optional<Member>& m : members_)
      if (m) by = std::min(by, m->deadline - kReportMargin);
    return by;
  }

  // Takes one rank's admitted hello; sends the table once the last rank has arrived. Returns
  // false when the rendezvous failed and is over (every rank that arrived has been told).
  bool join(Admitted& a) {
    RootHello hello;
    try {
      hello = parseRootHello(a.hello.payload);
    } catch (const Error& e) {
      BRAID_WARN(log::kBootstrap, "{}: dropped the connection from {}: {}", where_,
                 a.socket.peerName(), e.what());
      return true;
    }
    const int rank = a.hello.rank;
    if (members_.empty()) {
      members_.resize(a.hello.nranks);
      infoBytes_ = hello.info.size();
      firstRank_ = rank;
    } else if (a.hello.nranks != nranks() || hello.info.size() != infoBytes_) {
      std::string why = a.hello.nranks != nranks()
                            ? fmt::format(
                                  "communicator {}: rank {} joined with nranks={} but rank {} with "
                                  "nranks={}",
                                  keyName(key_), rank, a.hello.nranks, firstRank_, nranks())
                            : fmt::format(
                                  "communicator {}: rank {} published {} bytes of info but rank {} "
                                  "published {}",
                                  keyName(key_), rank, hello.info.size(), firstRank_, infoBytes_);
      BRAID_WARN(log::kBootstrap, "{}: {}", where_, why);
      reply(a.socket, hello.deadline, braidInvalidArgument, why);
      for (std::optional<Member>& m : members_)
        if (m) reply(m->socket, m->deadline, braidInvalidArgument, why);
      return false;
    }
    if (members_[rank]) {
      std::string why =
          fmt::format("communicator {}: rank {} joined twice (first from {}, again from {})",
                      keyName(key_), rank, members_[rank]->socket.peerName(), a.socket.peerName());
      BRAID_WARN(log::kBootstrap, "{}: {}", where_, why);
      reply(a.socket, hello.deadline, braidInvalidArgument, why);
      return true;
    }
    members_[rank] =
        Member{std::move(a.socket), hello.listenAddress, std::move(hello.info), hello.deadline};
    if (++arrived_ == nranks()) sendTable();
    return true;
  }

  void reportMissing() {
    std::vector<int> missing;
    for (int r = 0; r < nranks(); ++r)
      if (!members_[r]) missing.push_back(r);
    std::string why = fmt::format(
        "{} of {} ranks of communicator {} never arrived at the {} before the "
        "deadline: {}",
        missing.size(), nranks(), keyName(key_), where_, formatRanks(missing));
    BRAID_WARN(log::kBootstrap, "{}", why);
    for (std::optional<Member>& m : members_)
      if (m) reply(m->socket, m->deadline, braidTimeout, why);
  }

  void reply(Socket& to, Clock::time_point rankDeadline, braidResult_t code,
             const std::string& payload) {
    sendReply(to, rankDeadline, code, payload, where_);
  }

 private:
  struct Member {
    Socket socket;
    SocketAddress listenAddress;
    std::string info;
    Clock::time_point deadline;
  };

  int nranks() const { return static_cast<int>(members_.size()); }

  void sendTable() {
    WireWriter table;
    for (const std::optional<Member>& m : members_) {
      table.putAddress(m->listenAddress);
      table.putBytes(m->info.data(), m->info.size());
    }
    for (int r = 0; r < nranks(); ++r) {
      members_[r]->socket.setPeerName(
          fmt::format("rank {} ({})", r, members_[r]->socket.peerName()));
      reply(members_[r]->socket, members_[r]->deadline, braidSuccess, table.data());
    }
    BRAID_INFO(log::kBootstrap, "{}: all {} ranks of communicator {} arrived", where_, nranks(),
               keyName(key_));
  }

  std::string where_;
  CommKey key_;
  std::vector<std::optional<Member>> members_;  // by rank, sized by the first hello
  size_t infoBytes_ = 0;
  int firstRank_ = 0;
  int arrived_ = 0;
};

// A root: a listener that admits ranks proving the secret and sorts them into rendezvous by their
// communicator key, so that ranks of different communicators never meet. Started for one unique
// id it serves that communicator alone, once, and refuses ranks of any other naming both; as the
// job's service (BRAID_COMM_ID, MASTER_ADDR) it serves every communicator for as long as the
// process lives.
class RendezvousRoot {
 public:
  RendezvousRoot(Socket listener, const uint8_t* secret, Clock::time_point deadline,
                 std::optional<CommKey> onlyKey)
      : where_("bootstrap root at " + listener.localAddress().toString()),
        gate_(std::move(listener), secret, where_),
        deadline_(deadline),
        onlyKey_(onlyKey) {}

  const std::string& where() const { return where_; }

  void serve() {
    for (;;) {
      Clock::time_point wake = deadline_;
      for (const auto& [key, r] : rendezvous_) wake = std::min(wake, r.reportBy());
      std::optional<Admitted> a = gate_.admit(wake);
      if (!a) {
        const Clock::time_point now = Clock::now();
        for (auto it = rendezvous_.begin(); it != rendezvous_.end();) {
          if (now < it->second.reportBy() && now < deadline_) {
            ++it;
            continue;
          }
          it->second.reportMissing();
          it = rendezvous_.erase(it);
          served_ = true;  // a one-communicator root is done once it told its ranks why
        }
        if (onlyKey_ && now >= deadline_) {
          BRAID_INFO(log::kBootstrap, "{}: deadline passed; exiting", where_);
          return;
        }
        if (onlyKey_ && rendezvous_.empty() && served_) return;
        continue;
      }
      if (a->hello.kind != kRootHello) {
        gate_.reject(*a, "a ring hello sent to the root");
        continue;
      }
      if (onlyKey_ && a->hello.key != *onlyKey_) {
        refuseStranger(*a);
        continue;
      }
      auto [it, fresh] = rendezvous_.try_emplace(a->hello.key, where_, a->hello.key);
      const bool alive = it->second.join(*a);
      if (!alive || it->second.complete()) {
        rendezvous_.erase(it);
        served_ = true;
        if (onlyKey_) return;
      }
    }
  }

 private:
  // A rank that knows the secret but belongs to another communicator: an id of the same job given
  // to the wrong ranks. It is told which communicator it reached and which it is of.
  void refuseStranger(Admitted& a) {
    std::string why = fmt::format(
        "rank {} of communicator {} (nranks {}) reached the {}, which serves communicator {}: "
        "ranks of different communicators cannot meet (was it given another communicator's "
        "unique id?)",
        a.hello.rank, keyName(a.hello.key), a.hello.nranks, where_, keyName(*onlyKey_));
    BRAID_WARN(log::kBootstrap, "{}", why);
    sendReply(a.socket, Clock::now(), braidInvalidUsage, why, where_);
  }

  std::string where_;
  Gatekeeper gate_;
  Clock::time_point deadline_;
  std::optional<CommKey> onlyKey_;
  std::map<CommKey, Rendezvous> rendezvous_;
  bool served_ = false;
};

}  // namespace

namespace bootstrap_detail {

void startRootThread(Socket listener, const uint8_t* secret, Clock::time_point deadline,
                     std::optional<CommKey> onlyKey) {
  auto root = std::make_unique<RendezvousRoot>(std::move(listener), secret, deadline, onlyKey);
  std::thread([root = std::move(root)] {
    try {
      root->serve();
    } catch (...) {
      BRAID_WARN(log::kBootstrap, "{}: {}", root->where(), currentError().what());
    }
  }).detach();
}

void ensureRootService(const BootstrapId& id, const std::string& self) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, uint16_t>, pid_t> hosted;
  std::lock_guard<std::mutex> lock(mutex);
  pid_t& host = hosted[{id.host, id.port}];
  if (host == getpid()) return;  // a forked child inherits the record, not the thread
  // All addresses: the name in the id may resolve to a loopback address on its own host.
  SocketAddress any = SocketAddress::wildcard(
      SocketAddress::fromNumeric(id.host, id.port, "unique id").family(), id.port);
  int err = 0;
  Socket listener = Socket::listen(any, true, &err);
  if (!listener.valid()) {
    if (err != EADDRINUSE)
      failErrno(braidSystemError,
                fmt::format("{}: cannot host the bootstrap service at port {} (set BRAID_COMM_ID "
                            "to a free host:port)",
                            self, id.port),
                err);
    // Another process of the job serves there, or something else holds the port: only the first
    // accepts connections.
    try {
      Socket::connect(SocketAddress::fromNumeric(id.host, id.port, "unique id"),
                      "the bootstrap service", Clock::now() + kHelloTimeout, self);
    } catch (const Error& e) {
      fail(braidSystemError,
           "{}: port {} is in use, but nothing there accepts connections ({}); set BRAID_COMM_ID "
           "to a free host:port",
           self, id.port, e.what());
    }
    BRAID_INFO(log::kBootstrap,
               "{}: port {} is taken; joining the service another process of the job hosts there",
               self, id.port);
    return;
  }
  startRootThread(std::move(listener), id.secret, Clock::now() + kServiceLifetime, std::nullopt);
  host = getpid();
}

}  // namespace bootstrap_detail

BootstrapId startRootInThisProcess() {
  const NetInterface& interface = bootstrapInterface();
  Socket listener = Socket::listen(interface.address, false);
  BootstrapId id;
  id.host = interface.address.host();
  id.port = listener.localAddress().port();
  fillRandom(id.secret, sizeof id.secret);
  fillRandom(id.key.data(), id.key.size());
  startRootThread(std::move(listener), id.secret, Clock::now() + milliseconds(param::TimeoutMs()),
                  id.key);
  BRAID_INFO(log::kBootstrap, "bootstrap root started at {}",
             SocketAddress::fromNumeric(id.host, id.port, "unique id").toString());
  return id;
}

BootstrapId makeUniqueId() {
  if (param::CommId().empty()) return startRootInThisProcess();
  // As NCCL_COMM_ID: the root is at the given address, the job's service there; the communicator
  // is new.
  BootstrapId id =
      rendezvousId(param::CommId(), secretSeedFromEnv(param::CommId()), "BRAID_COMM_ID");
  fillRandom(id.key.data(), id.key.size());
  return id;
}

}  // namespace braid
