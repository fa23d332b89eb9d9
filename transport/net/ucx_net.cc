#include "transport/net/ucx_net.h"

#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "base/random.h"
#include "transport/net/socket_net.h"

namespace braid::net {

bool rdmaDevicePresent() {
  std::error_code error;
  const std::filesystem::directory_iterator devices("/sys/class/infiniband", error);
  return !error && devices != std::filesystem::directory_iterator();
}

namespace {

constexpr uint64_t kHelloMagic = 0x31552d6469617262;  // "braid-U1"
// Data messages carry the connection id as their tag, with their number on the connection in the
// low kSeqBits: a direction's medium messages may take a lane of their own (see Lane), so the
// receiver matches each message by its number, not by when it arrives. A number comes round
// again only after 2^20 messages, which no message waits behind. The end of the stream sets this
// bit, and a failed rank's reason (SendComm::abort) the next. Connection ids have neither, nor
// kBackTag, nor number bits: 41 random bits, so that two connections to one worker share an id
// with odds of about 1 in 4 million for a thousand connections.
constexpr int kSeqBits = 20;
constexpr uint64_t kSeqMask = (uint64_t{1} << kSeqBits) - 1;
constexpr uint64_t kEndOfStreamTag = uint64_t{1} << 63;
constexpr uint64_t kRankFailedTag = uint64_t{1} << 62;
constexpr uint64_t kControlTags = kEndOfStreamTag | kRankFailedTag;
// Tags the messages that go back over a connection, from the side that accepted it.
constexpr uint64_t kBackTag = uint64_t{1} << 61;
constexpr uint64_t kNotConnectionBits = kControlTags | kBackTag | kSeqMask;
constexpr uint64_t kExactTag = ~uint64_t{0};
// Hello::flags: the endpoint is a lane of an existing connection, not a connection of its own.
constexpr uint32_t kLaneHello = 1;
// Messages up to this size that do not fit one segment take a lane (see Lane).
constexpr size_t kLaneMaxBytes = 64 << 10;
// Gathered messages this small are copied into one piece (UcxSendComm::isendGather): all that
// take the shared connection or a lane. 8 KiB all-reduces between 2 namespace hosts took 11.3-11.6
// us copied, 11.6-18 gathered; 32 KiB 13.4-17.2 against 17.1-17.2 (3 interleaved runs).
constexpr size_t kCopiedMaxBytes = kLaneMaxBytes;
// A connection must send its hello this quickly: a stranger that sends nothing is dropped.
constexpr auto kHelloTimeout = std::chrono::seconds(5);
// How long closing an endpoint may flush what it still holds (the end of the stream) before it is
// torn down.
constexpr auto kCloseTimeout = std::chrono::seconds(2);

// The first message on a connection's stream.
struct Hello {
  uint64_t magic = kHelloMagic;
  uint8_t token[wire::kTokenBytes] = {};  // the listener's, from its handle
  uint32_t tag = 0;                       // the connecting rank's
  uint32_t flags = 0;                     // kLaneHello
  uint64_t connection = 0;                // tags this connection's messages; no kNotConnectionBits
  // Where the accepting side may open a lane for its messages back: a listener of the connecting
  // side's worker. All zero: nowhere.
  Handle back;
};
static_assert(sizeof(Hello) == 40 + sizeof(Handle));

bool present(const Handle& handle) {
  return std::any_of(std::begin(handle.bytes), std::end(handle.bytes),
                     [](uint8_t b) { return b != 0; });
}

std::string text(ucs_status_t status) {
  return ucs_status_string(status);
}

void check(ucs_status_t status, const char* what) {
  if (status != UCS_OK) fail(braidSystemError, "NET/UCX: {} failed: {}", what, text(status));
}

// Turns a failed transfer or endpoint into a sentence about the peer.
[[noreturn]] void failTransfer(const std::string& activity, ucs_status_t status, int keepaliveMs) {
  switch (status) {
    case UCS_ERR_ENDPOINT_TIMEOUT:
      fail(braidRemoteError,
           "{}: no answer for {} s (UCX: {}): the peer is unreachable (link down or host gone)",
           activity, (keepaliveMs + 999) / 1000, text(status));
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_UNREACHABLE:
      // UCX reports a TCP keepalive timeout on a receiving socket as a reset too.
      fail(braidRemoteError,
           "{}: the peer closed the connection, or it was unreachable for {} s (UCX: {}): its "
           "process exited, or the link is down or the host gone",
           activity, (keepaliveMs + 999) / 1000, text(status));
    case UCS_ERR_MESSAGE_TRUNCATED:
      fail(braidRemoteError,
           "{}: the peer sent a message larger than the posted buffer (oversized)", activity);
    default: fail(braidSystemError, "{}: UCX: {}", activity, text(status));
  }
}

// UCX enables TCP keepalive only on the sockets it connects, not on those it accepts (uct/tcp,
// uct_tcp_ep_create_socket_and_connect, in 1.13 as in its master branch), and with its own timing,
// so over TCP the side of a hop that only receives would not notice a dead link for minutes. This
// sets keepalive as braid's socket plug-in does (enableKeepalive) on every established TCP socket
// of the process on one of `addresses` that probes later than after 1 s idle: UCX's, and any other
// socket on those addresses, which probes do not harm.
void watchSockets(const std::vector<std::string>& addresses, int keepaliveMs) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", error)) {
    const int fd = std::atoi(entry.path().filename().c_str());
    int type = 0, keepalive = 0, idle = 0;
    socklen_t length = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length) != 0 || type != SOCK_STREAM) continue;
    length = sizeof keepalive;
    if (getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &keepalive, &length) != 0) continue;
    length = sizeof idle;
    if (keepalive != 0 && getsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, &length) == 0 &&
        idle == 1)
      continue;
    sockaddr_storage local{}, peer{};
    socklen_t localLength = sizeof local, peerLength = sizeof peer;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &localLength) != 0 ||
        getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peerLength) != 0 ||
        (local.ss_family != AF_INET && local.ss_family != AF_INET6))
      continue;
    const std::string host = SocketAddress(reinterpret_cast<sockaddr*>(&local), localLength).host();
    if (std::find(addresses.begin(), addresses.end(), host) == addresses.end()) continue;
    try {
      enableKeepalive(fd, keepaliveMs);
    } catch (const Error& e) {
      BRAID_INFO(log::kNet, "NET/UCX: socket {} left unwatched: {}", fd, e.what());
    }
  }
}

// Sets a UCP variable unless the user set it: UCX's own variables win.
void setDefault(ucp_config_t* config, const char* name, const std::string& value) {
  if (std::getenv(fmt::format("UCX_{}", name).c_str()) != nullptr) return;
  if (ucp_config_modify(config, name, value.c_str()) != UCS_OK)
    BRAID_INFO(log::kNet, "NET/UCX: this UCX has no {} to set", name);
}

// A transport's variable, which ucp_config_modify does not reach (UCX reports it unused): through
// the environment UCX reads, unless the user set it.
void setTransportDefault(const char* name, const char* value) {
  setenv(fmt::format("UCX_{}", name).c_str(), value, /*overwrite=*/0);
}

// A UCP request's handle, polled rather than called back, so that nothing UCX does later can
// reach freed memory. One dropped unfinished is cancelled (a receive ends at once; a send ends
// when its endpoint closes) and released to UCX.
class Operation {
 public:
  Operation() = default;
  Operation(ucp_worker_h worker, ucs_status_ptr_t handle) : worker_(worker) {
    if (UCS_PTR_IS_ERR(handle))
      status_ = UCS_PTR_STATUS(handle);
    else if (handle != nullptr)
      handle_ = handle, status_ = UCS_INPROGRESS;
  }
  Operation(Operation&& other) noexcept { *this = std::move(other); }
  Operation& operator=(Operation&& other) noexcept {
    release();
    worker_ = other.worker_;
    handle_ = std::exchange(other.handle_, nullptr);
    status_ = other.status_;
    return *this;
  }
  ~Operation() { release(); }

  // UCS_INPROGRESS until the operation ends; then its outcome. For a tagged receive, `tagInfo`
  // gets what arrived; for a stream receive, `streamBytes`.
  ucs_status_t poll(ucp_tag_recv_info_t* tagInfo = nullptr, size_t* streamBytes = nullptr) {
    if (status_ != UCS_INPROGRESS) return status_;
    if (tagInfo != nullptr) {
      status_ = ucp_tag_recv_request_test(handle_, tagInfo);
    } else if (streamBytes != nullptr) {
      status_ = ucp_stream_recv_request_test(handle_, streamBytes);
    } else {
      status_ = ucp_request_check_status(handle_);
    }
    if (status_ != UCS_INPROGRESS) release();
    return status_;
  }

 private:
  void release() {
    if (handle_ == nullptr) return;
    if (status_ == UCS_INPROGRESS) ucp_request_cancel(worker_, handle_);
    ucp_request_free(handle_);
    handle_ = nullptr;
  }
  ucp_worker_h worker_ = nullptr;
  void* handle_ = nullptr;
  ucs_status_t status_ = UCS_OK;
};

// The context and worker that a Net's listeners and connections share; the last one frees it.
// A communicator's setup and its proxy use it in turn, but nothing stops two proxies from sharing
// one (tests do), so the worker is thread-safe (MULTI): uncontended, its locks cost little.
class Worker {
 public:
  explicit Worker(int keepaliveMs) : keepaliveMs(keepaliveMs), rdma(rdmaDevicePresent()) {
    // UCX's 8 KiB TCP segments cost a system call each: a FIFO slot goes in one piece. Once per
    // process, the first time UCX starts (setenv races with other threads' getenv otherwise).
    static std::once_flag segments;
    if (!rdma)
      std::call_once(segments, [] {
        setTransportDefault("TCP_TX_SEG_SIZE", "256k");
        setTransportDefault("TCP_RX_SEG_SIZE", "256k");
      });
    ucp_config_t* config = nullptr;
    check(ucp_config_read(nullptr, nullptr, &config), "reading the UCX configuration");
    // A silent peer is declared lost after about keepaliveMs, as over braid's sockets. On an RDMA
    // fabric UCP probes every second and the fabric reports a probe that finds no one. Over TCP
    // the kernel does it (keepalive, see watchSockets), and UCP's probes would
    // stop it: a socket with a probe unacknowledged sends no keepalive.
    setDefault(config, "KEEPALIVE_INTERVAL", rdma ? "1s" : "inf");
    // Over TCP, rendezvous costs round trips that move nothing (its zero copy is emulated).
    if (!rdma) setDefault(config, "RNDV_THRESH", "inf");
    // Every buffer UCX sees is a FIFO registered once (ucp_mem_map), so no registration cache,
    // and none of the memory hooks it installs: those deadlock a process forked while another
    // thread held their lock.
    setDefault(config, "RCACHE_ENABLE", "n");
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_STREAM | UCP_FEATURE_WAKEUP;
    const ucs_status_t status = ucp_init(&params, config, &context);
    ucp_config_release(config);
    check(status, "ucp_init");
    ucp_worker_params_t workerParams{};
    workerParams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    workerParams.thread_mode = UCS_THREAD_MODE_MULTI;
    if (ucp_worker_create(context, &workerParams, &worker) != UCS_OK) {
      ucp_cleanup(context);
      fail(braidSystemError, "NET/UCX: creating a UCP worker failed");
    }
    alwaysReady = eventfd(1, EFD_CLOEXEC);
    if (ucp_worker_get_efd(worker, &wakeFd) != UCS_OK || alwaysReady < 0) {
      if (alwaysReady >= 0) close(alwaysReady);
      ucp_worker_destroy(worker);
      ucp_cleanup(context);
      fail(braidSystemError, "NET/UCX: the worker offers no file descriptor to wait on");
    }
  }
  ~Worker() {
    if (alwaysReady >= 0) close(alwaysReady);
    discardUnexpected();
    for (const auto& listener : listeners_) {
      for (ucp_conn_request_h request : listener->takeAll())
        ucp_listener_reject(listener->handle, request);
      ucp_listener_destroy(listener->handle);
    }
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
  }
  // Messages that arrived for no posted receive (a peer's last slots or end of stream, after this
  // side closed) are received and dropped, rather than reported by UCX as unmatched at exit.
  void discardUnexpected() {
    std::vector<uint8_t> sink;
    ucp_tag_recv_info_t info{};
    while (ucp_tag_message_h message = ucp_tag_probe_nb(worker, 0, 0, 1, &info)) {
      sink.resize(std::max<size_t>(info.length, 1));
      const ucp_request_param_t param{};
      Operation received(worker,
                         ucp_tag_msg_recv_nbx(worker, sink.data(), info.length, message, &param));
      ucp_tag_recv_info_t ignored{};
      progressUntil([&] { return received.poll(&ignored) != UCS_INPROGRESS; },
                    Clock::now() + kCloseTimeout);
    }
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Also brings the sockets UCX opened since the last look (at most a second ago) under watch.
  // Returns whether UCX did anything (ucp_worker_progress).
  unsigned progress() {
    const unsigned events = ucp_worker_progress(worker);
    const Clock::time_point now = Clock::now();
    if (now - lastWatch_.load(std::memory_order_relaxed) < std::chrono::seconds(1)) return events;
    std::unique_lock<std::mutex> lock(addressesMutex_, std::try_to_lock);
    if (!lock.owns_lock()) return events;
    lastWatch_ = now;
    watchSockets(addresses_, keepaliveMs);
    return events;
  }

  // Where this worker's listeners and connections are: where its sockets get keepalive.
  void addAddress(const std::string& host) {
    std::lock_guard<std::mutex> lock(addressesMutex_);
    if (std::find(addresses_.begin(), addresses_.end(), host) == addresses_.end())
      addresses_.push_back(host);
  }

  // What to poll() on until the worker has something to do. The worker's descriptor fires only
  // once armed, and arming fails while events are pending: then a descriptor that is always ready
  // sends the caller straight back to progress.
  void pollDescriptor(std::vector<pollfd>& out) {
    progress();
    out.push_back({ucp_worker_arm(worker) == UCS_OK ? wakeFd : alwaysReady, POLLIN, 0});
  }

  // Progresses until `done` or `deadline`, sleeping on the worker's descriptor in between.
  template <typename Done>
  bool progressUntil(Done done, Clock::time_point deadline) {
    for (;;) {
      progress();
      if (done()) return true;
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return false;
      std::vector<pollfd> fds;
      pollDescriptor(fds);
      ::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left.count() + 1, 10)));
    }
  }

  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  int wakeFd = -1;
  int alwaysReady = -1;
  const int keepaliveMs;
  const bool rdma;  // an RDMA device is present: UCX runs over it, not over TCP

 private:
  std::mutex addressesMutex_;
  std::vector<std::string> addresses_;

 public:
  // Where an endpoint's error handler records its status. UCX may still call the handler, from
  // its async thread, while or after the endpoint closes; only destroying the worker ends that. So
  // the word lives as long as the worker, not the endpoint.
  std::atomic<ucs_status_t>* newErrorWord() {
    std::lock_guard<std::mutex> lock(ownedMutex_);
    return &errorWords_.emplace_back(UCS_OK);
  }

  // A UCP listener and the connection requests its handler queued, from UCX's async thread. UCX
  // 1.13 may still hand a request over while or after the listener is destroyed (a connection
  // being wired up as it goes: seen as a crash in ucp_cm_server_conn_request_cb when ranks that
  // fail connect to tell their peers, and those peers close). So listeners live as long as the
  // worker, and are destroyed with it, right before it.
  struct Listener {
    ucp_listener_h handle = nullptr;
    std::mutex mutex;
    std::deque<ucp_conn_request_h> requests;
    std::atomic<size_t> queued{0};  // requests.size(), for a look without the lock
    void add(ucp_conn_request_h request) {
      std::lock_guard<std::mutex> lock(mutex);
      requests.push_back(request);
      queued.store(requests.size(), std::memory_order_release);
    }
    ucp_conn_request_h take() {
      std::lock_guard<std::mutex> lock(mutex);
      if (requests.empty()) return nullptr;
      ucp_conn_request_h request = requests.front();
      requests.pop_front();
      queued.store(requests.size(), std::memory_order_release);
      return request;
    }
    std::deque<ucp_conn_request_h> takeAll() {
      std::lock_guard<std::mutex> lock(mutex);
      queued.store(0, std::memory_order_release);
      return std::exchange(requests, {});
    }
  };
  Listener& newListener() {
    std::lock_guard<std::mutex> lock(ownedMutex_);
    return *listeners_.emplace_back(std::make_unique<Listener>());
  }

 private:
  std::mutex ownedMutex_;                             // guards errorWords_ and listeners_
  std::deque<std::atomic<ucs_status_t>> errorWords_;  // stable addresses
  std::vector<std::unique_ptr<Listener>> listeners_;
  std::atomic<Clock::time_point> lastWatch_{};
};

// A UCP endpoint and the error its handler recorded.
class Endpoint {
 public:
  Endpoint(std::shared_ptr<Worker> worker, std::string peer)
      : worker_(std::move(worker)), peer_(std::move(peer)) {}
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;
  // Flushes what the endpoint still holds (the end of a stream), bounded, unless it failed; then
  // closes it, forcibly: a peer that will not take the rest must not hold up the close.
  ~Endpoint() {
    if (ep_ == nullptr) return;
    if (error() == UCS_OK) {
      const ucp_request_param_t flushParam{};
      Operation flush(worker_->worker, ucp_ep_flush_nbx(ep_, &flushParam));
      worker_->progressUntil([&] { return flush.poll() != UCS_INPROGRESS; },
                             Clock::now() + kCloseTimeout);
    }
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    Operation close(worker_->worker, ucp_ep_close_nbx(ep_, &param));
    worker_->progressUntil([&] { return close.poll() != UCS_INPROGRESS; },
                           Clock::now() + kCloseTimeout);
  }

  // Completes the endpoint's parameters with this object's error handler and creates it.
  void create(ucp_ep_params_t params) {
    params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = [](void* word, ucp_ep_h, ucs_status_t status) {
      static_cast<std::atomic<ucs_status_t>*>(word)->store(status, std::memory_order_release);
    };
    params.err_handler.arg = error_;
    const ucs_status_t status = ucp_ep_create(worker_->worker, &params, &ep_);
    if (status != UCS_OK) {
      ep_ = nullptr;
      failTransfer("NET/UCX: connecting to " + peer_, status, worker_->keepaliveMs);
    }
  }

  // Keeps `buffer`, which a message on the endpoint is sent from, until the endpoint has closed
  // (its close flushes what is still queued).
  void hold(std::shared_ptr<const void> buffer) { held_.push_back(std::move(buffer)); }

  ucp_ep_h get() const { return ep_; }
  ucs_status_t error() const { return error_->load(std::memory_order_acquire); }
  const std::string& peer() const { return peer_; }
  Worker& worker() const { return *worker_; }

 private:
  std::shared_ptr<Worker> worker_;
  std::string peer_;
  std::vector<std::shared_ptr<const void>> held_;  // released after the close, in ~Endpoint
  ucp_ep_h ep_ = nullptr;
  // Set by the handler, from any progressing thread; owned by the worker.
  std::atomic<ucs_status_t>* error_ = worker_->newErrorWord();
};

// Memory registered with UCX (ucp_mem_map), unmapped when its last holder goes: the region the
// caller holds, and the comm it was registered with, whose posted requests may use it until they
// end (the caller may drop the region first: NCCL's order, deregistration before close).
class UcxMapping {
 public:
  UcxMapping(std::shared_ptr<Worker> worker, void* data, size_t bytes)
      : worker_(std::move(worker)) {
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = data;
    params.length = bytes;
    check(ucp_mem_map(worker_->context, &params, &handle_), "registering a FIFO (ucp_mem_map)");
  }
  ~UcxMapping() { ucp_mem_unmap(worker_->context, handle_); }
  UcxMapping(const UcxMapping&) = delete;
  UcxMapping& operator=(const UcxMapping&) = delete;
  ucp_mem_h handle() const { return handle_; }

 private:
  std::shared_ptr<Worker> worker_;
  ucp_mem_h handle_ = nullptr;
};

class UcxMemoryRegion final : public MemoryRegion {
 public:
  explicit UcxMemoryRegion(std::shared_ptr<UcxMapping> mapping) : mapping_(std::move(mapping)) {}
  ucp_mem_h handle() const { return mapping_->handle(); }

 private:
  std::shared_ptr<UcxMapping> mapping_;
};

struct UcxRequest : Request {
  Operation operation;
  uint64_t seq = 0;
  size_t bytes = 0;            // a send's size
  ucp_tag_recv_info_t info{};  // a receive's, once it is done
  // A gathered send's head and body, which UCX reads until the send ends (perhaps only when the
  // endpoint closes, after this request's comm: see ~UcxComm).
  std::shared_ptr<std::array<ucp_dt_iov_t, 2>> iov;
};

// Opens an endpoint to the listener of `handle` and sends `hello` on its stream with the
// listener's token; the endpoint keeps the hello until it closes. `sent` gets the send.
std::unique_ptr<Endpoint> connectTo(const std::shared_ptr<Worker>& worker, const Handle& handle,
                                    std::unique_ptr<Hello> hello, Operation* sent) {
  const SocketAddress address = wire::unpackHandle(handle, hello->token, "UCX");
  auto endpoint = std::make_unique<Endpoint>(worker, address.toString());
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = address.get();
  params.sockaddr.addrlen = address.length();
  endpoint->create(params);
  // The send may wait for the endpoint's wire-up: the endpoint keeps its buffer.
  const ucp_request_param_t p{};
  *sent = Operation(worker->worker,
                    ucp_stream_send_nbx(endpoint->get(), hello.get(), sizeof(Hello), &p));
  endpoint->hold(std::move(hello));
  return endpoint;
}

// What arrives at a listener: connections, which the proxy accepts (UcxListenComm), and lanes
// (see UcxSendComm), which nobody accepts: whoever looks first wires them up, the listener or a
// comm whose peer may open one, and they stay until the last of those goes. A lane's messages
// match their receives by tag, whatever endpoint carries them.
class Arrivals {
 public:
  struct Arrived {
    std::unique_ptr<Endpoint> endpoint;
    Hello hello;
  };

  Arrivals(std::shared_ptr<Worker> worker, Worker::Listener& listener, const uint8_t* token,
           std::string bound)
      : worker_(std::move(worker)), listener_(listener), bound_(std::move(bound)) {
    std::memcpy(token_, token, sizeof token_);
  }

  // Whether a look could find anything: a request queued or a hello on its way.
  bool idle() const {
    return listener_.queued.load(std::memory_order_acquire) == 0 &&
           waiting_.load(std::memory_order_acquire) == 0;
  }

  // The first connection whose hello arrived and carries the listener's token.
  std::optional<Arrived> next() {
    std::lock_guard<std::mutex> lock(mutex_);
    look();
    if (connections_.empty()) return std::nullopt;
    Arrived arrived = std::move(connections_.front());
    connections_.pop_front();
    return arrived;
  }

  // Wires up lanes that arrived, unless someone else is looking.
  void poll() {
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (lock.owns_lock()) look();
  }

  // The listener's owner has gone: requests queued are turned away, connections that arrived and
  // later ones dropped; lanes still come in.
  void close() {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    connections_.clear();
    for (ucp_conn_request_h request : listener_.takeAll())
      ucp_listener_reject(listener_.handle, request);
  }
  bool closed() const { return closed_.load(); }

 private:
  struct Pending {
    std::unique_ptr<Endpoint> endpoint;
    Hello hello;
    Operation receive;
    Clock::time_point since;
  };

  void look() {
    takeRequests();
    sortHellos();
  }

  // Makes an endpoint for each connection request and waits for its hello.
  void takeRequests() {
    while (ucp_conn_request_h request = listener_.take()) {
      ucp_conn_request_attr_t attr{};
      attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
      std::string peer = "an unknown address";
      if (ucp_conn_request_query(request, &attr) == UCS_OK)
        peer = SocketAddress(reinterpret_cast<const sockaddr*>(&attr.client_address),
                             sizeof attr.client_address)
                   .toString();
      auto pending = std::make_unique<Pending>();
      pending->endpoint = std::make_unique<Endpoint>(worker_, peer);
      ucp_ep_params_t params{};
      params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
      params.conn_request = request;
      try {
        pending->endpoint->create(params);
      } catch (const Error& e) {
        BRAID_WARN(log::kNet, "NET/UCX: dropped a connection: {}", e.what());
        continue;
      }
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_STREAM_RECV_FLAG_WAITALL;
      size_t length = 0;
      pending->receive =
          Operation(worker_->worker, ucp_stream_recv_nbx(pending->endpoint->get(), &pending->hello,
                                                         sizeof(Hello), &length, &p));
      pending->since = Clock::now();
      pending_.push_back(std::move(pending));
    }
    waiting_.store(pending_.size(), std::memory_order_release);
  }

  // Sorts the endpoints whose hello arrived into connections and lanes; drops those without the
  // listener's token, and those that sent none in time.
  void sortHellos() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      Pending& p = **it;
      size_t length = 0;
      const ucs_status_t status = p.receive.poll(nullptr, &length);
      const bool lane = (p.hello.flags & kLaneHello) != 0;
      const uint64_t notAllowed = lane ? kControlTags | kSeqMask : kNotConnectionBits;
      std::string refused;
      if (status == UCS_INPROGRESS && Clock::now() - p.since > kHelloTimeout)
        refused = "no hello";
      else if (status != UCS_INPROGRESS && status != UCS_OK)
        refused = "the connection failed: " + text(status);
      else if (status == UCS_OK && (p.hello.magic != kHelloMagic ||
                                    std::memcmp(p.hello.token, token_, sizeof token_) != 0 ||
                                    (p.hello.connection & notAllowed) != 0))
        refused = "a hello without this listener's token";
      else if (status == UCS_OK && !lane && closed_)
        refused = "the listener is closed";
      if (!refused.empty()) {
        BRAID_WARN(log::kNet, "NET/UCX: dropped a connection from {} to {}: {}", p.endpoint->peer(),
                   bound_, refused);
      } else if (status == UCS_INPROGRESS) {
        ++it;
        continue;
      } else if (lane) {
        lanes_.push_back(std::move(p.endpoint));
      } else {
        connections_.push_back({std::move(p.endpoint), p.hello});
      }
      it = pending_.erase(it);
    }
    waiting_.store(pending_.size(), std::memory_order_release);
  }

  std::shared_ptr<Worker> worker_;
  // Owned by the worker; its handler queues requests from UCX's async thread.
  Worker::Listener& listener_;
  std::string bound_;  // for messages
  uint8_t token_[wire::kTokenBytes];
  std::mutex mutex_;  // guards what follows
  std::vector<std::unique_ptr<Pending>> pending_;
  std::atomic<size_t> waiting_{0};  // pending_.size()
  std::deque<Arrived> connections_;
  std::vector<std::unique_ptr<Endpoint>> lanes_;
  std::atomic<bool> closed_{false};
};

// Over TCP, both directions of a connection on one socket make a message larger than a segment
// wait on the other direction's traffic (2 KiB all-reduces between 2 namespace hosts: 18 us over
// one endpoint, 12 us over one per direction, where 8 B takes 10.6 and 14). So each direction
// sends such messages over an endpoint of its own, a lane, opened to the peer's listener: the
// connecting side's to the one it connected to, the accepting side's to the one the hello names.
// With a lane for the side sending back only, the shared connection also carried the other
// side's medium messages, and 512 KiB all-reduces after a sweep from 8 B then took either 125 or
// 150-200 us (4 of 7 runs slow); with lanes both ways 0.84-0.93x MPI's time in 10 of 10. Bulk
// (messages over kLaneMaxBytes) stays on the connection, where each direction's data carries the
// other's acknowledgements: with bulk on the lanes too, 512 KiB took 1.54x and 4 MiB 1.48x MPI's
// time in 1 of 3 sweeps, 0.93-0.94 and 0.52-0.54 in the others.
struct Lane {
  Handle listener;               // the peer's, where the lane is opened
  size_t aboveBytes = SIZE_MAX;  // messages larger than this take it; SIZE_MAX: no lane
};

// One direction of a connection: its endpoint, tag and requests. Requests are tested in posting
// order.
class UcxComm {
 protected:
  UcxComm(std::shared_ptr<Endpoint> endpoint, uint64_t connection, std::string activity)
      : endpoint_(std::move(endpoint)), connection_(connection), activity_(std::move(activity)) {}

  std::unique_ptr<MemoryRegion> registerRegion(std::shared_ptr<Worker> worker, void* data,
                                               size_t bytes) {
    mappings_.push_back(std::make_shared<UcxMapping>(std::move(worker), data, bytes));
    return std::make_unique<UcxMemoryRegion>(mappings_.back());
  }
  // A data message's tag: its connection's, and its number there.
  uint64_t tagOf(const UcxRequest& r) const { return connection_ | (r.seq & kSeqMask); }
  ucp_request_param_t param(size_t bytes, MemoryRegion* region) const {
    ucp_request_param_t p{};
    if (region != nullptr && bytes > 0) {
      p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
      p.memh = static_cast<UcxMemoryRegion*>(region)->handle();
    }
    return p;
  }
  // Reports `request` done once its operation ends; throws if it failed.
  bool finished(UcxRequest& r, size_t* bytes, bool receive) {
    requests_.checkTestOrder(r, activity_);
    const ucs_status_t status = r.operation.poll(receive ? &r.info : nullptr);
    if (status == UCS_INPROGRESS) return false;
    if (status != UCS_OK) failTransfer(activity_, status, endpoint_->worker().keepaliveMs);
    *bytes = receive ? r.info.length : r.bytes;
    requests_.reportDone();
    return true;
  }
  // Requests are destroyed (their operations released) before the endpoint closes. It is shared
  // by both directions of a connection (Net::sendBack, receiveBack) and closes with the last.
  std::shared_ptr<Endpoint> endpoint_;
  uint64_t connection_;
  std::string activity_;  // "sending to 10.0.0.2:4000", for errors
  // Registered with this comm; outlive its requests, which are ended (cancelled) first.
  std::vector<std::shared_ptr<UcxMapping>> mappings_;
  RequestRing<UcxRequest> requests_;

 public:
  // A send cannot be cancelled: one still queued goes out when the endpoint closes, which may be
  // after this comm (the other direction shares the endpoint). Its memory stays registered until
  // then.
  ~UcxComm() {
    for (const auto& mapping : mappings_) endpoint_->hold(mapping);
    for (uint64_t seq = requests_.reported(); seq < requests_.posted(); ++seq)
      if (requests_.at(seq).iov != nullptr) endpoint_->hold(requests_.at(seq).iov);
  }
};

class UcxSendComm final : public SendComm, UcxComm {
 public:
  // `hello`, the connection's first message, is in flight on the endpoint's stream; where the
  // comm sends back over a connection the peer made, a flush of the endpoint stands for it.
  // `lane`: where larger messages go. `lanesBack`: where the peer's lane for messages back would
  // arrive, the listener this side's hello named.
  UcxSendComm(std::shared_ptr<Endpoint> endpoint, uint64_t connection, Operation hello,
              std::shared_ptr<Worker> worker, Lane lane = {},
              std::shared_ptr<Arrivals> lanesBack = nullptr)
      : UcxComm(endpoint, connection, "sending to " + endpoint->peer()),
        hello_(std::move(hello)),
        worker_(std::move(worker)),
        lane_(lane),
        lanesBack_(std::move(lanesBack)) {}

  // The connection, for the other direction (UcxNet::receiveBack).
  const std::shared_ptr<Endpoint>& endpoint() const { return endpoint_; }
  uint64_t connection() const { return connection_; }
  const std::shared_ptr<Arrivals>& lanesBack() const { return lanesBack_; }

  std::unique_ptr<MemoryRegion> registerMemory(void* data, size_t bytes) override {
    return registerRegion(worker_, data, bytes);
  }

  Request* isend(const void* data, size_t bytes, MemoryRegion* region) override {
    if (!readyToSend()) return nullptr;
    const ucp_ep_h endpoint = endpointFor(bytes);
    UcxRequest& r = requests_.next();
    r.bytes = bytes;
    const ucp_request_param_t p = param(bytes, region);
    r.operation = Operation(worker_->worker, ucp_tag_send_nbx(endpoint, data, bytes, tagOf(r), &p));
    return &r;
  }

  // One message from two places, as UCX's IOV datatype: UCX reads the body where it lies. A small
  // message is copied behind its head instead, which costs less than UCX's gathering (8 B - 1 KiB
  // all-reduces between 2 namespace hosts: 0.1-0.4 us less).
  Request* isendGather(void* head, size_t headBytes, const void* body, size_t bodyBytes,
                       MemoryRegion* region) override {
    if (headBytes + bodyBytes <= kCopiedMaxBytes)
      return SendComm::isendGather(head, headBytes, body, bodyBytes, region);
    if (!readyToSend()) return nullptr;
    const ucp_ep_h endpoint = endpointFor(headBytes + bodyBytes);
    UcxRequest& r = requests_.next();
    r.bytes = headBytes + bodyBytes;
    r.iov = std::make_shared<std::array<ucp_dt_iov_t, 2>>(
        std::array<ucp_dt_iov_t, 2>{{{head, headBytes}, {const_cast<void*>(body), bodyBytes}}});
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
    p.datatype = ucp_dt_make_iov();
    r.operation = Operation(worker_->worker,
                            ucp_tag_send_nbx(endpoint, r.iov->data(), r.iov->size(), tagOf(r), &p));
    return &r;
  }

  // A request done already (most small sends complete at once) costs no look at the worker: on
  // TCP every progress is a system call.
  bool test(Request* request, size_t* bytes) override {
    if (finished(*static_cast<UcxRequest*>(request), bytes, false)) return true;
    worker_->progress();
    if (const ucs_status_t hello = hello_.poll(); hello != UCS_INPROGRESS && hello != UCS_OK)
      failTransfer(activity_, hello, worker_->keepaliveMs);
    if (endpoint_->error() != UCS_OK)
      failTransfer(activity_, endpoint_->error(), worker_->keepaliveMs);
    if (laneEndpoint_ != nullptr) {
      if (const ucs_status_t hello = laneHello_.poll(); hello != UCS_INPROGRESS && hello != UCS_OK)
        failTransfer(activity_, hello, worker_->keepaliveMs);
      if (laneEndpoint_->error() != UCS_OK)
        failTransfer(activity_, laneEndpoint_->error(), worker_->keepaliveMs);
    }
    return finished(*static_cast<UcxRequest*>(request), bytes, false);
  }

  void pollDescriptors(std::vector<pollfd>& out) const override { worker_->pollDescriptor(out); }

  // The end is a message of its own tag after the last one; closing the endpoint then flushes it.
  void end() override {
    const ucp_request_param_t p{};
    end_ = Operation(worker_->worker, ucp_tag_send_nbx(endpoint_->get(), nullptr, 0,
                                                       connection_ | kEndOfStreamTag, &p));
  }

  // The reason is a message of its own tag. It goes at once on a connection with nothing queued;
  // otherwise as the worker progresses, at the latest when closing the endpoint flushes it.
  void abort(const std::string& reason) override {
    auto sent = std::make_shared<const std::string>(reason.substr(0, kMaxReasonBytes));
    endpoint_->hold(sent);
    const ucp_request_param_t p{};
    abort_ =
        Operation(worker_->worker, ucp_tag_send_nbx(endpoint_->get(), sent->data(), sent->size(),
                                                    connection_ | kRankFailedTag, &p));
    worker_->progress();
  }

 private:
  // Whether a request may be posted: one is free, and the hello has gone. Nothing is sent before
  // it: messages queued while the endpoint is still being wired up may overtake each other (seen
  // with UCX 1.13 over TCP: a connection's second message matched before its first).
  bool readyToSend() {
    if (requests_.full()) return false;
    if (hello_.poll() == UCS_INPROGRESS) {
      worker_->progress();
      if (hello_.poll() == UCS_INPROGRESS) return false;
    }
    return true;
  }

  // The endpoint a message of `bytes` goes over: the connection's, or the lane, opened the first
  // time. The lane's hello need not go first: messages are matched by their number.
  ucp_ep_h endpointFor(size_t bytes) {
    if (bytes <= lane_.aboveBytes || bytes > kLaneMaxBytes) return endpoint_->get();
    if (laneEndpoint_ == nullptr) {
      auto hello = std::make_unique<Hello>();
      hello->flags = kLaneHello;
      hello->connection = connection_;
      laneEndpoint_ = connectTo(worker_, lane_.listener, std::move(hello), &laneHello_);
      BRAID_INFO(log::kNet, "NET/UCX: {}: messages over {} bytes take a lane of their own",
                 activity_, lane_.aboveBytes);
    }
    return laneEndpoint_->get();
  }

  Operation hello_;
  Operation end_;
  Operation abort_;
  std::shared_ptr<Worker> worker_;
  Lane lane_;
  std::shared_ptr<Arrivals> lanesBack_;
  Operation laneHello_;
  // Closes (flushing what it holds) before the requests of UcxComm are destroyed.
  std::unique_ptr<Endpoint> laneEndpoint_;
};

class UcxRecvComm final : public RecvComm, UcxComm {
 public:
  // `laneBack`: where messages back over this connection may take a lane (from the peer's
  // hello). `lanes`: where the peer's lane for this direction arrives, if it opens one.
  UcxRecvComm(std::shared_ptr<Endpoint> endpoint, uint64_t connection,
              std::shared_ptr<Worker> worker, Lane laneBack = {},
              std::shared_ptr<Arrivals> lanes = nullptr)
      : UcxComm(endpoint, connection, "receiving from " + endpoint->peer()),
        worker_(std::move(worker)),
        laneBack_(laneBack),
        lanes_(std::move(lanes)) {
    const ucp_request_param_t p{};
    end_ =
        Operation(worker_->worker, ucp_tag_recv_nbx(worker_->worker, nullptr, 0,
                                                    connection_ | kEndOfStreamTag, kExactTag, &p));
    // A handle to test, which then says how long the reason is (see irecv). A longer one is
    // truncated, an error.
    ucp_request_param_t reason{};
    reason.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    rankFailed_ = Operation(worker_->worker,
                            ucp_tag_recv_nbx(worker_->worker, reason_, sizeof reason_,
                                             connection_ | kRankFailedTag, kExactTag, &reason));
  }

  // The connection, for the other direction (UcxNet::sendBack).
  const std::shared_ptr<Endpoint>& endpoint() const { return endpoint_; }
  uint64_t connection() const { return connection_; }
  const Lane& laneBack() const { return laneBack_; }

  std::unique_ptr<MemoryRegion> registerMemory(void* data, size_t bytes) override {
    return registerRegion(worker_, data, bytes);
  }

  Request* irecv(void* data, size_t capacity, MemoryRegion* region) override {
    if (requests_.full()) return nullptr;
    UcxRequest& r = requests_.next();
    // Always a handle to test, which then says what arrived: UCX 1.13 leaves recv_info unset for
    // some receives that complete at once.
    ucp_request_param_t p = param(capacity, region);
    p.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    r.operation = Operation(worker_->worker, ucp_tag_recv_nbx(worker_->worker, data, capacity,
                                                              tagOf(r), kExactTag, &p));
    return &r;
  }

  // A failed rank's reason is the error to report, whatever the close that follows it says.
  // After the end of the stream nothing more arrives, and the close that follows is no failure.
  bool test(Request* request, size_t* bytes) override {
    if (finished(*static_cast<UcxRequest*>(request), bytes, true)) return true;
    const unsigned events = worker_->progress();
    // The peer's lane is wired up here when it opens one: nobody may be accepting connections.
    if (lanes_ != nullptr && !lanes_->idle()) lanes_->poll();
    if (finished(*static_cast<UcxRequest*>(request), bytes, true)) return true;
    // What can end the stream arrives through progress: while the worker does nothing, only
    // every 64th test asks (a waiting rank tests on every spin).
    if (events == 0 && (++quietTests_ & 63) != 0) return false;
    if (const ucs_status_t status = rankFailed_.poll(&reasonInfo_); status == UCS_OK)
      fail(braidRemoteError, "{}: the peer's rank failed: {}", activity_,
           std::string(reason_, reasonInfo_.length));
    else if (status != UCS_INPROGRESS)
      failTransfer(activity_, status, worker_->keepaliveMs);
    if (ended()) return false;
    if (endpoint_->error() != UCS_OK)
      failTransfer(activity_, endpoint_->error(), worker_->keepaliveMs);
    return false;
  }

  void pollDescriptors(std::vector<pollfd>& out) const override {
    if (!ended_) worker_->pollDescriptor(out);
  }

 private:
  bool ended() {
    ucp_tag_recv_info_t ignored{};
    if (!ended_ && end_.poll(&ignored) == UCS_OK) ended_ = true;
    return ended_;
  }

  Operation end_;
  bool ended_ = false;
  uint32_t quietTests_ = 0;       // tests in which the worker did nothing
  char reason_[kMaxReasonBytes];  // a failed rank's reason, when it arrives
  ucp_tag_recv_info_t reasonInfo_{};
  Operation rankFailed_;  // receives the reason; released before its buffer
  std::shared_ptr<Worker> worker_;
  Lane laneBack_;
  std::shared_ptr<Arrivals> lanes_;
};

// A UCP listener, whose connections the proxy accepts and whose lanes its comms take (Arrivals).
class UcxListenComm final : public ListenComm {
 public:
  // Messages back over the connections it accepts may take a lane when larger than
  // `laneAboveBytes`, if their peer says where.
  UcxListenComm(std::shared_ptr<Worker> worker, const SocketAddress& address, const uint8_t* token,
                size_t laneAboveBytes)
      : worker_(std::move(worker)),
        listener_(worker_->newListener()),
        laneAboveBytes_(laneAboveBytes) {
    ucp_listener_params_t params{};
    params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    params.sockaddr.addr = address.get();
    params.sockaddr.addrlen = address.length();
    params.conn_handler.cb = [](ucp_conn_request_h request, void* listener) {
      static_cast<Worker::Listener*>(listener)->add(request);
    };
    params.conn_handler.arg = &listener_;
    check(ucp_listener_create(worker_->worker, &params, &listener_.handle), "ucp_listener_create");
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    check(ucp_listener_query(listener_.handle, &attr), "ucp_listener_query");
    bound_ = SocketAddress(reinterpret_cast<const sockaddr*>(&attr.sockaddr), sizeof attr.sockaddr);
    arrivals_ = std::make_shared<Arrivals>(worker_, listener_, token, bound_.toString());
  }
  // Connections that asked to come in are turned away; the listener itself goes with the worker.
  ~UcxListenComm() override { arrivals_->close(); }

  const SocketAddress& bound() const { return bound_; }
  const std::shared_ptr<Arrivals>& arrivals() const { return arrivals_; }

  std::unique_ptr<RecvComm> acceptReady(uint32_t* tag) {
    worker_->progress();
    return comm(arrivals_->next(), tag);
  }

  void pollDescriptors(std::vector<pollfd>& out) const override { worker_->pollDescriptor(out); }

  std::unique_ptr<RecvComm> accept(uint32_t* tag, Clock::time_point deadline) {
    std::unique_ptr<RecvComm> accepted;
    const bool arrived = worker_->progressUntil(
        [&] {
          accepted = comm(arrivals_->next(), tag);
          return accepted != nullptr;
        },
        deadline);
    if (!arrived)
      fail(braidTimeout, "NET/UCX: no connection to {} proved itself before the deadline",
           bound_.toString());
    return accepted;
  }

 private:
  std::unique_ptr<RecvComm> comm(std::optional<Arrivals::Arrived> arrived, uint32_t* tag) {
    if (!arrived) return nullptr;
    *tag = arrived->hello.tag;
    const Handle& back = arrived->hello.back;
    return std::make_unique<UcxRecvComm>(
        std::move(arrived->endpoint), arrived->hello.connection, worker_,
        Lane{back, present(back) ? laneAboveBytes_ : SIZE_MAX}, arrivals_);
  }

  std::shared_ptr<Worker> worker_;
  // Owned by the worker; its handler queues requests from UCX's async thread.
  Worker::Listener& listener_;
  size_t laneAboveBytes_;
  SocketAddress bound_;
  std::shared_ptr<Arrivals> arrivals_;
};

class UcxNet final : public InterfaceNet {
 public:
  UcxNet(std::vector<NetInterface> devices, int keepaliveMs)
      : InterfaceNet(std::move(devices)), keepaliveMs_(keepaliveMs) {
    if (keepaliveMs < 1)
      fail(braidInvalidArgument, "BRAID_SOCKET_KEEPALIVE_MS={} must be positive", keepaliveMs);
  }

  const char* name() const override { return "UCX"; }

  std::unique_ptr<ListenComm> listen(int device, Handle* handle) override {
    SocketAddress address = checkedDevice(device).address;
    address.setPort(0);
    uint8_t token[wire::kTokenBytes];
    fillRandom(token, sizeof token);
    worker()->addAddress(address.host());
    auto listener =
        std::make_unique<UcxListenComm>(worker(), address, token, laneAboveBytes(device));
    *handle = wire::packHandle(listener->bound(), token);
    // Over TCP, the connections this side makes name it as where their lanes back go.
    if (!worker_->rdma) lanesBack_ = {listener->arrivals(), *handle};
    return listener;
  }

  std::unique_ptr<SendComm> connect(int device, const Handle& handle, uint32_t tag,
                                    Clock::time_point) override {
    worker()->addAddress(checkedDevice(device).address.host());
    auto hello = std::make_unique<Hello>();
    hello->tag = tag;
    fillRandom(&hello->connection, sizeof hello->connection);
    hello->connection &= ~kNotConnectionBits;
    const uint64_t connection = hello->connection;
    std::shared_ptr<Arrivals> lanesBack = lanesBack_.arrivals.lock();
    if (lanesBack != nullptr && !lanesBack->closed())
      hello->back = lanesBack_.handle;
    else
      lanesBack.reset();
    Operation sent;
    std::unique_ptr<Endpoint> endpoint = connectTo(worker_, handle, std::move(hello), &sent);
    return std::make_unique<UcxSendComm>(std::move(endpoint), connection, std::move(sent), worker_,
                                         Lane{handle, laneAboveBytes(device)},
                                         std::move(lanesBack));
  }

  std::unique_ptr<RecvComm> accept(ListenComm& listener, uint32_t* tag,
                                   Clock::time_point deadline) override {
    return static_cast<UcxListenComm&>(listener).accept(tag, deadline);
  }

  bool acceptsWithoutWaiting() const override { return true; }

  // A UCP endpoint carries tagged messages both ways: the other direction's have a tag of their
  // own (kBackTag), its end of stream and failure reason too.
  bool connectionsCarryBothWays() const override { return true; }
  std::unique_ptr<SendComm> sendBack(RecvComm& from) override {
    auto& recv = static_cast<UcxRecvComm&>(from);
    // The first message back waits for the endpoint to be flushed, which UCX completes only once
    // the endpoint is wired up: this side's endpoint, made when the peer's connection arrived,
    // may still be (as a connecting side's hello waits for its own).
    const ucp_request_param_t flushParam{};
    Operation wiredUp(worker_->worker, ucp_ep_flush_nbx(recv.endpoint()->get(), &flushParam));
    return std::make_unique<UcxSendComm>(recv.endpoint(), recv.connection() | kBackTag,
                                         std::move(wiredUp), worker_, recv.laneBack());
  }
  std::unique_ptr<RecvComm> receiveBack(SendComm& to) override {
    auto& send = static_cast<UcxSendComm&>(to);
    return std::make_unique<UcxRecvComm>(send.endpoint(), send.connection() | kBackTag, worker_,
                                         Lane{}, send.lanesBack());
  }

  std::unique_ptr<RecvComm> acceptReady(ListenComm& listener, uint32_t* tag) override {
    return static_cast<UcxListenComm&>(listener).acceptReady(tag);
  }

 private:
  // Made on first use: a Net that only describes its devices starts no UCX.
  const std::shared_ptr<Worker>& worker() {
    if (worker_ == nullptr) worker_ = std::make_shared<Worker>(keepaliveMs_);
    return worker_;
  }

  // Over TCP, messages larger than one segment of `device` (its MTU, less 128 bytes for IP, TCP
  // and UCX headers) take a lane; over RDMA, none do.
  size_t laneAboveBytes(int device) {
    if (worker()->rdma) return SIZE_MAX;
    int mtu = 1500;
    std::ifstream("/sys/class/net/" + checkedDevice(device).name + "/mtu") >> mtu;
    return static_cast<size_t>(std::max(mtu, 1280) - 128);
  }

  int keepaliveMs_;
  std::shared_ptr<Worker> worker_;
  // The latest listener, named in the hellos of the connections this side makes.
  struct {
    std::weak_ptr<Arrivals> arrivals;
    Handle handle;
  } lanesBack_;
};

}  // namespace

std::unique_ptr<Net> makeUcxNet(std::vector<NetInterface> devices, int keepaliveMs) {
  return std::make_unique<UcxNet>(std::move(devices), keepaliveMs);
}

}  // namespace braid::net
