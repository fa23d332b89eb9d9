// NCCL net plug-ins through braid's loader (transport/net/nccl_plugin_net.h), on loopback: braid's
// socket transport built as one (libnccl-net-braid.so) describes its device and moves messages
// both ways through the v8 ABI, and every accepted connection names the tag it was opened with.
// Loading fails with a sentence naming BRAID_NET_PLUGIN and the file: no such file, a library
// without ncclNetPlugin_v8, a plug-in whose init() fails and one without a device
// (fake_nccl_net.cc).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "transport/net/nccl_plugin_net.h"

namespace braid::net {
namespace {

using namespace std::chrono_literals;

// The plug-in reads BRAID_SOCKET_IFNAME once, at its first init() in the process.
class NcclPlugin : public testing::Test {
 protected:
  static void SetUpTestSuite() { setenv("BRAID_SOCKET_IFNAME", "lo", 1); }
};

Clock::time_point in(std::chrono::milliseconds ms) {
  return Clock::now() + ms;
}

std::vector<uint8_t> randomBytes(size_t n, uint32_t seed) {
  std::mt19937 random(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(random());
  return v;
}

// The loader's error for `nameOrPath`, or "" if it loaded.
std::string loadError(const std::string& nameOrPath) {
  try {
    loadNcclNetPlugin(nameOrPath);
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

// Messages through one connection, several in flight, each into a buffer of `capacity` bytes.
struct Stream {
  Stream(SendComm* send, RecvComm* recv, size_t capacity)
      : send(send), recv(recv), capacity(capacity) {}

  SendComm* send;
  RecvComm* recv;
  size_t capacity;
  std::vector<std::vector<uint8_t>> out;

  std::vector<std::vector<uint8_t>> in;
  std::vector<std::unique_ptr<MemoryRegion>> sendRegions, recvRegions;
  std::vector<Request*> sendRequests, recvRequests;
  size_t sendPosted = 0, sent = 0, recvPosted = 0, received = 0;

  void registerBuffers() {
    in.assign(out.size(), std::vector<uint8_t>(capacity));
    sendRequests.resize(out.size());
    recvRequests.resize(out.size());
    for (size_t i = 0; i < out.size(); ++i) {
      sendRegions.push_back(send->registerMemory(out[i].data(), out[i].size()));
      recvRegions.push_back(recv->registerMemory(in[i].data(), capacity));
    }
  }

  // Posts and tests what it can without waiting; true once every message arrived.
  bool step() {
    while (sendPosted < out.size() && sendPosted - sent < 5) {
      Request* r = send->isend(out[sendPosted].data(), out[sendPosted].size(),
                               sendRegions[sendPosted].get());
      if (r == nullptr) break;
      sendRequests[sendPosted++] = r;
    }
    while (recvPosted < in.size() && recvPosted - received < 4) {
      Request* r = recv->irecv(in[recvPosted].data(), capacity, recvRegions[recvPosted].get());
      if (r == nullptr) break;
      recvRequests[recvPosted++] = r;
    }
    size_t bytes = 0;
    while (sent < sendPosted && send->test(sendRequests[sent], &bytes)) {
      EXPECT_EQ(bytes, out[sent].size());
      ++sent;
    }
    while (received < recvPosted && recv->test(recvRequests[received], &bytes)) {
      in[received].resize(bytes);
      ++received;
    }
    return sent == out.size() && received == out.size();
  }
};

// Steps every stream until all are done; false if that takes longer than `limit`.
bool runStreams(std::vector<Stream*> streams, std::chrono::milliseconds limit = 20s) {
  for (Stream* s : streams) s->registerBuffers();
  const Clock::time_point deadline = in(limit);
  while (Clock::now() < deadline) {
    bool all = true;
    for (Stream* s : streams) all &= s->step();
    if (all) return true;
    std::this_thread::sleep_for(100us);
  }
  return false;
}

TEST_F(NcclPlugin, BraidsSocketPluginDescribesItsDevice) {
  const std::unique_ptr<Net> net = loadNcclNetPlugin(BRAID_PLUGIN_PATH);
  EXPECT_STREQ(net->name(), "Braid");
  ASSERT_GE(net->deviceCount(), 1);
  const DeviceProperties p = net->properties(0);
  EXPECT_EQ(p.name, "lo");
  EXPECT_TRUE(p.pciPath.empty());  // no PCI function behind loopback
  EXPECT_EQ(p.speedMbps, 10000);   // loopback does not say: NCCL's default
  try {
    net->properties(net->deviceCount());
    ADD_FAILURE() << "a device past the last one was described";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("getProperties"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(BRAID_PLUGIN_PATH), std::string::npos) << e.what();
  }
}

// A NAME is libnccl-net-NAME.so, found on the library path (here the test's run path, as an
// installed libbraid finds the plug-in installed beside it).
TEST_F(NcclPlugin, ANameMeansLibncclNetNameSo) {
  EXPECT_STREQ(loadNcclNetPlugin("braid")->name(), "Braid");
  const std::string error = loadError("nosuch");
  EXPECT_NE(error.find("BRAID_NET_PLUGIN=nosuch"), std::string::npos) << error;
  EXPECT_NE(error.find("libnccl-net-nosuch.so"), std::string::npos) << error;
}

// Two "ranks", each with its own Net over the plug-in, listen, connect to each other and accept;
// messages of several sizes (empty, odd, larger than a socket buffer) travel both ways at once.
TEST_F(NcclPlugin, MovesMessagesIntactBothWays) {
  const std::unique_ptr<Net> a = loadNcclNetPlugin(BRAID_PLUGIN_PATH);
  const std::unique_ptr<Net> b = loadNcclNetPlugin(BRAID_PLUGIN_PATH);
  Handle aHandle, bHandle;
  const std::unique_ptr<ListenComm> aListener = a->listen(0, &aHandle);
  const std::unique_ptr<ListenComm> bListener = b->listen(0, &bHandle);
  const std::unique_ptr<SendComm> aToB = a->connect(0, bHandle, 11, in(10s));
  const std::unique_ptr<SendComm> bToA = b->connect(0, aHandle, 22, in(10s));
  uint32_t tag = 0;
  const std::unique_ptr<RecvComm> aFromB = a->accept(*aListener, &tag, in(10s));
  EXPECT_EQ(tag, 22u);
  const std::unique_ptr<RecvComm> bFromA = b->accept(*bListener, &tag, in(10s));
  EXPECT_EQ(tag, 11u);

  const std::vector<size_t> sizes = {0, 1, 4095, 65536, 100000, 1u << 20, (1u << 20) + 7, 17};
  const size_t capacity = (1u << 20) + 7;
  Stream forward(aToB.get(), bFromA.get(), capacity);
  Stream backward(bToA.get(), aFromB.get(), capacity);
  for (size_t i = 0; i < 2 * sizes.size(); ++i) {
    forward.out.push_back(randomBytes(sizes[i % sizes.size()], static_cast<uint32_t>(i)));
    backward.out.push_back(
        randomBytes(sizes[(i + 3) % sizes.size()], static_cast<uint32_t>(i + 99)));
  }
  ASSERT_TRUE(runStreams({&forward, &backward}))
      << "forward received " << forward.received << ", backward " << backward.received << " of "
      << forward.out.size();
  for (size_t i = 0; i < forward.out.size(); ++i) {
    EXPECT_EQ(forward.in[i], forward.out[i]) << "forward message " << i;
    EXPECT_EQ(backward.in[i], backward.out[i]) << "backward message " << i;
  }
}

// NCCL's accept() does not say who connected: the loader's introduction does. Three connections
// to one listener, accepted in whatever order they arrive, each carry their own messages.
TEST_F(NcclPlugin, EachAcceptedConnectionNamesItsTag) {
  const std::unique_ptr<Net> net = loadNcclNetPlugin(BRAID_PLUGIN_PATH);
  Handle handle;
  const std::unique_ptr<ListenComm> listener = net->listen(0, &handle);
  std::map<uint32_t, std::unique_ptr<SendComm>> sends;
  for (uint32_t tag : {5u, 6u, 1027u}) sends[tag] = net->connect(0, handle, tag, in(10s));
  std::map<uint32_t, std::unique_ptr<RecvComm>> recvs;
  for (int i = 0; i < 3; ++i) {
    uint32_t tag = 0;
    std::unique_ptr<RecvComm> comm = net->accept(*listener, &tag, in(10s));
    ASSERT_EQ(sends.count(tag), 1u) << "accepted an unknown tag " << tag;
    ASSERT_EQ(recvs.count(tag), 0u) << "accepted tag " << tag << " twice";
    recvs[tag] = std::move(comm);
  }
  std::vector<std::unique_ptr<Stream>> streams;
  for (auto& [tag, send] : sends) {
    streams.push_back(std::make_unique<Stream>(send.get(), recvs[tag].get(), 4096));
    for (uint32_t i = 0; i < 3; ++i)
      streams.back()->out.push_back(randomBytes(1000 + tag, tag + i));
  }
  ASSERT_TRUE(runStreams({streams[0].get(), streams[1].get(), streams[2].get()}));
  for (const auto& s : streams) EXPECT_EQ(s->in, s->out);
}

TEST_F(NcclPlugin, AMissingFileIsNamed) {
  const std::string error = loadError("/nonexistent/libnccl-net-gone.so");
  EXPECT_NE(error.find("BRAID_NET_PLUGIN=/nonexistent/libnccl-net-gone.so"), std::string::npos)
      << error;
  EXPECT_NE(error.find("cannot load"), std::string::npos) << error;
}

TEST_F(NcclPlugin, ALibraryWithoutThePluginSymbolIsNamed) {
  const std::string error = loadError(NOT_A_PLUGIN_PATH);
  EXPECT_NE(error.find("BRAID_NET_PLUGIN="), std::string::npos) << error;
  EXPECT_NE(error.find(NOT_A_PLUGIN_PATH), std::string::npos) << error;
  EXPECT_NE(error.find("exports no ncclNetPlugin_v8"), std::string::npos) << error;
}

// One test: a plug-in whose init() succeeded stays initialized for the process.
TEST_F(NcclPlugin, APluginThatFailsToInitializeOrHasNoDeviceIsNamed) {
  setenv("FAKE_NCCL_NET_INIT_FAILS", "1", 1);
  std::string error = loadError(FAKE_PLUGIN_PATH);
  EXPECT_NE(error.find(std::string("BRAID_NET_PLUGIN=") + FAKE_PLUGIN_PATH), std::string::npos)
      << error;
  EXPECT_NE(error.find("init failed: ncclSystemError"), std::string::npos) << error;

  unsetenv("FAKE_NCCL_NET_INIT_FAILS");
  error = loadError(FAKE_PLUGIN_PATH);
  EXPECT_NE(error.find(std::string("BRAID_NET_PLUGIN=") + FAKE_PLUGIN_PATH), std::string::npos)
      << error;
  EXPECT_NE(error.find("has no network device"), std::string::npos) << error;
}

}  // namespace
}  // namespace braid::net
