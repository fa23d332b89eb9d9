#include "transport/net/nccl_plugin_net.h"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "transport/net/nccl_net_v8.h"

namespace braid::net {
namespace {

using namespace nccl;

static_assert(sizeof(Handle) == kNetHandleMaxSize);
static_assert(kMaxRequests <= kNetMaxRequests);

// How often setup calls the plug-in again while a connection is on its way.
constexpr auto kSetupPollInterval = std::chrono::microseconds(100);
// The tag of every message: a comm carries one stream, in order.
constexpr int kMessageTag = 0;

// What the connecting side sends first on a new connection, since NCCL's accept() does not say
// who connected.
struct Introduction {
  uint32_t magic = 0;
  uint32_t tag = 0;
};
constexpr uint32_t kIntroductionMagic = 0x6e496462;  // "bdIn"

// A loaded and initialized plug-in. Never unloaded (NCCL's loader keeps plug-ins for the life of
// the process too): a plug-in's threads or exit handlers may still run its code.
struct Plugin {
  const ncclNet_v8_t* api = nullptr;
  std::string netName;  // its own: "Braid"
  std::string name;     // "NCCL net plug-in Braid (/opt/lib/libnccl-net-braid.so)", for messages
};

const char* resultName(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
  }
  return "an unknown result";
}

// `who`'s call `what` returned `result`: nccl.h's codes are braid's.
[[noreturn]] void failCall(const std::string& who, const std::string& what, ncclResult_t result) {
  const braidResult_t code = result > ncclSuccess && result <= ncclInProgress
                                 ? static_cast<braidResult_t>(result)
                                 : braidInternalError;
  fail(code, "{}: {} failed: {} ({}); the plug-in's own warnings in braid's log may say why", who,
       what, resultName(result), static_cast<int>(result));
}

// Throws unless the plug-in's `call` (on the comm `where` describes) succeeded.
void checkCall(const Plugin& plugin, ncclResult_t result, const char* call,
               const std::string& where) {
  if (result != ncclSuccess) failCall(plugin.name, fmt::format("{} {}", call, where), result);
}

// For calls in destructors, which must not throw.
void warnUnless(const Plugin& plugin, ncclResult_t result, const char* call,
                const std::string& where) {
  if (result != ncclSuccess)
    BRAID_WARN(log::kNet, "{}: {} {} failed: {} ({})", plugin.name, call, where, resultName(result),
               static_cast<int>(result));
}

// What the plug-in says, in braid's log (NET subsystem).
void forwardLog(ncclDebugLogLevel level, unsigned long, const char*, int, const char* format, ...) {
  log::Level braidLevel = log::Level::Info;
  switch (level) {
    case NCCL_LOG_NONE: return;
    case NCCL_LOG_WARN:
    case NCCL_LOG_ABORT: braidLevel = log::Level::Warn; break;
    case NCCL_LOG_TRACE: braidLevel = log::Level::Trace; break;
    case NCCL_LOG_VERSION:
    case NCCL_LOG_INFO: break;
  }
  if (!log::enabled(braidLevel, log::kNet)) return;
  char text[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof text, format, args);
  va_end(args);
  log::write(braidLevel, log::kNet, fmt::format("NET/Plugin: {}", text));
}

class PluginMemoryRegion final : public MemoryRegion {
 public:
  PluginMemoryRegion(const Plugin& plugin, void* comm, void* data, size_t bytes,
                     const std::string& where)
      : plugin_(plugin), comm_(comm), where_(where) {
    checkCall(plugin, plugin.api->regMr(comm, data, bytes, kPtrHost, &mhandle_), "regMr", where);
  }
  ~PluginMemoryRegion() override {
    warnUnless(plugin_, plugin_.api->deregMr(comm_, mhandle_), "deregMr", where_);
  }
  void* mhandle() const { return mhandle_; }

 private:
  const Plugin& plugin_;
  void* comm_;
  std::string where_;
  void* mhandle_ = nullptr;
};

struct PluginRequest : Request {
  void* request = nullptr;  // the plug-in's
};

// What a send and a receive comm share: the plug-in's comm, closed with them, and the requests in
// flight on it.
class PluginComm {
 protected:
  PluginComm(const Plugin& plugin, bool sending, std::string where)
      : plugin_(plugin), sending_(sending), where_(std::move(where)) {}
  ~PluginComm() {
    if (comm_ == nullptr) return;
    if (sending_)
      warnUnless(plugin_, plugin_.api->closeSend(comm_), "closeSend", where_);
    else
      warnUnless(plugin_, plugin_.api->closeRecv(comm_), "closeRecv", where_);
  }

  std::unique_ptr<PluginMemoryRegion> registerRegion(void* data, size_t bytes) {
    return std::make_unique<PluginMemoryRegion>(plugin_, comm_, data, bytes, where_);
  }
  void* mhandleOf(MemoryRegion* region) const {
    if (region == nullptr)
      fail(braidInternalError, "{}: a message {} in memory no registerMemory() returned",
           plugin_.name, where_);
    return static_cast<PluginMemoryRegion*>(region)->mhandle();
  }

  bool full() const { return posted_ - completed_ >= kMaxRequests; }
  // The plug-in's request as the caller's; nullptr when the plug-in posted none.
  Request* track(void* request) {
    if (request == nullptr) return nullptr;
    PluginRequest& r = requests_[posted_++ % kMaxRequests];
    r.request = request;
    return &r;
  }
  bool testRequest(Request* request, size_t* bytes, const char* call) {
    int done = 0;
    int size = 0;
    checkCall(plugin_,
              plugin_.api->test(static_cast<PluginRequest*>(request)->request, &done, &size), call,
              where_);
    if (done == 0) return false;
    ++completed_;
    *bytes = static_cast<size_t>(size);
    return true;
  }

  const Plugin& plugin_;
  const bool sending_;
  void* comm_ = nullptr;  // the plug-in's
  std::string where_;     // "on the connection opened as tag 257", for messages
  // The first message, sent or received while the connection is set up.
  Introduction introduction_;
  std::unique_ptr<PluginMemoryRegion> introductionRegion_;
  void* introductionRequest_ = nullptr;

 private:
  std::array<PluginRequest, kMaxRequests> requests_;
  uint64_t posted_ = 0;
  uint64_t completed_ = 0;
};

class PluginSendComm;
// A Net's connects that are not established yet. NCCL plug-ins establish a connection only while
// both sides keep calling them: an RDMA plug-in's connect() needs the peer's accept() to answer
// it, and that accept() needs the connect() called again. A rank connects to all its peers
// before it accepts any (net_transport.cc's connectAll), so accept() drives these until they are
// through.
using Pending = std::vector<PluginSendComm*>;

class PluginSendComm final : public SendComm, PluginComm {
 public:
  PluginSendComm(const Plugin& plugin, int device, const Handle& handle, uint32_t tag,
                 Clock::time_point deadline, std::shared_ptr<Pending> pending)
      : PluginComm(plugin, true, fmt::format("on the connection opened as tag {}", tag)),
        device_(device),
        handle_(handle),
        deadline_(deadline),
        pending_(std::move(pending)) {
    introduction_ = {kIntroductionMagic, tag};
  }
  ~PluginSendComm() override {
    if (!established_) leavePending();
  }

  // One step towards the connection without waiting: the plug-in's connect(), then the
  // introduction; true once the introduction has been sent.
  bool connectStep() {
    if (established_) return true;
    if (Clock::now() >= deadline_)
      fail(braidTimeout, "{}: the connection opened as tag {} was not established in time ({})",
           plugin_.name, introduction_.tag,
           comm_ == nullptr ? "connect() gave no comm" : "its introduction was not sent");
    if (comm_ == nullptr) {
      ncclNetDeviceHandle_v8_t* noOffload = nullptr;
      checkCall(plugin_, plugin_.api->connect(device_, handle_.bytes, &comm_, &noOffload),
                "connect", where_);
      if (comm_ == nullptr) return false;
      introductionRegion_ = registerRegion(&introduction_, sizeof introduction_);
    }
    if (introductionRequest_ == nullptr) {
      checkCall(plugin_,
                plugin_.api->isend(comm_, &introduction_, sizeof introduction_, kMessageTag,
                                   introductionRegion_->mhandle(), &introductionRequest_),
                "isend of the introduction", where_);
      if (introductionRequest_ == nullptr) return false;
    }
    int done = 0;
    checkCall(plugin_, plugin_.api->test(introductionRequest_, &done, nullptr),
              "test of the introduction", where_);
    if (done == 0) return false;
    introductionRegion_.reset();
    established_ = true;
    leavePending();
    return true;
  }

  // The connection must be established first, so this may wait for it (until the deadline).
  std::unique_ptr<MemoryRegion> registerMemory(void* data, size_t bytes) override {
    while (!connectStep()) std::this_thread::sleep_for(kSetupPollInterval);
    return registerRegion(data, bytes);
  }

  Request* isend(const void* data, size_t bytes, MemoryRegion* region) override {
    if (bytes > INT_MAX)
      fail(braidInvalidArgument, "{}: a message of {} bytes {}: NCCL plug-ins take at most {}",
           plugin_.name, bytes, where_, INT_MAX);
    if (full()) return nullptr;
    void* request = nullptr;
    checkCall(plugin_,
              plugin_.api->isend(comm_, const_cast<void*>(data), static_cast<int>(bytes),
                                 kMessageTag, mhandleOf(region), &request),
              "isend", where_);
    return track(request);
  }

  bool test(Request* request, size_t* bytes) override {
    return testRequest(request, bytes, "test of a send");
  }

  // A plug-in has nothing to poll: the proxy looks again soon while a send is in flight.
  void pollDescriptors(std::vector<pollfd>&) const override {}

  // NCCL has no end of stream: a plug-in only closes (closeSend, when the comm is destroyed).
  void end() override {}

 private:
  void leavePending() { std::erase(*pending_, this); }

  const int device_;
  Handle handle_;  // the plug-in's connect() may write its progress into it
  const Clock::time_point deadline_;
  std::shared_ptr<Pending> pending_;
  bool established_ = false;  // connected, and the introduction sent
};

class PluginRecvComm final : public RecvComm, PluginComm {
 public:
  PluginRecvComm(const Plugin& plugin, void* comm)
      : PluginComm(plugin, false, "on a connection not yet introduced") {
    comm_ = comm;
  }

  // One step of receiving the introduction without waiting: true once it arrived, with the tag
  // the other side connected with. Throws if the first message is not an introduction.
  bool introductionStep(uint32_t* tag) {
    if (introductionRequest_ == nullptr) {
      if (introductionRegion_ == nullptr)
        introductionRegion_ = registerRegion(&introduction_, sizeof introduction_);
      void* data = &introduction_;
      int size = sizeof introduction_;
      int messageTag = kMessageTag;
      void* mhandle = introductionRegion_->mhandle();
      checkCall(
          plugin_,
          plugin_.api->irecv(comm_, 1, &data, &size, &messageTag, &mhandle, &introductionRequest_),
          "irecv of the introduction", where_);
      if (introductionRequest_ == nullptr) return false;
    }
    int done = 0;
    int size = 0;
    checkCall(plugin_, plugin_.api->test(introductionRequest_, &done, &size),
              "test of the introduction", where_);
    if (done == 0) return false;
    introductionRegion_.reset();
    if (size != sizeof(Introduction) || introduction_.magic != kIntroductionMagic)
      fail(braidRemoteError,
           "{}: the first message {} ({} bytes, magic 0x{:08x}) is no braid peer's introduction",
           plugin_.name, where_, size, introduction_.magic);
    *tag = introduction_.tag;
    where_ = fmt::format("on the connection from tag {}", *tag);
    return true;
  }

  std::unique_ptr<MemoryRegion> registerMemory(void* data, size_t bytes) override {
    return registerRegion(data, bytes);
  }

  Request* irecv(void* data, size_t capacity, MemoryRegion* region) override {
    if (full()) return nullptr;
    // No message is larger than INT_MAX (isend's size is an int), so a larger buffer holds any.
    int size = static_cast<int>(std::min<size_t>(capacity, INT_MAX));
    int messageTag = kMessageTag;
    void* mhandle = mhandleOf(region);
    void* request = nullptr;
    checkCall(plugin_, plugin_.api->irecv(comm_, 1, &data, &size, &messageTag, &mhandle, &request),
              "irecv", where_);
    return track(request);
  }

  bool test(Request* request, size_t* bytes) override {
    return testRequest(request, bytes, "test of a receive");
  }

  // A plug-in has nothing to poll. A receive waits for the proxy's next look: no later than the
  // start of the operation that reads it, which wakes the proxy.
  void pollDescriptors(std::vector<pollfd>&) const override {}
};

class PluginListenComm final : public ListenComm {
 public:
  PluginListenComm(const Plugin& plugin, void* comm, int device)
      : plugin_(plugin), comm_(comm), where_(fmt::format("on the listener of device {}", device)) {}
  ~PluginListenComm() override {
    warnUnless(plugin_, plugin_.api->closeListen(comm_), "closeListen", where_);
  }

  // One step of accepting without waiting: the plug-in's accept(), then the newcomer's
  // introduction; the comm once it is introduced, with its tag. A newcomer that fails its
  // introduction is dropped and logged.
  std::unique_ptr<RecvComm> acceptStep(uint32_t* tag) {
    if (newcomer_ == nullptr) {
      void* comm = nullptr;
      ncclNetDeviceHandle_v8_t* noOffload = nullptr;
      checkCall(plugin_, plugin_.api->accept(comm_, &comm, &noOffload), "accept", where_);
      if (comm == nullptr) return nullptr;
      newcomer_ = std::make_unique<PluginRecvComm>(plugin_, comm);
    }
    try {
      if (!newcomer_->introductionStep(tag)) return nullptr;
    } catch (const Error& e) {
      BRAID_WARN(log::kNet, "{}: dropped a connection {}: {}", plugin_.name, where_, e.what());
      newcomer_.reset();
      return nullptr;
    }
    return std::move(newcomer_);
  }

 private:
  const Plugin& plugin_;
  void* comm_;
  std::string where_;
  std::unique_ptr<PluginRecvComm> newcomer_;  // accepted, its introduction awaited
};

class PluginNet final : public Net {
 public:
  PluginNet(const Plugin& plugin, int devices) : plugin_(plugin), devices_(devices) {}

  const char* name() const override { return plugin_.netName.c_str(); }
  int deviceCount() const override { return devices_; }

  DeviceProperties properties(int device) const override {
    ncclNetProperties_v8_t p{};
    checkCall(plugin_, plugin_.api->getProperties(device, &p), "getProperties",
              fmt::format("of device {}", device));
    DeviceProperties d;
    d.name = p.name != nullptr ? p.name : "";
    d.pciPath = p.pciPath != nullptr ? p.pciPath : "";
    d.speedMbps = p.speed;
    return d;
  }

  std::unique_ptr<ListenComm> listen(int device, Handle* handle) override {
    *handle = Handle{};
    void* comm = nullptr;
    checkCall(plugin_, plugin_.api->listen(device, handle->bytes, &comm), "listen",
              fmt::format("on device {}", device));
    return std::make_unique<PluginListenComm>(plugin_, comm, device);
  }

  std::unique_ptr<SendComm> connect(int device, const Handle& handle, uint32_t tag,
                                    Clock::time_point deadline) override {
    auto comm = std::make_unique<PluginSendComm>(plugin_, device, handle, tag, deadline, pending_);
    if (!comm->connectStep()) pending_->push_back(comm.get());
    return comm;
  }

  // Returns once a connection has arrived and introduced itself, and every connect of this Net is
  // established: after its last accept() a rank calls the plug-in for a connection only when it
  // sends on it, and its peers may be waiting for that connection before they accept.
  std::unique_ptr<RecvComm> accept(ListenComm& listener, uint32_t* tag,
                                   Clock::time_point deadline) override {
    auto& pluginListener = static_cast<PluginListenComm&>(listener);
    std::unique_ptr<RecvComm> accepted;
    for (;;) {
      // A copy: connects that get through leave the list.
      for (PluginSendComm* comm : Pending(*pending_)) comm->connectStep();
      if (accepted == nullptr) accepted = pluginListener.acceptStep(tag);
      if (accepted != nullptr && pending_->empty()) return accepted;
      if (Clock::now() >= deadline)
        fail(braidTimeout, "{}: {} before the deadline", plugin_.name,
             accepted == nullptr
                 ? std::string("no connection arrived and introduced itself")
                 : fmt::format("{} connection(s) this side opened were not established",
                               pending_->size()));
      std::this_thread::sleep_for(kSetupPollInterval);
    }
  }

 private:
  const Plugin& plugin_;
  const int devices_;
  std::shared_ptr<Pending> pending_ = std::make_shared<Pending>();
};

// The plug-in `value` names, loaded and initialized on first use; as NCCL does, once per process.
const Plugin& loadedPlugin(const std::string& value) {
  static std::mutex mutex;
  static std::map<std::string, Plugin> loaded;  // by file
  const std::string file =
      value.find('/') != std::string::npos ? value : fmt::format("libnccl-net-{}.so", value);
  std::lock_guard<std::mutex> lock(mutex);
  if (auto found = loaded.find(file); found != loaded.end()) return found->second;

  void* library = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr)
    fail(braidSystemError, "BRAID_NET_PLUGIN={}: cannot load {}: {}", value, file, dlerror());
  std::string path = file;  // where the dynamic loader found it
  link_map* map = nullptr;
  if (dlinfo(library, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name[0] != '\0')
    path = map->l_name;
  const auto* api = static_cast<const ncclNet_v8_t*>(dlsym(library, "ncclNetPlugin_v8"));
  if (api == nullptr)
    fail(braidInvalidArgument,
         "BRAID_NET_PLUGIN={}: {} exports no ncclNetPlugin_v8: not an NCCL net plug-in, or one "
         "without the v8 interface braid loads",
         value, path);
  const std::string name = api->name != nullptr ? api->name : "(unnamed)";
  Plugin plugin{api, name, fmt::format("NCCL net plug-in {} ({})", name, path)};
  if (const ncclResult_t result = api->init(forwardLog); result != ncclSuccess)
    failCall(fmt::format("BRAID_NET_PLUGIN={}: {}", value, plugin.name), "init", result);
  BRAID_INFO(log::kNet, "NET/Plugin: loaded {} for BRAID_NET_PLUGIN={}", plugin.name, value);
  return loaded.emplace(file, std::move(plugin)).first->second;
}

}  // namespace

std::unique_ptr<Net> loadNcclNetPlugin(const std::string& nameOrPath) {
  const Plugin& plugin = loadedPlugin(nameOrPath);
  int devices = 0;
  if (const ncclResult_t result = plugin.api->devices(&devices); result != ncclSuccess)
    failCall(fmt::format("BRAID_NET_PLUGIN={}: {}", nameOrPath, plugin.name), "devices", result);
  if (devices < 1)
    fail(braidSystemError, "BRAID_NET_PLUGIN={}: {} has no network device", nameOrPath,
         plugin.name);
  return std::make_unique<PluginNet>(plugin, devices);
}

}  // namespace braid::net
