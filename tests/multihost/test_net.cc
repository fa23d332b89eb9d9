// The network transport's parts on loopback, no namespaces needed: how messages split across
// sockets, the host-contiguous ring order, and the socket plug-in and proxy against well-behaved
// and misbehaving peers (a stranger without the token, truncated, oversized and malformed frames,
// a peer that never reads). Misbehaving peers are raw sockets speaking the wire format by hand.
#include <gtest/gtest.h>
#include <linux/tcp.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include "base/error.h"
#include "base/socket.h"
#include "plan/host_graph.h"
#include "plan/plan.h"
#include "transport/local.h"
#include "transport/net/net_transport.h"
#include "transport/net/proxy.h"
#include "transport/net/socket_net.h"
#ifdef BRAID_HAVE_UCX
#include "transport/net/ucx_net.h"
#endif
#include "transport/transport.h"

namespace braid::net {
namespace {

using namespace std::chrono_literals;
namespace plan = braid::plan;

// ---- splitting messages ----

TEST(NetWire, PartsCoverEveryMessageOnceAndInOrder) {
  const uint64_t kMin = wire::kMinPartBytes;
  std::vector<uint64_t> sizes = {0,
                                 1,
                                 63,
                                 4096,
                                 kMin - 1,
                                 kMin,
                                 2 * kMin - 1,
                                 2 * kMin,
                                 2 * kMin + 1,
                                 100000,
                                 1 << 20,
                                 (1 << 20) + 7,
                                 64 * kMin + 3};
  for (int sockets = 1; sockets <= kMaxSockets; ++sockets) {
    for (uint64_t bytes : sizes) {
      SCOPED_TRACE(testing::Message() << bytes << " bytes over " << sockets << " sockets");
      const int parts = wire::messageParts(bytes, sockets);
      ASSERT_GE(parts, 1);
      ASSERT_LE(parts, sockets);
      EXPECT_EQ(parts, static_cast<int>(std::clamp<uint64_t>(bytes / kMin, 1, sockets)));
      uint64_t next = 0;
      for (int part = 0; part < parts; ++part) {
        const wire::PartRange range = wire::messagePart(bytes, parts, part);
        EXPECT_EQ(range.offset, next);
        if (parts > 1) {
          EXPECT_GE(range.bytes, kMin / 2);
        }
        if (bytes > 0) {
          EXPECT_GT(range.bytes, 0u);
        }
        next = range.offset + range.bytes;
      }
      EXPECT_EQ(next, bytes);
    }
  }
}

TEST(NetWire, EachPartHasItsOwnSocket) {
  for (int sockets = 1; sockets <= kMaxSockets; ++sockets) {
    for (uint64_t seq : {0ull, 1ull, 5ull, 1000003ull}) {
      std::vector<bool> used(sockets, false);
      for (int part = 0; part < sockets; ++part) {
        const int socket = wire::socketOfPart(seq, part, sockets);
        ASSERT_FALSE(used[socket]);
        used[socket] = true;
        EXPECT_EQ(wire::partOnSocket(seq, socket, sockets), part);
      }
    }
  }
}

// ---- ring order ----

// The planner's rings for CPU ranks spread over hosts: every host's ranks in one stretch, so a
// ring crosses the network once per host.
TEST(RingOrder, KeepsEachHostsRanksTogether) {
  std::mt19937 random(12345);
  for (int trial = 0; trial < 100; ++trial) {
    const int nranks = 1 + static_cast<int>(random() % 40);
    const int nhosts = 1 + static_cast<int>(random() % 6);
    std::vector<plan::HostRankInfo> ranks(nranks);
    for (plan::HostRankInfo& r : ranks) r = {.host = 1000 + random() % nhosts, .nicGBs = 1.0};
    const plan::LinkGraph graph = plan::hostGraph(ranks);
    const plan::Plan found = plan::search(graph);
    plan::validate(graph, found);
    for (const plan::Channel& channel : found.channels) {
      std::vector<int> sorted = channel.order;
      std::sort(sorted.begin(), sorted.end());
      std::vector<int> identity(nranks);
      std::iota(identity.begin(), identity.end(), 0);
      ASSERT_EQ(sorted, identity);
      // Count host changes around the ring: one per host (none for a single host).
      int changes = 0;
      for (int i = 0; i < nranks; ++i)
        changes += ranks[channel.order[i]].host != ranks[channel.order[(i + 1) % nranks]].host;
      std::set<uint64_t> hosts;
      for (const auto& r : ranks) hosts.insert(r.host);
      EXPECT_EQ(changes, hosts.size() > 1 ? static_cast<int>(hosts.size()) : 0)
          << "trial " << trial;
    }
  }
}

// ---- the socket plug-in on loopback ----

NetInterface loopback() {
  return {"lo", SocketAddress::fromNumeric("127.0.0.1", 0, "test")};
}

Clock::time_point in(std::chrono::milliseconds ms) {
  return Clock::now() + ms;
}

// Calls `step` until it returns true; false if it never did within `limit`.
template <typename Step>
bool keepTrying(Step step, std::chrono::milliseconds limit = 20s) {
  const Clock::time_point deadline = in(limit);
  while (Clock::now() < deadline) {
    if (step()) return true;
    std::this_thread::sleep_for(100us);
  }
  return false;
}

struct Pair {
  std::unique_ptr<Net> net;
  std::unique_ptr<ListenComm> listener;
  Handle handle;
  std::unique_ptr<SendComm> send;
  std::unique_ptr<RecvComm> recv;
};

Pair connectedPair(std::unique_ptr<Net> net) {
  Pair p;
  p.net = std::move(net);
  p.listener = p.net->listen(0, &p.handle);
  p.send = p.net->connect(0, p.handle, 7, in(10s));
  uint32_t tag = 0;
  p.recv = p.net->accept(*p.listener, &tag, in(10s));
  EXPECT_EQ(tag, 7u);
  return p;
}

Pair connectedPair(int sockets) {
  return connectedPair(makeSocketNet({loopback()}, {sockets, 5000}));
}

#ifdef BRAID_HAVE_UCX
Pair ucxPair() {
  return connectedPair(makeUcxNet({loopback()}, 5000));
}
#endif

std::vector<uint8_t> randomBytes(size_t n, uint32_t seed) {
  std::mt19937 random(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(random());
  return v;
}

TEST(SocketNet, DescribesItsDevice) {
  std::unique_ptr<Net> net = makeSocketNet({loopback()}, {1, 5000});
  ASSERT_EQ(net->deviceCount(), 1);
  const DeviceProperties p = net->properties(0);
  EXPECT_EQ(p.name, "lo");
  EXPECT_EQ(p.address, "127.0.0.1");
  EXPECT_TRUE(p.pciPath.empty());  // loopback is no PCI function
  EXPECT_THROW(net->properties(1), Error);
}

TEST(SocketNet, RefusesSocketCountsOutOfRange) {
  for (int sockets : {0, kMaxSockets + 1}) {
    try {
      makeSocketNet({loopback()}, {sockets, 5000});
      ADD_FAILURE() << sockets << " sockets were accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), braidInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("BRAID_NSOCKS"), std::string::npos) << e.what();
    }
  }
}

// Messages of every shape, many in flight: the bytes arrive intact and in posting order. With
// `registered`, from and into memory the plug-in registered. `gathered`: each message is sent as a
// head of up to 64 bytes (in a buffer with room for the whole message, as a FIFO slot has) and a
// body elsewhere (isendGather). Each size of `sizes` three times over.
const std::vector<size_t> kMessageSizes = {
    0, 1,      4095, wire::kMinPartBytes, 100000, (1u << 20) + 5, 17, 3 * wire::kMinPartBytes + 1,
    0, 777777, 65536};
void expectMessagesMoveIntact(Pair& p, bool registered = false, bool gathered = false,
                              const std::vector<size_t>& sizes = kMessageSizes) {
  const size_t capacity = 1u << 21;
  {
    std::vector<std::vector<uint8_t>> out, in, heads;
    std::vector<std::unique_ptr<MemoryRegion>> regions;
    for (size_t i = 0; i < 3 * sizes.size(); ++i) {
      out.push_back(randomBytes(sizes[i % sizes.size()], static_cast<uint32_t>(i)));
      in.emplace_back(capacity, 0);
      heads.emplace_back(out.back().size() + 1, 0xA5);
      if (registered && !out.back().empty()) {
        regions.push_back(p.send->registerMemory(out.back().data(), out.back().size()));
        regions.push_back(p.recv->registerMemory(in.back().data(), capacity));
      }
    }
    auto regionOf = [&](size_t message, int side) -> MemoryRegion* {
      if (!registered || out[message].empty()) return nullptr;
      size_t index = 0;
      for (size_t i = 0; i < message; ++i) index += out[i].empty() ? 0 : 2;
      return regions[index + side].get();
    };
    size_t sent = 0, received = 0, sendPosted = 0, recvPosted = 0;
    std::vector<Request*> sendRequests(out.size()), recvRequests(out.size());
    const bool finished = keepTrying([&] {
      while (sendPosted < out.size() && sendPosted - sent < 5) {
        const std::vector<uint8_t>& message = out[sendPosted];
        Request* r = nullptr;
        if (gathered) {
          const size_t headBytes = std::min<size_t>(64, message.size());
          std::copy_n(message.begin(), headBytes, heads[sendPosted].begin());
          r = p.send->isendGather(heads[sendPosted].data(), headBytes, message.data() + headBytes,
                                  message.size() - headBytes, nullptr);
        } else {
          r = p.send->isend(message.data(), message.size(), regionOf(sendPosted, 0));
        }
        if (r == nullptr) break;
        sendRequests[sendPosted++] = r;
      }
      while (recvPosted < in.size() && recvPosted - received < 4) {
        Request* r = p.recv->irecv(in[recvPosted].data(), capacity, regionOf(recvPosted, 1));
        if (r == nullptr) break;
        recvRequests[recvPosted++] = r;
      }
      size_t bytes = 0;
      while (sent < sendPosted && p.send->test(sendRequests[sent], &bytes)) {
        EXPECT_EQ(bytes, out[sent].size());
        ++sent;
      }
      while (received < recvPosted && p.recv->test(recvRequests[received], &bytes)) {
        EXPECT_EQ(bytes, out[received].size()) << "message " << received;
        in[received].resize(bytes);
        ++received;
      }
      return received == out.size() && sent == out.size();
    });
    ASSERT_TRUE(finished) << "sent " << sent << ", received " << received << " of " << out.size();
    for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(in[i], out[i]) << "message " << i;
  }
}

// Over 1 and 3 sockets, whatever socket carried each part.
TEST(SocketNet, MovesMessagesIntactOverSeveralSockets) {
  for (int sockets : {1, 3}) {
    SCOPED_TRACE(testing::Message() << sockets << " sockets");
    Pair p = connectedPair(sockets);
    expectMessagesMoveIntact(p);
  }
}

// A message from two places arrives whole, also when its parts over several sockets begin in the
// head and end in the body.
TEST(SocketNet, MovesGatheredMessagesIntactOverSeveralSockets) {
  for (int sockets : {1, 3}) {
    SCOPED_TRACE(testing::Message() << sockets << " sockets");
    Pair p = connectedPair(sockets);
    expectMessagesMoveIntact(p, false, /*gathered=*/true);
  }
}

#ifdef BRAID_HAVE_UCX
TEST(UcxNet, MovesMessagesIntactFromAndIntoRegisteredMemory) {
  for (bool registered : {false, true}) {
    SCOPED_TRACE(registered ? "registered" : "not registered");
    Pair p = ucxPair();
    expectMessagesMoveIntact(p, registered);
  }
}

TEST(UcxNet, MovesGatheredMessagesIntact) {
  Pair p = ucxPair();
  expectMessagesMoveIntact(p, false, /*gathered=*/true);
}
#endif

// A sender that ends its stream before closing has departed; one that just closes is lost.
void expectACloseIsADepartureOnlyAfterTheEndOfTheStream(const std::function<Pair()>& makePair) {
  for (bool ended : {true, false}) {
    SCOPED_TRACE(ended ? "ended, then closed" : "closed");
    Pair p = makePair();
    std::vector<uint8_t> buffer(100);
    Request* request = p.recv->irecv(buffer.data(), buffer.size(), nullptr);
    if (ended) p.send->end();
    p.send.reset();
    std::string error;
    const bool finished = keepTrying(
        [&] {
          try {
            size_t bytes = 0;
            return p.recv->test(request, &bytes);
          } catch (const Error& e) {
            error = e.what();
            return true;
          }
        },
        1s);
    if (ended) {
      EXPECT_FALSE(finished) << error;  // nothing arrives, and nothing is wrong
      std::vector<pollfd> fds;
      p.recv->pollDescriptors(fds);
      EXPECT_TRUE(fds.empty()) << "ended sockets are not worth waiting for";
    } else {
      EXPECT_NE(error.find("closed the connection"), std::string::npos) << error;
    }
  }
}

TEST(SocketNet, ACloseIsADepartureOnlyAfterTheEndOfTheStream) {
  expectACloseIsADepartureOnlyAfterTheEndOfTheStream([] { return connectedPair(3); });
}

#ifdef BRAID_HAVE_UCX
TEST(UcxNet, ACloseIsADepartureOnlyAfterTheEndOfTheStream) {
  expectACloseIsADepartureOnlyAfterTheEndOfTheStream(ucxPair);
}
#endif

// A sender whose rank failed says why before it closes: the receiver fails quoting the reason
// (at most kMaxReasonBytes of it), not with a lost peer.
void expectAnAbortTellsTheReceiverWhyTheRankFailed(const std::function<Pair()>& makePair) {
  const std::string reason =
      "rank 7: all-reduce #4 timed out after 1000 ms waiting for data from rank 0";
  for (const std::string& sent : {reason, reason + std::string(kMaxReasonBytes, '.')}) {
    SCOPED_TRACE(std::to_string(sent.size()) + "-byte reason");
    Pair p = makePair();
    std::vector<uint8_t> buffer(100);
    Request* request = p.recv->irecv(buffer.data(), buffer.size(), nullptr);
    p.send->abort(sent);
    p.send.reset();
    std::string error;
    const bool failed = keepTrying(
        [&] {
          try {
            size_t bytes = 0;
            return p.recv->test(request, &bytes);
          } catch (const Error& e) {
            EXPECT_EQ(e.code(), braidRemoteError);
            error = e.what();
            return true;
          }
        },
        5s);
    ASSERT_TRUE(failed) << "the receiver never heard";
    EXPECT_TRUE(error.ends_with("the peer's rank failed: " + sent.substr(0, kMaxReasonBytes)))
        << error;
  }
}

TEST(SocketNet, AnAbortTellsTheReceiverWhyTheRankFailed) {
  expectAnAbortTellsTheReceiverWhyTheRankFailed([] { return connectedPair(3); });
}

#ifdef BRAID_HAVE_UCX
TEST(UcxNet, AnAbortTellsTheReceiverWhyTheRankFailed) {
  expectAnAbortTellsTheReceiverWhyTheRankFailed(ucxPair);
}

// A message larger than the posted buffer is an error naming the peer, never a write past it.
TEST(UcxNet, OversizedMessageIsAnErrorNotAnOverflow) {
  Pair p = ucxPair();
  std::vector<uint8_t> out(5000, 1), in(4096 + 64, 0xAB);
  Request* sent = p.send->isend(out.data(), out.size(), nullptr);
  Request* received = p.recv->irecv(in.data(), 4096, nullptr);
  std::string error;
  keepTrying([&] {
    try {
      size_t bytes = 0;
      p.send->test(sent, &bytes);
      return p.recv->test(received, &bytes);
    } catch (const Error& e) {
      error = e.what();
      return true;
    }
  });
  EXPECT_NE(error.find("oversized"), std::string::npos) << error;
  EXPECT_NE(error.find("127.0.0.1"), std::string::npos) << error;
  for (size_t i = 4096; i < in.size(); ++i) ASSERT_EQ(in[i], 0xAB) << "written past the buffer";
}

// A connection that does not carry the listener's token is dropped; the next one is accepted.
TEST(UcxNet, ListenerDropsConnectionsWithoutTheToken) {
  std::unique_ptr<Net> net = makeUcxNet({loopback()}, 5000);
  Handle handle;
  std::unique_ptr<ListenComm> listener = net->listen(0, &handle);
  Handle forged = handle;
  forged.bytes[offsetof(wire::HandleContents, token)] ^= 1;
  std::unique_ptr<SendComm> stranger = net->connect(0, forged, 5, in(10s));
  uint32_t tag = 0;
  EXPECT_THROW(net->accept(*listener, &tag, in(1s)), Error);
  std::unique_ptr<SendComm> friendly = net->connect(0, handle, 6, in(10s));
  std::unique_ptr<RecvComm> accepted = net->accept(*listener, &tag, in(10s));
  EXPECT_EQ(tag, 6u);
}

TEST(UcxNet, DescribesItsDeviceAndRefusesOthers) {
  std::unique_ptr<Net> net = makeUcxNet({loopback()}, 5000);
  EXPECT_STREQ(net->name(), "UCX");
  EXPECT_EQ(net->properties(0).address, "127.0.0.1");
  EXPECT_THROW(net->properties(1), Error);
}
#endif

// A raw connection to a listener, speaking the wire format by hand.
class RawPeer {
 public:
  RawPeer(const Handle& handle, int sockets = 1) {
    std::memcpy(&contents_, handle.bytes, sizeof contents_);
    const SocketAddress address = SocketAddress::fromBytes(
        contents_.family == 4 ? AF_INET : AF_INET6, contents_.address, contents_.port);
    for (int i = 0; i < sockets; ++i)
      sockets_.push_back(Socket::connect(address, "listener", in(5s), "raw peer"));
  }

  Socket& socket(int i = 0) { return sockets_[i]; }
  std::string localAddress() const { return sockets_[0].localAddress().toString(); }

  void send(const void* data, size_t bytes, int socket = 0) {
    sockets_[socket].sendAll(data, bytes, in(5s), "raw peer");
  }
  // The hello that proves the handle (or, with `token` changed, fails to).
  void hello(uint32_t tag, const uint8_t* token = nullptr) {
    for (size_t i = 0; i < sockets_.size(); ++i) {
      wire::Hello h;
      std::memcpy(h.token, token ? token : contents_.token, sizeof h.token);
      h.tag = tag;
      h.connection = 42;
      h.socket = static_cast<uint16_t>(i);
      h.sockets = static_cast<uint16_t>(sockets_.size());
      send(&h, sizeof h, static_cast<int>(i));
    }
  }
  void frame(uint64_t seq, uint64_t messageBytes, uint64_t offset, uint64_t bytes,
             uint32_t magic = wire::kFrameMagic, int socket = 0) {
    wire::FrameHeader h;
    h.magic = magic;
    h.seq = seq;
    h.messageBytes = messageBytes;
    h.offset = offset;
    h.bytes = bytes;
    send(&h, sizeof h, socket);
  }
  // True once the other side has closed this socket (EOF), false if it is still open at `limit`.
  bool closedByListener(int socket = 0) {
    return keepTrying([&] {
      char byte;
      return sockets_[socket].readSome(&byte, 1) == 0;
    });
  }

 private:
  wire::HandleContents contents_;
  std::vector<Socket> sockets_;
};

TEST(SocketNet, ListenerDropsConnectionsWithoutTheToken) {
  std::unique_ptr<Net> net = makeSocketNet({loopback()}, {2, 5000});
  Handle handle;
  std::unique_ptr<ListenComm> listener = net->listen(0, &handle);

  RawPeer wrongToken(handle);
  uint8_t token[wire::kTokenBytes] = {1, 2, 3};
  wrongToken.hello(3, token);
  RawPeer garbage(handle);
  const std::vector<uint8_t> junk = randomBytes(sizeof(wire::Hello), 99);
  garbage.send(junk.data(), junk.size());
  RawPeer halfHello(handle);
  halfHello.send(junk.data(), 10);
  halfHello.socket() = Socket();  // closes after 10 bytes

  std::unique_ptr<SendComm> legit = net->connect(0, handle, 5, in(10s));
  uint32_t tag = 0;
  std::unique_ptr<RecvComm> accepted = net->accept(*listener, &tag, in(10s));
  ASSERT_NE(accepted, nullptr);
  EXPECT_EQ(tag, 5u);
  // Accepting again finds nothing more: the strangers were dropped, not queued.
  try {
    net->accept(*listener, &tag, in(300ms));
    ADD_FAILURE() << "a stranger was accepted with tag " << tag;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), braidTimeout) << e.what();
  }
  EXPECT_TRUE(wrongToken.closedByListener());
  EXPECT_TRUE(garbage.closedByListener());
}

TEST(SocketNet, ListenerDropsHellosThatDoNotFitAConnection) {
  std::unique_ptr<Net> net = makeSocketNet({loopback()}, {1, 5000});
  Handle handle;
  std::unique_ptr<ListenComm> listener = net->listen(0, &handle);
  wire::HandleContents contents;
  std::memcpy(&contents, handle.bytes, sizeof contents);
  // Too many sockets, and an even count (a connection is one shared socket and as many for each
  // direction).
  for (uint16_t sockets : {uint16_t{wire::kMaxConnectionSockets + 2}, uint16_t{2}}) {
    RawPeer misfit(handle);
    wire::Hello h;
    std::memcpy(h.token, contents.token, sizeof h.token);
    h.socket = 0;
    h.sockets = sockets;
    misfit.send(&h, sizeof h);
    uint32_t tag = 0;
    EXPECT_THROW(net->accept(*listener, &tag, in(300ms)), Error);
    EXPECT_TRUE(misfit.closedByListener()) << "a connection of " << h.sockets << " sockets";
  }
}

// A receiving comm fed by a raw peer, with a poisoned buffer posted.
struct RawSender {
  std::unique_ptr<Net> net = makeSocketNet({loopback()}, {1, 5000});
  Handle handle;
  std::unique_ptr<ListenComm> listener = net->listen(0, &handle);
  RawPeer peer;
  std::unique_ptr<RecvComm> recv;
  std::vector<uint8_t> buffer = std::vector<uint8_t>(4096, 0xa5);
  Request* request = nullptr;

  // A connection of `sockets`: the shared one, then each direction's.
  explicit RawSender(int sockets = 1) : peer(handle, sockets) {
    peer.hello(1);
    uint32_t tag = 0;
    recv = net->accept(*listener, &tag, in(10s));
    request = recv->irecv(buffer.data(), buffer.size(), nullptr);
  }

  // The error test() ends with, or "" if it completed or kept waiting.
  std::string errorOfTest() {
    std::string error;
    keepTrying(
        [&] {
          try {
            size_t bytes = 0;
            return recv->test(request, &bytes);
          } catch (const Error& e) {
            EXPECT_EQ(e.code(), braidRemoteError);
            error = e.what();
            return true;
          }
        },
        5s);
    return error;
  }
  bool bufferUntouched() const {
    return std::all_of(buffer.begin(), buffer.end(), [](uint8_t b) { return b == 0xa5; });
  }
};

TEST(SocketNet, TruncatedFrameIsAnErrorNamingThePeer) {
  RawSender s;
  s.peer.frame(0, 1000, 0, 1000);
  const std::vector<uint8_t> part = randomBytes(10, 1);
  s.peer.send(part.data(), part.size());
  const std::string address = s.peer.localAddress();
  s.peer.socket() = Socket();
  const std::string error = s.errorOfTest();
  EXPECT_NE(error.find("truncated"), std::string::npos) << error;
  EXPECT_NE(error.find("10 of 1000 payload bytes"), std::string::npos) << error;
  EXPECT_NE(error.find(address), std::string::npos) << error;
}

TEST(SocketNet, TruncatedHeaderIsAnError) {
  RawSender s;
  s.peer.send("abc", 3);
  s.peer.socket() = Socket();
  EXPECT_NE(s.errorOfTest().find("3 of 40 header bytes"), std::string::npos);
}

TEST(SocketNet, OversizedFrameIsRefusedBeforeItsPayload) {
  for (uint64_t announced : {uint64_t{4097}, uint64_t{1} << 62}) {
    RawSender s;
    s.peer.frame(0, announced, 0, announced);
    const std::vector<uint8_t> payload = randomBytes(4096, 2);
    s.peer.send(payload.data(), payload.size());
    const std::string error = s.errorOfTest();
    EXPECT_NE(error.find("oversized"), std::string::npos) << error;
    EXPECT_NE(error.find(std::to_string(announced) + " bytes"), std::string::npos) << error;
    EXPECT_TRUE(s.bufferUntouched());
  }
}

TEST(SocketNet, FrameWithBadMagicIsAnError) {
  RawSender s;
  s.peer.frame(0, 10, 0, 10, 0x12345678);
  EXPECT_NE(s.errorOfTest().find("bad magic 0x12345678"), std::string::npos);
  EXPECT_TRUE(s.bufferUntouched());
}

TEST(SocketNet, FrameWithTheWrongPartIsAnError) {
  RawSender s;
  s.peer.frame(0, 100, 50, 50);  // one socket carries whole messages
  const std::string error = s.errorOfTest();
  EXPECT_NE(error.find("malformed"), std::string::npos) << error;
  EXPECT_TRUE(s.bufferUntouched());
}

// A message comes whole on the shared socket or in parts on its direction's own, never both: a
// peer that sends it both ways is refused, not left waiting for bytes beyond the message.
TEST(SocketNet, AMessageOnTheSharedAndItsOwnSocketIsAnError) {
  RawSender s(wire::connectionSockets(1));
  const std::vector<uint8_t> payload(200, 7);
  s.peer.frame(0, 200, 0, 200, wire::kFrameMagic, 1);
  s.peer.send(payload.data(), 50, 1);  // the rest never comes
  size_t bytes = 0;
  EXPECT_FALSE(keepTrying([&] { return s.recv->test(s.request, &bytes); }, 200ms));
  s.peer.frame(0, 200, 0, 200, wire::kFrameMagic, 0);
  s.peer.send(payload.data(), payload.size(), 0);
  const std::string error = s.errorOfTest();
  EXPECT_NE(error.find("both on the shared socket and in parts"), std::string::npos) << error;
}

TEST(SocketNet, FramesOutOfOrderAreAnError) {
  RawSender s;
  s.peer.frame(0, 4, 0, 4);
  s.peer.send("abcd", 4);
  size_t bytes = 0;
  ASSERT_TRUE(keepTrying([&] { return s.recv->test(s.request, &bytes); }));
  EXPECT_EQ(bytes, 4u);
  s.request = s.recv->irecv(s.buffer.data(), s.buffer.size(), nullptr);
  s.peer.frame(0, 4, 0, 4);  // message 0 again
  EXPECT_NE(s.errorOfTest().find("already complete"), std::string::npos);
}

// A failed rank's reason is read only up to its cap: a longer one is refused before its text, a
// cut one is a truncated frame; neither touches the posted buffer.
TEST(SocketNet, MalformedRankFailedFramesAreErrors) {
  const std::vector<uint8_t> text(kMaxReasonBytes + 1, 'x');
  for (uint64_t announced : {uint64_t{kMaxReasonBytes + 1}, uint64_t{1} << 62}) {
    RawSender s;
    wire::FrameHeader h;
    h.flags = wire::kRankFailed;
    h.bytes = announced;
    s.peer.send(&h, sizeof h);
    s.peer.send(text.data(), text.size());
    const std::string error = s.errorOfTest();
    EXPECT_NE(error.find(std::to_string(announced) + "-byte reason"), std::string::npos) << error;
    EXPECT_NE(error.find("malformed"), std::string::npos) << error;
    EXPECT_TRUE(s.bufferUntouched());
  }
  RawSender s;
  wire::FrameHeader h;
  h.flags = wire::kRankFailed;
  h.bytes = 100;
  s.peer.send(&h, sizeof h);
  s.peer.send(text.data(), 10);
  s.peer.socket() = Socket();
  const std::string error = s.errorOfTest();
  EXPECT_NE(error.find("10 of 100 payload bytes"), std::string::npos) << error;
  EXPECT_TRUE(s.bufferUntouched());
}

// A peer that never reads: the sender's kernel buffers fill, test() keeps answering "not yet"
// without blocking, and no more than kMaxRequests are ever taken.
TEST(SocketNet, SenderToAPeerThatNeverReadsStaysBounded) {
  std::unique_ptr<Net> net = makeSocketNet({loopback()}, {2, 5000});
  Handle handle;
  std::unique_ptr<ListenComm> listener = net->listen(0, &handle);
  std::unique_ptr<SendComm> send = net->connect(0, handle, 1, in(10s));
  uint32_t tag = 0;
  std::unique_ptr<RecvComm> neverTested = net->accept(*listener, &tag, in(10s));
  const std::vector<uint8_t> data(1 << 20, 7);
  std::vector<Request*> requests;
  for (int i = 0; i < kMaxRequests; ++i) {
    requests.push_back(send->isend(data.data(), data.size(), nullptr));
    ASSERT_NE(requests.back(), nullptr);
  }
  EXPECT_EQ(send->isend(data.data(), data.size(), nullptr), nullptr);
  size_t done = 0;
  for (int round = 0; round < 2000; ++round) {
    size_t bytes = 0;
    while (done < requests.size() && send->test(requests[done], &bytes)) ++done;
    std::this_thread::sleep_for(500us);
  }
  // 32 MiB is more than loopback's socket buffers hold.
  EXPECT_LT(done, requests.size());
  std::vector<pollfd> fds;
  send->pollDescriptors(fds);
  EXPECT_FALSE(fds.empty()) << "a blocked sender must give the proxy a socket to wait on";
}

// A receiver that is alive but reads nothing for longer than the keepalive time (a slow rank, a
// rank computing) is no failure: its kernel still answers, so the sender waits, then finishes.
// (A TCP_USER_TIMEOUT would end it: since Linux 5.11 it also ends a zero window that lasts.)
TEST(SocketNet, SenderToAReceiverThatPausesLongerThanKeepaliveFinishes) {
  constexpr int kKeepaliveMs = 1000;
  std::unique_ptr<Net> net = makeSocketNet({loopback()}, {1, kKeepaliveMs});
  Handle handle;
  std::unique_ptr<ListenComm> listener = net->listen(0, &handle);
  std::unique_ptr<SendComm> send = net->connect(0, handle, 1, in(10s));
  uint32_t tag = 0;
  std::unique_ptr<RecvComm> recv = net->accept(*listener, &tag, in(10s));
  // 16 MiB: more than loopback's socket buffers hold, so the window closes.
  const std::vector<uint8_t> data = randomBytes(1 << 20, 5);
  std::vector<Request*> sends;
  for (int i = 0; i < 16; ++i) sends.push_back(send->isend(data.data(), data.size(), nullptr));
  size_t sent = 0, bytes = 0;
  const auto pauseEnd = Clock::now() + std::chrono::milliseconds(kKeepaliveMs * 5 / 2);
  while (Clock::now() < pauseEnd) {
    while (sent < sends.size() && send->test(sends[sent], &bytes)) ++sent;
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_LT(sent, sends.size()) << "the receiver's buffers took everything: nothing was tested";
  std::vector<uint8_t> in(data.size());
  size_t received = 0;
  Request* receiving = nullptr;
  const bool finished = keepTrying([&] {
    while (sent < sends.size() && send->test(sends[sent], &bytes)) ++sent;
    if (receiving == nullptr && received < sends.size())
      receiving = recv->irecv(in.data(), in.size(), nullptr);
    if (receiving != nullptr && recv->test(receiving, &bytes)) {
      EXPECT_EQ(in, data) << "message " << received;
      ++received;
      receiving = nullptr;
    }
    return sent == sends.size() && received == sends.size();
  });
  EXPECT_TRUE(finished) << "sent " << sent << ", received " << received;
}

// Sockets carry frames both ways: the receiver answers over the sender's connection, and each
// direction's messages arrive intact while the other's flow; no second connection is made.
void expectTheOtherDirectionSharesTheConnection(Pair forward) {
  ASSERT_TRUE(forward.net->connectionsCarryBothWays());
  Pair back;
  back.send = forward.net->sendBack(*forward.recv);
  back.recv = forward.net->receiveBack(*forward.send);
  ASSERT_NE(back.send, nullptr);
  ASSERT_NE(back.recv, nullptr);
  expectMessagesMoveIntact(back);
  expectMessagesMoveIntact(forward);
  uint32_t tag = 0;
  EXPECT_EQ(forward.net->acceptReady(*forward.listener, &tag), nullptr);
}

TEST(SocketNet, TheOtherDirectionSharesTheConnection) {
  expectTheOtherDirectionSharesTheConnection(connectedPair(2));
}

// ---- the proxy ----

// Threads of this process with the progress thread's name.
int progressThreads() {
  int count = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::string name;
    std::ifstream(task.path() / "comm") >> name;
    count += name == "braid-proxy";
  }
  return count;
}

// Two proxies on one NIC (two ranks, or two communicators, of a process) share its thread.
void expectProxiesMoveFifoSlotsInOrderWithTheirSizes(Pair ab, Pair ba) {
  const FifoGeometry geometry{4096, 4};
  Proxy a(0, geometry), b(1, geometry);
  const Proxy::Fifos fa = a.addPeer(1, std::move(ab.send), std::move(ba.recv));
  const Proxy::Fifos fb = b.addPeer(0, std::move(ba.send), std::move(ab.recv));
  a.start("lo");
  b.start("lo");
  EXPECT_EQ(progressThreads(), 1);
  SendConnector toB(fa.send, 0, 1);
  RecvConnector fromA(fb.recv, 1, 0);
  struct Deadline : Watchdog {
    Clock::time_point at = in(20s);
    void poll(int peer, const char* what) override {
      if (Clock::now() > at) fail(braidTimeout, "waiting for {} from rank {}", what, peer);
    }
  } dog;
  // Sizes up to a full slot's payload; each slot's header travels with it. Every third payload
  // is named where it lies (postFrom), and poisoned as soon as the proxy has sent it.
  const uint32_t maxWords = static_cast<uint32_t>(toB.slotBytes() / 4);
  ASSERT_TRUE(toB.postsFromPlace());
  std::thread producer([&] {
    std::vector<uint32_t> lying(maxWords);
    for (uint32_t i = 0; i < 1000; ++i) {
      const CallTag tag{.sequence = i, .count = i % maxWords + 1};
      if (i % 3 == 1) {
        for (uint32_t k = 0; k <= i % maxWords; ++k) lying[k] = i * 7919 + k;
        toB.postFrom(lying.data(), (i % maxWords + 1) * 4, tag, dog);
        toB.awaitTaken(toB.posted(), dog);
        std::fill(lying.begin(), lying.end(), 0xDEADBEEF);
        continue;
      }
      auto* slot = static_cast<uint32_t*>(toB.acquire(dog));
      for (uint32_t k = 0; k <= i % maxWords; ++k) slot[k] = i * 7919 + k;
      toB.post((i % maxWords + 1) * 4, tag);
    }
  });
  for (uint32_t i = 0; i < 1000; ++i) {
    const SlotHeader& header = fromA.wait(dog);
    ASSERT_EQ(header.tag.sequence, i);
    ASSERT_EQ(header.tag.count, i % maxWords + 1);
    ASSERT_EQ(header.payloadBytes, (i % maxWords + 1) * 4);
    const auto* slot = reinterpret_cast<const uint32_t*>(&header + 1);
    for (uint32_t k = 0; k <= i % maxWords; ++k) ASSERT_EQ(slot[k], i * 7919 + k) << i << " " << k;
    fromA.release();
  }
  producer.join();
  EXPECT_EQ(a.failure(1), std::nullopt);
  EXPECT_EQ(b.failure(0), std::nullopt);
}

TEST(NetProxy, MovesFifoSlotsInOrderWithTheirSizes) {
  expectProxiesMoveFifoSlotsInOrderWithTheirSizes(connectedPair(2), connectedPair(2));
}

#ifdef BRAID_HAVE_UCX
TEST(NetProxy, MovesFifoSlotsOverUcx) {
  expectProxiesMoveFifoSlotsInOrderWithTheirSizes(ucxPair(), ucxPair());
}
#endif

// The registry's net transport for a set of device FIFOs: it connects the hops another transport
// of the set asked for (p2p: per channel, protocol and tree), each FIFO cut as asked and placed
// in the asker's memory, under one proxy; here two ranks as threads on two "hosts", the asker's
// memory the heap.
TEST(NetTransport, ConnectsTheHopsAnotherTransportOfTheSetAsksFor) {
  std::vector<PeerInfo> peers(2);
  for (int r = 0; r < 2; ++r) {
    peers[r].rank = r;
    peers[r].hostHash = peers[r].machineHash = 50 + static_cast<uint64_t>(r);
    peers[r].pid = 1;
  }
  std::barrier<> meet(2);
  std::vector<char> exchange;
  auto rendezvousOf = [&](int rank) {
    auto allGather = [&, rank](void* data, size_t bytes) {
      meet.arrive_and_wait();
      if (rank == 0) exchange.assign(2 * bytes, 0);
      meet.arrive_and_wait();
      std::memcpy(exchange.data() + rank * bytes, static_cast<char*>(data) + rank * bytes, bytes);
      meet.arrive_and_wait();
      std::memcpy(data, exchange.data(), 2 * bytes);
      meet.arrive_and_wait();
    };
    return Rendezvous{[&] { meet.arrive_and_wait(); }, allGather, in(20s)};
  };
  const FifoGeometry simple{4096 + 64, 4}, lines{8192, 2};
  struct Attached {
    FifoDesc send, recv;
  };
  std::vector<std::vector<Attached>> attached(2, std::vector<Attached>(2));
  std::atomic<int> allocations{0};
  std::vector<PeerLinks> links(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      links[r].send.resize(2);  // as connectPeers lays them out
      links[r].recv.resize(2);
      const Rendezvous rendezvous = rendezvousOf(r);
      NetworkHops hops;
      hops.hops = {{1 - r, 0, simple, false}, {1 - r, 9, lines, true}};
      hops.allocate = [&](size_t bytes) {
        ++allocations;
        return allocateZeroed(bytes);
      };
      hops.attach = [&, r](size_t hop, const FifoDesc& send, const FifoDesc& recv) {
        attached[r][hop] = {send, recv};
      };
      ConnectState state{peers,   r, LinkKind::DeviceFifos, {}, nullptr, rendezvous, links[r], 0, 0,
                         nullptr, {}};
      state.networkHops = &hops;
      std::unique_ptr<TransportSetup> setup = netTransport()->setup(state, {1 - r});
      setup->publish(state);
      rendezvous.barrier();
      setup->connect(state);
      rendezvous.barrier();
      setup->connected(state);
    });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(allocations.load(), 2 * 2);  // a hop's two FIFOs in one block, per hop and rank
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(links[r].services.size(), 1u) << "one proxy serves every hop";
    EXPECT_EQ(links[r].send[1 - r].peer(), -1) << "no host FIFO beside the hops";
    for (int hop = 0; hop < 2; ++hop)
      for (const FifoDesc& fifo : {attached[r][hop].send, attached[r][hop].recv}) {
        ASSERT_NE(fifo.control, nullptr) << "rank " << r << " hop " << hop;
        EXPECT_EQ(fifo.slotBytes, (hop == 0 ? simple : lines).slotBytes);
        EXPECT_EQ(fifo.nSlots, (hop == 0 ? simple : lines).nSlots);
      }
  }
  struct Deadline : Watchdog {
    Clock::time_point at = in(20s);
    void poll(int peer, const char* what) override {
      if (Clock::now() > at) fail(braidTimeout, "waiting for {} from rank {}", what, peer);
    }
  } dog;
  // A slot each way on the Simple hop, moved by the proxy alone (no rank drives it).
  for (int from = 0; from < 2; ++from) {
    SendConnector send(attached[from][0].send, from, 1 - from);
    RecvConnector recv(attached[1 - from][0].recv, 1 - from, from);
    *static_cast<int*>(send.acquire(dog)) = 70 + from;
    send.post(sizeof(int), CallTag{.sequence = 3});
    const SlotHeader& header = recv.wait(dog);
    EXPECT_EQ(header.tag.sequence, 3u);
    EXPECT_EQ(*reinterpret_cast<const int*>(&header + 1), 70 + from);
    recv.release();
  }
  for (int r = 0; r < 2; ++r) EXPECT_EQ(links[r].services[0]->failure(-1), std::nullopt);
}

// A rank that fails tells its peers on other hosts why: their proxies record the reason under its
// rank. Its own links then move no more, which is no failure of theirs to report.
void expectAbandonTellsThePeersWhyTheRankFailed(Pair ab, Pair ba) {
  const FifoGeometry geometry{4096, 4};
  Proxy a(3, geometry), b(0, geometry);
  a.addPeer(0, std::move(ab.send), std::move(ba.recv));
  b.addPeer(3, std::move(ba.send), std::move(ab.recv));
  a.start("lo");
  b.start("lo");
  const std::string reason =
      "rank 3: all-reduce #4 timed out after 1000 ms waiting for data from rank 0";
  a.abandon(reason);
  ASSERT_TRUE(keepTrying([&] { return b.failure(3).has_value(); }));
  const std::string failure = *b.failure(3);
  EXPECT_EQ(failure.rfind("the connection with rank 3 failed: ", 0), 0u) << failure;
  EXPECT_TRUE(failure.ends_with("the peer's rank failed: " + reason)) << failure;
  EXPECT_EQ(a.failure(0), std::nullopt);
}

TEST(NetProxy, AbandonTellsThePeersWhyTheRankFailed) {
  expectAbandonTellsThePeersWhyTheRankFailed(connectedPair(1), connectedPair(1));
}

#ifdef BRAID_HAVE_UCX
TEST(NetProxy, AbandonTellsThePeersWhyTheRankFailedOverUcx) {
  expectAbandonTellsThePeersWhyTheRankFailed(ucxPair(), ucxPair());
}
#endif

// This process's connected TCP endpoints, by local and peer address, with the bytes each has
// received.
std::map<std::pair<std::string, std::string>, uint64_t> receivedByEndpoint() {
  std::map<std::pair<std::string, std::string>, uint64_t> received;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::atoi(entry.path().filename().c_str());
    sockaddr_storage local{}, peer{};
    socklen_t localLength = sizeof local, peerLength = sizeof peer;
    tcp_info info{};
    socklen_t infoLength = sizeof info;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &localLength) != 0 ||
        getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peerLength) != 0 ||
        getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &infoLength) != 0)
      continue;
    received[{SocketAddress(reinterpret_cast<sockaddr*>(&local), localLength).toString(),
              SocketAddress(reinterpret_cast<sockaddr*>(&peer), peerLength).toString()}] =
        info.tcpi_bytes_received;
  }
  return received;
}

// TCP connections among this process's sockets: distinct pairs of connected endpoints.
int tcpConnections() {
  std::set<std::pair<std::string, std::string>> connections;
  for (const auto& [ends, bytes] : receivedByEndpoint())
    connections.insert(std::minmax(ends.first, ends.second));
  return static_cast<int>(connections.size());
}

#ifdef BRAID_HAVE_UCX
// Over TCP, messages that fit a segment (loopback's: 64 KiB less headers) share the connection
// both ways, and so does bulk; those in between take a lane of their own in each direction (a new
// TCP connection), and all arrive in order whatever endpoint carried them.
TEST(UcxNet, EachDirectionSendsMediumMessagesOverALaneOfItsOwn) {
  Pair forward = ucxPair();
  Pair back;
  back.send = forward.net->sendBack(*forward.recv);
  back.recv = forward.net->receiveBack(*forward.send);
  ASSERT_NE(back.send, nullptr);
  ASSERT_NE(back.recv, nullptr);
  const std::vector<size_t> shared = {0, 1, 4095, wire::kMinPartBytes, 100000, 1 << 20};
  const std::vector<size_t> mixed = {65536, 1, 65536, 100000, 65536, 0, 65536, 17};
  const int connections = tcpConnections();
  expectMessagesMoveIntact(back, false, false, shared);
  expectMessagesMoveIntact(forward, false, false, shared);
  EXPECT_EQ(tcpConnections(), connections);
  expectMessagesMoveIntact(back, false, false, mixed);
  const int withLaneBack = tcpConnections();
  EXPECT_GT(withLaneBack, connections);
  expectMessagesMoveIntact(forward, false, false, mixed);
  EXPECT_GT(tcpConnections(), withLaneBack);
  // Neither lane arrived at the listener as a connection.
  uint32_t tag = 0;
  EXPECT_EQ(forward.net->acceptReady(*forward.listener, &tag), nullptr);
}
#endif

// Ranks 0 and 1 on loopback, each a proxy that connects on first use (socket plug-in), started.
// `peerConnectionGrace`: how long rank 1 waits for rank 0's connection before making its own.
struct FirstUsePair {
  explicit FirstUsePair(std::chrono::milliseconds peerConnectionGrace, size_t slotBytes = 4096) {
    struct Side {
      std::unique_ptr<Net> net = makeSocketNet({loopback()}, {1, 5000});
      Handle handle;
      std::unique_ptr<ListenComm> listener = net->listen(0, &handle);
    } side[2];
    for (int rank = 0; rank < 2; ++rank) {
      proxies[rank] = std::make_unique<Proxy>(rank, FifoGeometry{slotBytes, 4});
      proxies[rank]->connectOnFirstUse({std::move(side[rank].net),
                                        std::move(side[rank].listener),
                                        {side[0].handle, side[1].handle},
                                        rank,
                                        5000ms,
                                        peerConnectionGrace});
      fifos[rank] = proxies[rank]->addPeer(1 - rank);
      proxies[rank]->start("lo");
    }
  }
  std::unique_ptr<Proxy> proxies[2];
  Proxy::Fifos fifos[2];
};

// Fails a wait that lasts 20 s.
struct TwentySeconds : Watchdog {
  Clock::time_point at = in(20s);
  void poll(int peer, const char* what) override {
    if (Clock::now() > at) fail(braidTimeout, "waiting for {} from rank {}", what, peer);
  }
};

// Two ranks that first send to each other at once, connecting on first use, end up with one
// connection carrying both directions: the lower rank's (the higher waits for it briefly). Its
// shared socket carries the messages that fit a segment both ways; a larger one goes on its
// direction's own socket, which carries nothing the other way.
TEST(NetProxy, RanksThatSendToEachOtherAtOnceShareOneConnection) {
  ASSERT_EQ(tcpConnections(), 0);
  // Long grace: a loaded machine must not make this a race. Slots for messages larger than a
  // segment on loopback (64 KiB).
  constexpr size_t kLarge = 200000;
  FirstUsePair pair(10s, kLarge + sizeof(SlotHeader));
  auto& [proxies, fifos] = pair;
  TwentySeconds dog;
  SendConnector to[2] = {{fifos[0].send, 0, 1}, {fifos[1].send, 1, 0}};
  RecvConnector from[2] = {{fifos[0].recv, 0, 1}, {fifos[1].recv, 1, 0}};
  // `messages` of `words` each way, numbered from `first`.
  auto exchange = [&](int rank, uint32_t first, uint32_t messages, size_t words) {
    for (uint32_t i = first; i < first + messages; ++i) {
      auto* out = static_cast<uint32_t*>(to[rank].acquire(dog));
      for (size_t k = 0; k < words; ++k) out[k] = 1000 * rank + i + static_cast<uint32_t>(k);
      to[rank].post(words * 4, CallTag{.sequence = i, .count = words});
      const SlotHeader& header = from[rank].wait(dog);
      EXPECT_EQ(header.tag.sequence, i);
      ASSERT_EQ(header.payloadBytes, words * 4);
      const auto* in = reinterpret_cast<const uint32_t*>(&header + 1);
      for (size_t k = 0; k < words; ++k)
        ASSERT_EQ(in[k], 1000 * (1 - rank) + i + static_cast<uint32_t>(k)) << i << " " << k;
      from[rank].release();
    }
  };
  auto exchangeBothWays = [&](uint32_t first, uint32_t messages, size_t words) {
    std::thread other(exchange, 1, first, messages, words);
    exchange(0, first, messages, words);
    other.join();
  };
  exchangeBothWays(0, 50, 1);
  const auto small = receivedByEndpoint();
  exchangeBothWays(50, 10, kLarge / 4);
  const auto large = receivedByEndpoint();
  EXPECT_EQ(tcpConnections(), wire::connectionSockets(1));
  // Of the 6 ends, the shared socket's 2 received the small messages; the 2 that received the
  // large ones had received nothing (beyond their hello) before, and nothing else since.
  ASSERT_EQ(large.size(), 6u);
  int smallEnds = 0, largeEnds = 0;
  for (const auto& [end, bytes] : large) {
    const uint64_t before = small.at(end);
    if (before >= 50 * (sizeof(SlotHeader) + 4)) ++smallEnds;
    if (bytes - before >= 10 * kLarge) {
      ++largeEnds;
      EXPECT_LT(before, 1000u) << "a direction's own socket carried small messages";
    } else {
      EXPECT_LT(bytes - before, 10 * kLarge / 100) << "large messages went two ways";
    }
  }
  EXPECT_EQ(smallEnds, 2);
  EXPECT_EQ(largeEnds, 2);
  EXPECT_EQ(proxies[0]->failure(1), std::nullopt);
  EXPECT_EQ(proxies[1]->failure(0), std::nullopt);
}

// Rank 0 sends to rank 1, which never sends back, then leaves in good order: rank 0 reads its
// own connection for rank 1's messages (tentatively), and must see a departure there, not a lost
// peer.
TEST(NetProxy, APeerThatNeverSentBackDepartsWithoutFailingTheSender) {
  FirstUsePair pair(10ms);
  auto& [proxies, fifos] = pair;
  TwentySeconds dog;
  SendConnector toOne(fifos[0].send, 0, 1);
  RecvConnector fromZero(fifos[1].recv, 1, 0);
  *static_cast<uint32_t*>(toOne.acquire(dog)) = 42;
  toOne.post(4, CallTag{.sequence = 1, .count = 1});
  EXPECT_EQ(*reinterpret_cast<const uint32_t*>(&fromZero.wait(dog) + 1), 42u);
  fromZero.release();
  proxies[1]->finish(in(5s));
  proxies[1].reset();
  // Rank 0's proxy reads what came of rank 1 (the end of its stream) meanwhile.
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(proxies[0]->failure(1), std::nullopt) << *proxies[0]->failure(1);
}

TEST(NetProxy, RecordsABrokenConnectionNamingThePeerRank) {
  const FifoGeometry geometry{4096, 4};
  std::unique_ptr<Net> net = makeSocketNet({loopback()}, {1, 5000});
  Handle handle;
  std::unique_ptr<ListenComm> listener = net->listen(0, &handle);
  RawPeer peer(handle);
  peer.hello(3);
  uint32_t tag = 0;
  std::unique_ptr<RecvComm> recv = net->accept(*listener, &tag, in(10s));
  Pair unused = connectedPair(1);
  Proxy proxy(0, geometry);
  proxy.addPeer(3, std::move(unused.send), std::move(recv));
  proxy.start("lo");
  EXPECT_EQ(proxy.failure(3), std::nullopt);
  peer.frame(0, 100, 0, 100);
  peer.socket() = Socket();
  ASSERT_TRUE(keepTrying([&] { return proxy.failure(3).has_value(); }));
  const std::string failure = *proxy.failure(3);
  EXPECT_NE(failure.find("rank 3"), std::string::npos) << failure;
  EXPECT_NE(failure.find("truncated"), std::string::npos) << failure;
  EXPECT_EQ(proxy.failure(-1), proxy.failure(3));  // any peer's failure serves a wait on several
}

}  // namespace
}  // namespace braid::net
