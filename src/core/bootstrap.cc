#include "core/bootstrap.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "base/params.h"
#include "base/socket.h"
#include "core/bootstrap_gate.h"
#include "core/bootstrap_ids.h"
#include "core/bootstrap_root.h"
#include "core/bootstrap_wire.h"

namespace braid {
using namespace bootstrap_detail;
namespace {

using std::chrono::milliseconds;

// ---- the ranks' side ----

int64_t millisecondsLeft(Clock::time_point deadline) {
  return std::max<int64_t>(
      0, std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count());
}

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
    if (nranks > 1) {
      formRing(id, deadline);
      // Nobody leaves the join before every rank has joined: a rank's ring connections close
      // only once all are in the ring, so a close seen while the ring forms is a failure.
      barrier(deadline);
    }
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
             activity, WhenToCloses::Fails);
    WireReader r(theirs, sizeof theirs, activity);
    auto prevSequence = r.get<uint64_t>();
    auto prevBytes = r.get<uint64_t>();
    if (prevSequence != sequence)
      fail(braidInvalidUsage, "{}: {} is at bootstrap collective #{}", activity, prev_.peerName(),
           prevSequence);
    if (prevBytes != bytes)
      fail(braidInvalidArgument, "{}: this rank gathers {} bytes per rank, {} gathers {}", activity,
           bytes, prev_.peerName(), prevBytes);
    // Step s forwards the slice received in step s-1: n-1 steps and every slice went round. The
    // next rank needs every step's slice, so it may leave only in the last (a rank that failed
    // then is seen by the rank after it, which reads from it).
    char* base = static_cast<char*>(data);
    for (int step = 0; step < nranks_ - 1; ++step) {
      size_t sendSlice = (rank_ - step + nranks_) % nranks_;
      size_t recvSlice = (rank_ - step - 1 + nranks_) % nranks_;
      sendRecv(next_, base + sendSlice * bytes, bytes, prev_, base + recvSlice * bytes, bytes,
               deadline, fmt::format("{} step {}", activity, step + 1),
               step + 1 < nranks_ - 1 ? WhenToCloses::Fails : WhenToCloses::MayHaveEnded);
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
           "{} (the root closes a connection that does not prove the unique id's secret, and "
           "every connection when its process ends: do all ranks use the same id, and is the "
           "process that made it still running? Its own error says why it ended)",
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
    // Every listener was up before the table was sent: a refusal means its rank has gone.
    next_ = Socket::connect(listenAddresses_[next], rankName(next), deadline, activity,
                            Socket::Refused::IsFinal);
    std::string hello = encodeHello(kRingHello, rank_, nranks_, id, "");
    next_.sendAll(hello.data(), hello.size(), deadline, activity);
    Gatekeeper gate(listener_.duplicate(), id.secret,
                    fmt::format("{} listener at {}", self_, listenAddresses_[rank_].toString()));
    for (;;) {
      std::optional<Admitted> a = gate.admit(deadline, &next_);
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
