#include "core/bootstrap.h"

#include <fmt/ranges.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>

#include "base/error.h"
#include "base/log.h"
#include "base/params.h"
#include "base/random.h"
#include "base/socket.h"

namespace braid {
namespace {

using std::chrono::milliseconds;

constexpr uint32_t kIdMagic = 0x44494272;  // "rBID" in the first bytes of a braidUniqueId
constexpr uint8_t kIdFormatVersion = 2;
constexpr uint8_t kIdFlagRootHostedByRank0 = 1;

// Every bootstrap message starts with this; change it when the wire format changes.
constexpr uint64_t kWireMagic = 0x32762D6469617262;  // "braid-v2"
constexpr int kMaxRanks = 1 << 20;
constexpr size_t kMaxInfoBytes = 64 << 10;
constexpr size_t kMaxErrorBytes = 64 << 10;
constexpr size_t kAddressBytes = 1 + 2 + 16;  // family, port, address
constexpr size_t kMaxHelloPayload = kAddressBytes + 8 + kMaxInfoBytes;
constexpr size_t kHelloHeaderBytes = 8 + 4 + 4 + 4 + 4 + 32 + kCommKeyBytes;
constexpr size_t kReplyHeaderBytes = 8 + 4 + 8;
constexpr size_t kCollectiveHeaderBytes = 8 + 8;
// A connection must prove itself this quickly: a stranger that sends nothing is dropped soon.
constexpr auto kHelloTimeout = std::chrono::seconds(1);
// The root reports missing ranks this long before the earliest arrived rank's deadline, so the
// report lands before that rank gives up on its own.
constexpr auto kReportMargin = milliseconds(100);
// The longest wait a rank may announce to the root: a day.
constexpr int64_t kMaxWaitMs = int64_t{24} * 3600 * 1000;
// How long the job's rendezvous service waits for communicators: as long as the process lives.
constexpr auto kServiceLifetime = std::chrono::hours(24 * 365);

// How errors and logs name a communicator: the first bytes of its key.
std::string keyName(const CommKey& key) {
  return fmt::format("{:02x}", fmt::join(key.begin(), key.begin() + 6, ""));
}

enum HelloKind : uint32_t { kRootHello = 1, kRingHello = 2 };

// Little-endian encoding, so ids and messages mean the same on every host.
class WireWriter {
 public:
  template <typename T>
  void put(T value) {
    auto bits = static_cast<std::make_unsigned_t<T>>(value);
    for (size_t i = 0; i < sizeof(T); ++i)
      out_.push_back(static_cast<char>((static_cast<uint64_t>(bits) >> (8 * i)) & 0xff));
  }
  void putBytes(const void* data, size_t bytes) {
    out_.append(static_cast<const char*>(data), bytes);
  }
  void putAddress(const SocketAddress& address) {
    put<uint8_t>(address.family() == AF_INET6 ? 6 : 4);
    put<uint16_t>(address.port());
    std::vector<uint8_t> raw = address.bytes();
    raw.resize(16);
    putBytes(raw.data(), raw.size());
  }
  const std::string& data() const { return out_; }

 private:
  std::string out_;
};

class WireReader {
 public:
  WireReader(const void* data, size_t bytes, std::string what)
      : data_(static_cast<const uint8_t*>(data)), left_(bytes), what_(std::move(what)) {}

  template <typename T>
  T get() {
    need(sizeof(T));
    uint64_t bits = 0;
    for (size_t i = 0; i < sizeof(T); ++i) bits |= static_cast<uint64_t>(data_[i]) << (8 * i);
    advance(sizeof(T));
    return static_cast<T>(static_cast<std::make_unsigned_t<T>>(bits));
  }
  void getBytes(void* out, size_t bytes) {
    need(bytes);
    std::memcpy(out, data_, bytes);
    advance(bytes);
  }
  std::string getString(size_t bytes) {
    need(bytes);
    std::string s(reinterpret_cast<const char*>(data_), bytes);
    advance(bytes);
    return s;
  }
  SocketAddress getAddress() {
    auto family = get<uint8_t>();
    auto port = get<uint16_t>();
    uint8_t raw[16];
    getBytes(raw, sizeof raw);
    if (family != 4 && family != 6)
      fail(braidInvalidArgument, "{} holds an unknown address family {}", what_, family);
    return SocketAddress::fromBytes(family == 4 ? AF_INET : AF_INET6, raw, port);
  }
  size_t left() const { return left_; }

 private:
  void need(size_t bytes) const {
    if (bytes > left_) fail(braidInvalidArgument, "{} is truncated", what_);
  }
  void advance(size_t bytes) {
    data_ += bytes;
    left_ -= bytes;
  }
  const uint8_t* data_;
  size_t left_;
  std::string what_;
};

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

int64_t millisecondsLeft(Clock::time_point deadline) {
  return std::max<int64_t>(
      0, std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count());
}

// ---- hellos: how a connection proves the secret ----

std::string encodeHello(HelloKind kind, int rank, int nranks, const BootstrapId& id,
                        const std::string& payload) {
  WireWriter w;
  w.put(kWireMagic);
  w.put<uint32_t>(kind);
  w.put<int32_t>(rank);
  w.put<int32_t>(nranks);
  w.put<uint32_t>(static_cast<uint32_t>(payload.size()));
  w.putBytes(id.secret, sizeof id.secret);
  w.putBytes(id.key.data(), id.key.size());
  w.putBytes(payload.data(), payload.size());
  return w.data();
}

struct Hello {
  uint32_t kind = 0;
  int rank = 0;
  int nranks = 0;
  size_t payloadBytes = 0;
  CommKey key{};  // which communicator the rank belongs to
  std::string payload;
};

// Parses and checks a hello header; returns why it is not acceptable, or nothing.
std::optional<std::string> checkHelloHeader(const std::string& header, const uint8_t* secret,
                                            Hello* hello) {
  WireReader r(header.data(), header.size(), "hello");
  auto magic = r.get<uint64_t>();
  if (magic != kWireMagic) return fmt::format("bad magic 0x{:016x}", magic);
  hello->kind = r.get<uint32_t>();
  hello->rank = r.get<int32_t>();
  hello->nranks = r.get<int32_t>();
  hello->payloadBytes = r.get<uint32_t>();
  uint8_t claimed[32];
  r.getBytes(claimed, sizeof claimed);
  if (std::memcmp(claimed, secret, sizeof claimed) != 0)
    return std::string("wrong secret (a unique id from another job?)");
  r.getBytes(hello->key.data(), hello->key.size());
  if (hello->kind != kRootHello && hello->kind != kRingHello)
    return fmt::format("unknown hello kind {}", hello->kind);
  if (hello->nranks < 1 || hello->nranks > kMaxRanks)
    return fmt::format("nranks {} outside 1..{}", hello->nranks, kMaxRanks);
  if (hello->rank < 0 || hello->rank >= hello->nranks)
    return fmt::format("rank {} outside 0..{}", hello->rank, hello->nranks - 1);
  if (hello->payloadBytes > kMaxHelloPayload)
    return fmt::format("hello payload of {} bytes exceeds {}", hello->payloadBytes,
                       kMaxHelloPayload);
  return std::nullopt;
}

struct Admitted {
  Socket socket;
  Hello hello;
};

// A listening socket that admits only connections proving the secret. Each connection must
// send a complete hello within kHelloTimeout; anything else is dropped and logged, never fatal,
// and connections are served side by side so a silent one cannot stall the rest.
class Gatekeeper {
 public:
  Gatekeeper(Socket listener, const uint8_t* secret, std::string name)
      : listener_(std::move(listener)), name_(std::move(name)) {
    std::memcpy(secret_, secret, sizeof secret_);
  }

  const std::string& name() const { return name_; }

  // The next connection with a valid hello, or nothing once the deadline passes.
  std::optional<Admitted> admit(Clock::time_point deadline) {
    for (;;) {
      if (!ready_.empty()) {
        Admitted a = std::move(ready_.front());
        ready_.pop_front();
        return a;
      }
      Clock::time_point now = Clock::now();
      std::erase_if(pending_, [&](const Pending& p) {
        if (now < p.helloDeadline) return false;
        drop(p.socket, fmt::format("no complete hello within {} ms ({} bytes received)",
                                   milliseconds(kHelloTimeout).count(), p.have));
        return true;
      });
      if (now >= deadline) return std::nullopt;
      Clock::time_point wake = deadline;
      std::vector<pollfd> fds{{listener_.fd(), POLLIN, 0}};
      for (const Pending& p : pending_) {
        wake = std::min(wake, p.helloDeadline);
        fds.push_back({p.socket.fd(), POLLIN, 0});
      }
      int rc = ::poll(fds.data(), fds.size(), pollTimeoutMs(wake));
      if (rc < 0 && errno != EINTR) failErrno(braidSystemError, name_ + ": poll", errno);
      if (rc <= 0) continue;
      for (size_t i = 0; i < pending_.size(); ++i)
        if (fds[i + 1].revents != 0) progress(pending_[i]);
      std::erase_if(pending_, [](const Pending& p) { return !p.socket.valid(); });
      if ((fds[0].revents & POLLIN) != 0)
        for (Socket s = listener_.acceptPending(); s.valid(); s = listener_.acceptPending())
          pending_.push_back({std::move(s), Clock::now() + kHelloTimeout,
                              std::string(kHelloHeaderBytes, '\0'), 0, Hello{}, false});
    }
  }

  void reject(const Admitted& a, const std::string& reason) const { drop(a.socket, reason); }

 private:
  struct Pending {
    Socket socket;
    Clock::time_point helloDeadline;
    std::string buffer;  // sized to the bytes expected so far
    size_t have;
    Hello hello;
    bool headerChecked;
  };

  void drop(const Socket& s, const std::string& reason) const {
    BRAID_WARN(log::kBootstrap, "{}: dropped the connection from {}: {}", name_, s.peerName(),
               reason);
  }

  // Reads what has arrived; a finished hello moves to ready_, a bad one is dropped (its socket
  // is closed, left invalid for the caller to sweep away).
  void progress(Pending& p) {
    for (;;) {
      long n = p.socket.readSome(p.buffer.data() + p.have, p.buffer.size() - p.have);
      if (n == -EAGAIN || n == -EINTR) return;
      if (n <= 0) {
        drop(p.socket, n == 0 ? fmt::format("closed after {} hello bytes", p.have)
                              : fmt::format("read failed after {} hello bytes: {}", p.have,
                                            std::strerror(static_cast<int>(-n))));
        p.socket = Socket();
        return;
      }
      p.have += n;
      if (!p.headerChecked && p.have == kHelloHeaderBytes) {
        if (std::optional<std::string> why = checkHelloHeader(p.buffer, secret_, &p.hello)) {
          drop(p.socket, *why);
          p.socket = Socket();
          return;
        }
        p.headerChecked = true;
        p.buffer.resize(kHelloHeaderBytes + p.hello.payloadBytes);
      }
      if (p.headerChecked && p.have == p.buffer.size()) {
        p.hello.payload = p.buffer.substr(kHelloHeaderBytes);
        ready_.push_back({std::move(p.socket), std::move(p.hello)});
        p.socket = Socket();
        return;
      }
    }
  }

  Socket listener_;
  uint8_t secret_[32];
  std::string name_;
  std::vector<Pending> pending_;
  std::deque<Admitted> ready_;
};

// ---- the root ----

struct RootHello {
  SocketAddress listenAddress;
  Clock::time_point deadline;
  std::string info;
};

RootHello parseRootHello(const std::string& payload) {
  WireReader r(payload.data(), payload.size(), "rendezvous hello");
  RootHello h;
  h.listenAddress = r.getAddress();
  // Clamped: a stranger's count of milliseconds must not overflow the clock (found by fuzzing).
  h.deadline = Clock::now() + milliseconds(std::clamp<int64_t>(r.get<int64_t>(), 0, kMaxWaitMs));
  h.info = r.getString(r.left());
  return h;
}

std::string encodeReply(braidResult_t code, const std::string& payload) {
  WireWriter w;
  w.put(kWireMagic);
  w.put<uint32_t>(code);
  w.put<uint64_t>(payload.size());
  w.putBytes(payload.data(), payload.size());
  return w.data();
}

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

// The root runs detached and owns everything it touches, so it neither outlives its rendezvous
// nor depends on its starter; no exception leaves the thread.
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

// The job's rendezvous service at an environment-given address, started by rank 0 of the first
// communicator of this process that needs it. Another process of the job may hold the port
// already (rank 0 of a communicator over other ranks): then that one serves this communicator too.
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

// ---- environment-derived ids ----

// FNV-1a 64 over the lane number and the seed, one lane per 8 bytes. Not cryptographic: an
// environment-derived secret only keeps strangers and other jobs out, and is as guessable as the
// job id it comes from.
void deriveBytes(const std::string& seed, uint8_t* out, size_t bytes) {
  for (size_t lane = 0; lane < bytes / 8; ++lane) {
    const char laneByte = static_cast<char>(lane);
    const uint64_t hash = fnv1a(seed, fnv1a(std::string_view(&laneByte, 1)));
    for (int i = 0; i < 8; ++i) out[lane * 8 + i] = static_cast<uint8_t>(hash >> (8 * i));
  }
}

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

// The same on every rank of one job, different between jobs.
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

// ---- what a rank reads from the root ----

struct ReplyHeader {
  braidResult_t code = braidSuccess;
  uint64_t bytes = 0;  // of the body that follows: the rank table, or the error's sentence
};

ReplyHeader parseReplyHeader(const char* header, int nranks, size_t infoBytes,
                             const std::string& activity, const std::string& from) {
  WireReader r(header, kReplyHeaderBytes, activity);
  auto magic = r.get<uint64_t>();
  auto code = r.get<uint32_t>();
  auto bytes = r.get<uint64_t>();
  if (magic != kWireMagic)
    fail(braidRemoteError, "{}: {} sent a reply with bad magic 0x{:016x}", activity, from, magic);
  if (code != braidSuccess) {
    if (bytes > kMaxErrorBytes || code >= braidNumResults)
      fail(braidRemoteError, "{}: {} sent a malformed error (code {}, {} bytes)", activity, from,
           code, bytes);
    return {static_cast<braidResult_t>(code), bytes};
  }
  const uint64_t expected = uint64_t(nranks) * (kAddressBytes + infoBytes);
  if (bytes != expected)
    fail(braidRemoteError, "{}: {} sent a table of {} bytes, expected {}", activity, from, bytes,
         expected);
  return {braidSuccess, bytes};
}

void parseTable(const std::string& table, int nranks, size_t infoBytes, const std::string& activity,
                std::vector<SocketAddress>* addresses, std::vector<std::string>* infos) {
  WireReader t(table.data(), table.size(), activity + ": the rank table");
  for (int r = 0; r < nranks; ++r) {
    addresses->push_back(t.getAddress());
    infos->push_back(t.getString(infoBytes));
  }
}

// ---- the ranks' side ----

class RingBootstrap final : public Bootstrap {
 public:
  RingBootstrap(const BootstrapId& id, int rank, int nranks, const std::string& localInfo,
                Clock::time_point deadline)
      : self_(fmt::format("bootstrap rank {} of {}", rank, nranks)), id_(id) {
    rank_ = rank;
    nranks_ = nranks;
    if (nranks == 1 && id.rootHostedByRank0) {  // nobody to meet and no root to serve
      infos_ = {localInfo};
      return;
    }
    if (id.rootHostedByRank0 && rank == 0) ensureRootService(id, self_);
    listener_ = rendezvous(id, localInfo, deadline);
    if (nranks > 1) formRing(id, deadline);
    BRAID_INFO(log::kBootstrap, "{}: joined at {}", self_,
               nranks > 1 ? listenAddresses_[rank].toString() : std::string("-"));
  }

  void allGather(void* data, size_t bytes, Clock::time_point deadline) override {
    if (nranks_ == 1) return;
    const uint64_t sequence = ++collectives_;
    const std::string activity = fmt::format("{}: bootstrap all-gather #{}", self_, sequence);
    // Agree on the operation first: a size mismatch would otherwise desynchronise the ring.
    WireWriter mine;
    mine.put(sequence);
    mine.put<uint64_t>(bytes);
    char theirs[kCollectiveHeaderBytes];
    sendRecv(next_, mine.data().data(), mine.data().size(), prev_, theirs, sizeof theirs, deadline,
             activity);
    WireReader r(theirs, sizeof theirs, activity);
    auto prevSequence = r.get<uint64_t>();
    auto prevBytes = r.get<uint64_t>();
    if (prevSequence != sequence)
      fail(braidInvalidUsage, "{}: {} is at bootstrap collective #{}", activity, prev_.peerName(),
           prevSequence);
    if (prevBytes != bytes)
      fail(braidInvalidArgument, "{}: this rank gathers {} bytes per rank, {} gathers {}", activity,
           bytes, prev_.peerName(), prevBytes);
    // Step s forwards the slice received in step s-1: n-1 steps and every slice went round.
    char* base = static_cast<char*>(data);
    for (int step = 0; step < nranks_ - 1; ++step) {
      size_t sendSlice = (rank_ - step + nranks_) % nranks_;
      size_t recvSlice = (rank_ - step - 1 + nranks_) % nranks_;
      sendRecv(next_, base + sendSlice * bytes, bytes, prev_, base + recvSlice * bytes, bytes,
               deadline, fmt::format("{} step {}", activity, step + 1));
    }
  }

  // An all-gather completes on a rank only after every rank contributed.
  void barrier(Clock::time_point deadline) override {
    std::vector<char> tokens(nranks_);
    allGather(tokens.data(), 1, deadline);
  }

  BootstrapId shrunkId(const std::vector<int>& survivors, uint64_t ordinal) override {
    if (survivors.size() == 1) return startRootInThisProcess();  // nobody to meet
    BootstrapId id = id_;
    const SocketAddress& first = listenAddresses_[survivors.front()];
    id.host = first.host();
    id.port = first.port();
    id.rootHostedByRank0 = false;
    deriveBytes(
        fmt::format("{}|shrink {}|{}", keyName(id_.key), ordinal, fmt::join(survivors, ",")),
        id.key.data(), id.key.size());
    if (survivors.front() == rank_) {
      startRootThread(listener_.duplicate(), id.secret,
                      Clock::now() + milliseconds(param::TimeoutMs()), id.key);
    }
    BRAID_INFO(log::kBootstrap, "{}: shrink {} to ranks {}: communicator {}, root at {}", self_,
               ordinal, fmt::join(survivors, ","), keyName(id.key), first.toString());
    return id;
  }

 private:
  std::string rankName(int r) const {
    return fmt::format("rank {} ({})", r, listenAddresses_[r].toString());
  }

  // Sends this rank's hello to the root and receives the table; returns this rank's listener.
  Socket rendezvous(const BootstrapId& id, const std::string& localInfo,
                    Clock::time_point deadline) {
    SocketAddress rootAddress = SocketAddress::fromNumeric(id.host, id.port, "unique id");
    Socket root = Socket::connect(rootAddress, "the bootstrap root at " + rootAddress.toString(),
                                  deadline, self_ + ": joining the rendezvous");
    // Listen on the address this host uses to reach the root: the others can reach it too.
    SocketAddress listenAddress = root.localAddress();
    listenAddress.setPort(0);
    Socket listener;
    if (nranks_ > 1) {
      listener = Socket::listen(listenAddress, false);
      listenAddress = listener.localAddress();
    }
    WireWriter payload;
    payload.putAddress(listenAddress);
    payload.put<int64_t>(millisecondsLeft(deadline));
    payload.putBytes(localInfo.data(), localInfo.size());
    std::string hello = encodeHello(kRootHello, rank_, nranks_, id, payload.data());
    const std::string activity = self_ + ": rendezvous";
    char header[kReplyHeaderBytes];
    try {
      root.sendAll(hello.data(), hello.size(), deadline, activity);
      root.recvAll(header, sizeof header, deadline, activity);
    } catch (const Error& e) {
      if (e.code() != braidRemoteError) throw;
      fail(braidRemoteError,
           "{} (the root drops connections that do not prove the unique id's secret: do all "
           "ranks use the same id?)",
           e.what());
    }
    const ReplyHeader reply =
        parseReplyHeader(header, nranks_, localInfo.size(), activity, root.peerName());
    std::string body(reply.bytes, '\0');
    root.recvAll(body.data(), body.size(), deadline, activity);
    if (reply.code != braidSuccess) throw Error(reply.code, fmt::format("{}: {}", self_, body));
    parseTable(body, nranks_, localInfo.size(), activity, &listenAddresses_, &infos_);
    return listener;
  }

  // Connects to the next rank's listener and accepts the previous rank on this one.
  void formRing(const BootstrapId& id, Clock::time_point deadline) {
    const int next = (rank_ + 1) % nranks_;
    const int prev = (rank_ + nranks_ - 1) % nranks_;
    const std::string activity = self_ + ": forming the bootstrap ring";
    next_ = Socket::connect(listenAddresses_[next], rankName(next), deadline, activity);
    std::string hello = encodeHello(kRingHello, rank_, nranks_, id, "");
    next_.sendAll(hello.data(), hello.size(), deadline, activity);
    Gatekeeper gate(listener_.duplicate(), id.secret,
                    fmt::format("{} listener at {}", self_, listenAddresses_[rank_].toString()));
    for (;;) {
      std::optional<Admitted> a = gate.admit(deadline);
      if (!a)
        fail(braidTimeout, "{}: {} never connected to this rank's listener before the deadline",
             activity, rankName(prev));
      const Hello& h = a->hello;
      if (h.kind != kRingHello || h.rank != prev || h.nranks != nranks_ || h.key != id.key ||
          !h.payload.empty()) {
        gate.reject(*a, fmt::format("expected the ring hello of rank {} of {} of communicator {}; "
                                    "got a kind {} hello of rank {} of {} of communicator {}",
                                    prev, nranks_, keyName(id.key), h.kind, h.rank, h.nranks,
                                    keyName(h.key)));
        continue;
      }
      prev_ = std::move(a->socket);
      prev_.setPeerName(rankName(prev));
      return;
    }
  }

  std::string self_;  // how errors name this rank
  const BootstrapId id_;
  Socket listener_;  // kept after the ring formed: the root of a shrink (shrunkId)
  std::vector<SocketAddress> listenAddresses_;
  Socket next_;
  Socket prev_;
  uint64_t collectives_ = 0;
};

}  // namespace

braidUniqueId BootstrapId::encode() const {
  if (port == 0) fail(braidInvalidArgument, "unique id: port 0 is not a rendezvous port");
  WireWriter w;
  w.put(kIdMagic);
  w.put(kIdFormatVersion);
  w.put<uint8_t>(rootHostedByRank0 ? kIdFlagRootHostedByRank0 : 0);
  w.putAddress(SocketAddress::fromNumeric(host, port, "unique id"));
  w.putBytes(secret, sizeof secret);
  w.putBytes(key.data(), key.size());
  static_assert(4 + 1 + 1 + kAddressBytes + 32 + kCommKeyBytes <= BRAID_UNIQUE_ID_BYTES);
  braidUniqueId id{};
  std::memcpy(id.internal, w.data().data(), w.data().size());
  return id;
}

BootstrapId BootstrapId::decode(const braidUniqueId& raw) {
  WireReader r(raw.internal, sizeof raw.internal, "commId");
  auto magic = r.get<uint32_t>();
  if (magic != kIdMagic)
    fail(braidInvalidArgument,
         "commId is not a braid unique id (bad magic 0x{:08x}, expected 0x{:08x}); pass the id "
         "braidGetUniqueId made",
         magic, kIdMagic);
  auto version = r.get<uint8_t>();
  if (version != kIdFormatVersion)
    fail(braidInvalidArgument,
         "commId has format version {}, this braid reads version {} (mixed braid versions?)",
         version, kIdFormatVersion);
  auto flags = r.get<uint8_t>();
  if ((flags & ~kIdFlagRootHostedByRank0) != 0)
    fail(braidInvalidArgument, "commId is not a braid unique id (unknown flags 0x{:02x})", flags);
  SocketAddress address = r.getAddress();
  if (address.port() == 0) fail(braidInvalidArgument, "commId is not a braid unique id (port 0)");
  BootstrapId id;
  id.host = address.host();
  id.port = address.port();
  r.getBytes(id.secret, sizeof id.secret);
  r.getBytes(id.key.data(), id.key.size());
  id.rootHostedByRank0 = (flags & kIdFlagRootHostedByRank0) != 0;
  return id;
}

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

BootstrapId makeUniqueId() {
  if (param::CommId().empty()) return startRootInThisProcess();
  // As NCCL_COMM_ID: the root is at the given address, the job's service there; the communicator
  // is new.
  BootstrapId id =
      rendezvousId(param::CommId(), secretSeedFromEnv(param::CommId()), "BRAID_COMM_ID");
  fillRandom(id.key.data(), id.key.size());
  return id;
}

namespace bootstrap_wire {

void decodeRootConnection(std::string_view bytes, const uint8_t* secret) {
  if (bytes.size() < kHelloHeaderBytes) fail(braidRemoteError, "hello is truncated");
  Hello hello;
  if (std::optional<std::string> why =
          checkHelloHeader(std::string(bytes.substr(0, kHelloHeaderBytes)), secret, &hello))
    fail(braidRemoteError, "hello refused: {}", *why);
  const std::string_view payload = bytes.substr(kHelloHeaderBytes);
  if (payload.size() < hello.payloadBytes) fail(braidRemoteError, "hello payload is truncated");
  if (hello.kind == kRootHello) parseRootHello(std::string(payload.substr(0, hello.payloadBytes)));
}

void decodeRootReply(std::string_view bytes, int nranks, size_t infoBytes) {
  if (bytes.size() < kReplyHeaderBytes) fail(braidRemoteError, "reply is truncated");
  const ReplyHeader reply = parseReplyHeader(bytes.data(), nranks, infoBytes, "reply", "the root");
  const std::string_view body = bytes.substr(kReplyHeaderBytes);
  if (body.size() < reply.bytes) fail(braidRemoteError, "reply body is truncated");
  if (reply.code != braidSuccess) return;
  std::vector<SocketAddress> addresses;
  std::vector<std::string> infos;
  parseTable(std::string(body.substr(0, reply.bytes)), nranks, infoBytes, "reply", &addresses,
             &infos);
}

}  // namespace bootstrap_wire

std::unique_ptr<Bootstrap> Bootstrap::join(const BootstrapId& id, int rank, int nranks,
                                           const std::string& localInfo,
                                           Clock::time_point deadline) {
  if (nranks < 1 || nranks > kMaxRanks)
    fail(braidInvalidArgument, "bootstrap: nranks={} is outside 1..{}", nranks, kMaxRanks);
  if (rank < 0 || rank >= nranks)
    fail(braidInvalidArgument, "bootstrap: rank={} is outside 0..{} (nranks={})", rank, nranks - 1,
         nranks);
  if (localInfo.size() > kMaxInfoBytes)
    fail(braidInvalidArgument, "bootstrap rank {}: {} bytes of rank info exceed the {} allowed",
         rank, localInfo.size(), kMaxInfoBytes);
  return std::make_unique<RingBootstrap>(id, rank, nranks, localInfo, deadline);
}

}  // namespace braid
