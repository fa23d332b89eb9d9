// libnccl-net-braid.so: braid's TCP socket transport (socket_net.h) as an NCCL net plug-in of
// version 8 (nccl_net_v8.h), for NCCL jobs (NCCL_NET_PLUGIN=braid) and for braid's own loader
// (BRAID_NET_PLUGIN=braid), through which it is tested. Its devices are the interfaces
// BRAID_SOCKET_IFNAME chooses; BRAID_NSOCKS and BRAID_SOCKET_KEEPALIVE_MS apply as in braid.
// Host memory only; one buffer per irecv; requests are tested in posting order, as NCCL does.
#include <array>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "base/params.h"
#include "base/socket.h"
#include "transport/net/nccl_net_v8.h"
#include "transport/net/socket_net.h"

namespace braid::net {
namespace {

using namespace nccl;

static_assert(sizeof(Handle::bytes) == kNetHandleMaxSize);

// connect() must not wait long: a TCP connection not through in this time is tried again at the
// caller's next call.
constexpr auto kConnectSlice = std::chrono::seconds(1);

// NCCL's test() names only the request, so each carries its comm.
struct PluginRequest {
  Comm* comm = nullptr;
  Request* request = nullptr;
};

// A sendComm or recvComm as NCCL holds it.
struct Connection {
  std::unique_ptr<Comm> comm;  // a SendComm or a RecvComm
  // By posting order: the comm has at most kMaxRequests in flight, so a slot is free again once
  // its request was reported done.
  std::array<PluginRequest, kMaxRequests> requests{};
  uint64_t posted = 0;

  PluginRequest* track(Request* request) {
    if (request == nullptr) return nullptr;
    PluginRequest& r = requests[posted++ % kMaxRequests];
    r = {comm.get(), request};
    return &r;
  }
};

// What init() made: the socket Net and its devices' properties, whose strings getProperties()
// hands out. NCCL calls init() before anything else.
struct Network {
  std::unique_ptr<Net> net;
  std::vector<DeviceProperties> devices;
};
std::mutex initMutex;
std::unique_ptr<Network> network;
ncclDebugLogger_t logger = nullptr;

ncclResult_t resultOf(braidResult_t code) {
  return code > braidSuccess && code <= braidRemoteError ? static_cast<ncclResult_t>(code)
                                                         : ncclInternalError;
}

// Runs `body`; an error becomes its code, and its sentence goes to the caller's logger, since the
// ABI carries no message.
template <typename Body>
ncclResult_t guarded(const char* call, Body&& body) {
  try {
    body();
    return ncclSuccess;
  } catch (...) {
    const Error e = currentError();
    const std::string message = fmt::format("NET/Braid: {}: {}", call, e.what());
    if (logger != nullptr)
      logger(NCCL_LOG_WARN, kLogNet, __FILE__, __LINE__, "%s", message.c_str());
    else
      BRAID_WARN(log::kNet, "{}", message);
    return resultOf(e.code());
  }
}

ncclResult_t pluginInit(ncclDebugLogger_t logFunction) {
  return guarded("init", [&] {
    std::lock_guard<std::mutex> lock(initMutex);
    logger = logFunction;
    if (network != nullptr) return;
    // The socket Net itself, not makeConfiguredNet(): with BRAID_NET_PLUGIN naming this plug-in,
    // that would load it again.
    auto made = std::make_unique<Network>();
    made->net = makeSocketNet(
        findInterfaces(param::SocketIfname()),
        {static_cast<int>(param::NSocks()), static_cast<int>(param::SocketKeepaliveMs())});
    for (int i = 0; i < made->net->deviceCount(); ++i)
      made->devices.push_back(made->net->properties(i));
    network = std::move(made);
  });
}

ncclResult_t pluginDevices(int* ndev) {
  return guarded("devices", [&] { *ndev = static_cast<int>(network->devices.size()); });
}

ncclResult_t pluginGetProperties(int dev, ncclNetProperties_v8_t* props) {
  return guarded("getProperties", [&] {
    const int count = static_cast<int>(network->devices.size());
    if (dev < 0 || dev >= count)
      fail(braidInvalidArgument, "no device {} (there are {})", dev, count);
    const DeviceProperties& d = network->devices[dev];
    *props = ncclNetProperties_v8_t{};
    props->name = const_cast<char*>(d.name.c_str());
    props->pciPath = d.pciPath.empty() ? nullptr : const_cast<char*>(d.pciPath.c_str());
    props->guid = static_cast<uint64_t>(dev);
    props->ptrSupport = kPtrHost;
    // Virtual interfaces do not say: NCCL's own socket transport assumes 10 Gb/s then.
    props->speed = d.speedMbps > 0 ? d.speedMbps : 10000;
    props->maxComms = 65536;
    props->maxRecvs = 1;
    props->netDeviceType = NCCL_NET_DEVICE_HOST;
    props->netDeviceVersion = kNetDeviceInvalidVersion;
  });
}

ncclResult_t pluginListen(int dev, void* handle, void** listenComm) {
  return guarded("listen", [&] {
    Handle h;
    std::unique_ptr<ListenComm> listener = network->net->listen(dev, &h);
    std::memcpy(handle, h.bytes, sizeof h.bytes);
    *listenComm = listener.release();
  });
}

ncclResult_t pluginConnect(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v8_t**) {
  return guarded("connect", [&] {
    *sendComm = nullptr;
    Handle h;
    std::memcpy(h.bytes, handle, sizeof h.bytes);
    try {
      // The hello's tag goes unused: NCCL's accept() does not report one.
      *sendComm = new Connection{network->net->connect(dev, h, 0, Clock::now() + kConnectSlice)};
    } catch (const Error& e) {
      if (e.code() != braidTimeout) throw;
    }
  });
}

ncclResult_t pluginAccept(void* listenComm, void** recvComm, ncclNetDeviceHandle_v8_t**) {
  return guarded("accept", [&] {
    uint32_t tag = 0;
    std::unique_ptr<RecvComm> comm =
        network->net->acceptReady(*static_cast<ListenComm*>(listenComm), &tag);
    *recvComm = comm != nullptr ? new Connection{std::move(comm)} : nullptr;
  });
}

ncclResult_t pluginRegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  return guarded("regMr", [&] {
    if (type != kPtrHost)
      fail(braidInvalidArgument, "memory of type {}: this plug-in reaches host memory only", type);
    *mhandle = static_cast<Connection*>(comm)->comm->registerMemory(data, size).release();
  });
}

ncclResult_t pluginDeregMr(void*, void* mhandle) {
  return guarded("deregMr", [&] { delete static_cast<MemoryRegion*>(mhandle); });
}

ncclResult_t pluginIsend(void* sendComm, void* data, int size, int, void* mhandle, void** request) {
  return guarded("isend", [&] {
    if (size < 0) fail(braidInvalidArgument, "a message of {} bytes", size);
    auto& c = *static_cast<Connection*>(sendComm);
    *request = c.track(static_cast<SendComm&>(*c.comm).isend(data, static_cast<size_t>(size),
                                                             static_cast<MemoryRegion*>(mhandle)));
  });
}

// Tags are not matched: a connection is one stream, and messages meet buffers in posting order.
ncclResult_t pluginIrecv(void* recvComm, int n, void** data, int* sizes, int*, void** mhandles,
                         void** request) {
  return guarded("irecv", [&] {
    if (n != 1) fail(braidInvalidUsage, "{} buffers in one irecv (maxRecvs is 1)", n);
    if (sizes[0] < 0) fail(braidInvalidArgument, "a buffer of {} bytes", sizes[0]);
    auto& c = *static_cast<Connection*>(recvComm);
    *request = c.track(static_cast<RecvComm&>(*c.comm).irecv(
        data[0], static_cast<size_t>(sizes[0]), static_cast<MemoryRegion*>(mhandles[0])));
  });
}

// Only CUDA memory needs a flush, and ptrSupport offers host memory only.
ncclResult_t pluginIflush(void*, int, void**, int*, void**, void**) {
  return guarded("iflush", [] {
    fail(braidInvalidUsage, "host memory only: nothing to flush (no NCCL_PTR_CUDA in ptrSupport)");
  });
}

ncclResult_t pluginTest(void* request, int* done, int* sizes) {
  return guarded("test", [&] {
    auto& r = *static_cast<PluginRequest*>(request);
    size_t bytes = 0;
    *done = r.comm->test(r.request, &bytes) ? 1 : 0;
    if (*done != 0 && sizes != nullptr) *sizes = static_cast<int>(bytes);
  });
}

ncclResult_t pluginCloseSend(void* sendComm) {
  return guarded("closeSend", [&] {
    const std::unique_ptr<Connection> c(static_cast<Connection*>(sendComm));
    // Only a process that closes on purpose calls this (one that dies does not), so the stream
    // ends first: the receiver takes every message sent, then the close for a departure, as over
    // braid's own transport; it does not read a lost peer into a close that follows the last
    // message.
    static_cast<SendComm&>(*c->comm).end();
  });
}

ncclResult_t pluginCloseRecv(void* recvComm) {
  return guarded("closeRecv", [&] { delete static_cast<Connection*>(recvComm); });
}

ncclResult_t pluginCloseListen(void* listenComm) {
  return guarded("closeListen", [&] { delete static_cast<ListenComm*>(listenComm); });
}

}  // namespace
}  // namespace braid::net

// The one symbol the library exports (it is built with hidden visibility).
extern "C" __attribute__((visibility("default")))
const braid::net::nccl::ncclNet_v8_t ncclNetPlugin_v8 = {
    .name = "Braid",
    .init = braid::net::pluginInit,
    .devices = braid::net::pluginDevices,
    .getProperties = braid::net::pluginGetProperties,
    .listen = braid::net::pluginListen,
    .connect = braid::net::pluginConnect,
    .accept = braid::net::pluginAccept,
    .regMr = braid::net::pluginRegMr,
    .regMrDmaBuf = nullptr,  // no DMA-BUF: not in ptrSupport
    .deregMr = braid::net::pluginDeregMr,
    .isend = braid::net::pluginIsend,
    .irecv = braid::net::pluginIrecv,
    .iflush = braid::net::pluginIflush,
    .test = braid::net::pluginTest,
    .closeSend = braid::net::pluginCloseSend,
    .closeRecv = braid::net::pluginCloseRecv,
    .closeListen = braid::net::pluginCloseListen,
    .getDeviceMr = nullptr,  // no device offload: netDeviceType is host
    .irecvConsumed = nullptr,
};
