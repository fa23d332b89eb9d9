// The network plug-in interface: what a transport between hosts offers the progress thread, in
// the spirit of NCCL's net API. A plug-in lists devices, listens, connects and accepts, and moves
// whole messages between registered buffers with non-blocking isend/irecv and test. It knows
// nothing of FIFOs or collectives; the proxy (proxy.h) maps FIFO slots onto messages. TCP sockets
// are one plug-in (socket_net.h), UCX another (ucx_net.h); an NCCL net plug-in is seen through the
// same interface (nccl_plugin_net.h).
#pragma once

#include <poll.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/wait.h"

namespace braid::net {

struct DeviceProperties {
  std::string name;     // "eth0", "mlx5_0"
  std::string address;  // where peers reach it, for logs
  std::string pciPath;  // sysfs path of its PCI function; empty for virtual devices (veth, bridge)
  int speedMbps = 0;    // link speed; 0 when the device does not say
};

// What a listener publishes so that peers can connect to it: opaque to all but the plug-in, the
// same size on every rank, exchanged through the bootstrap (whose connections prove the secret).
struct Handle {
  uint8_t bytes[128] = {};  // NCCL_NET_HANDLE_MAXSIZE, so NCCL plug-ins fit
};

// Memory the plug-in may send from or receive into: ibv_reg_mr for verbs, nothing for sockets.
class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
};

// A posted isend or irecv. Owned by its comm; the caller holds it until test() reports it done.
struct Request {};

// A connection's tag: the rank that opened it times this, plus which of its links with the peer it
// is (a CUDA communicator has one per channel).
constexpr int kMaxLinksPerPeer = 256;

// Up to this many requests may be in flight on one comm.
constexpr int kMaxRequests = 32;

// A comm's requests in flight, handed out and reported done in posting order, at most
// kMaxRequests at once. RequestT has a `seq`: its number among the comm's requests.
template <typename RequestT>
class RequestRing {
 public:
  bool full() const { return posted_ - reported_ >= kMaxRequests; }
  // The next request, cleared and numbered.
  RequestT& next() {
    RequestT& r = at(posted_);
    r = RequestT{};
    r.seq = posted_++;
    return r;
  }
  // Request `seq` (posted, not yet reported: the caller knows it is in flight).
  RequestT& at(uint64_t seq) { return requests_[seq % kMaxRequests]; }
  // Requests are tested in posting order: `r` must be the next to report. `activity` names the
  // comm.
  void checkTestOrder(const RequestT& r, const std::string& activity) const {
    if (r.seq != reported_)
      fail(braidInternalError, "{}: request #{} tested before #{}", activity, r.seq, reported_);
  }
  void reportDone() { ++reported_; }
  uint64_t posted() const { return posted_; }      // requests handed out
  uint64_t reported() const { return reported_; }  // requests test() reported done

 private:
  std::array<RequestT, kMaxRequests> requests_{};
  uint64_t posted_ = 0;
  uint64_t reported_ = 0;
};

// At most this much of a failed rank's reason crosses to its peers (SendComm::abort): what a
// RankControl holds for the ranks on its host.
constexpr size_t kMaxReasonBytes = 1024;

// One direction of a connection. Requests complete, and must be tested, in posting order. Errors
// (the peer closed, reset or went silent; a malformed message) throw braid::Error naming the
// remote address; a comm that threw is broken.
class Comm {
 public:
  virtual ~Comm() = default;
  virtual std::unique_ptr<MemoryRegion> registerMemory(void* data, size_t bytes) = 0;
  // Moves what can move without waiting; true once `request` is done, with its size in *bytes.
  virtual bool test(Request* request, size_t* bytes) = 0;
  // Descriptors whose readiness lets test() progress, for a poll() while nothing else can move.
  virtual void pollDescriptors(std::vector<pollfd>& out) const = 0;
};

class SendComm : public Comm {
 public:
  // Starts sending `bytes` from `data` (inside `region`); nullptr while kMaxRequests are in flight.
  virtual Request* isend(const void* data, size_t bytes, MemoryRegion* region) = 0;
  // Starts sending one message: `headBytes` at `head` (inside `region`), then `bodyBytes` at
  // `body`, anywhere in this process's memory, unchanged until test() reports the request done.
  // The receiver cannot tell it from isend of the two together. For a payload sent from where it
  // lies instead of being copied into a FIFO slot first. This default copies the body behind the
  // head, which must have room for it (a slot does), and sends both from `region`; plug-ins that
  // send from two places at once do better.
  virtual Request* isendGather(void* head, size_t headBytes, const void* body, size_t bodyBytes,
                               MemoryRegion* region) {
    std::memcpy(static_cast<uint8_t*>(head) + headBytes, body, bodyBytes);
    return isend(head, headBytes + bodyBytes, region);
  }
  // Ends the stream on purpose after the last message, so that the receiver takes the close that
  // follows for a departure. Without it, a close reads as a lost peer.
  virtual void end() = 0;
  // This sender's rank failed: tells the receiver why, best effort and without waiting, so that
  // ranks on other hosts learn the reason as ranks on this one do (RankControl::reason). The
  // receiver's test() then fails with braidRemoteError quoting `reason`, cut to kMaxReasonBytes.
  // Nothing is sent on the comm after it. A plug-in without such a message leaves the close to
  // say it.
  virtual void abort(const std::string& reason) {}
};

class RecvComm : public Comm {
 public:
  // Posts `data` for the next message, which must fit `capacity`; nullptr while kMaxRequests are
  // in flight. A larger message is an error, never a write past the buffer.
  virtual Request* irecv(void* data, size_t capacity, MemoryRegion* region) = 0;
  // From now on the descriptors pollDescriptors() gives may turn ready only once `bytes` have
  // arrived (or the stream ends), for a caller that reads smaller messages itself when it waits
  // for them. A hint: a plug-in may ignore it.
  virtual void setPollThreshold(size_t bytes) {}
  // Throws a failure of the peer that test() would throw, for a caller with no receive to test
  // (its FIFO full); a plug-in that tells failures through test() alone has nothing to add.
  virtual void checkPeer() {}
};

class ListenComm {
 public:
  virtual ~ListenComm() = default;
  // Descriptors that turn ready when a connection arrives, for a poll() meanwhile.
  virtual void pollDescriptors(std::vector<pollfd>& out) const {}
};

class Net {
 public:
  virtual ~Net() = default;
  virtual const char* name() const = 0;
  virtual int deviceCount() const = 0;
  virtual DeviceProperties properties(int device) const = 0;

  virtual std::unique_ptr<ListenComm> listen(int device, Handle* handle) = 0;
  // Connects to the listener that published `handle`, introducing itself with `tag` (the rank).
  // Does not wait for the other side to accept.
  virtual std::unique_ptr<SendComm> connect(int device, const Handle& handle, uint32_t tag,
                                            Clock::time_point deadline) = 0;
  // The next connection to `listener` that proves it was given the handle, and its tag. Others are
  // dropped and logged. Fails with braidTimeout once the deadline passes.
  virtual std::unique_ptr<RecvComm> accept(ListenComm& listener, uint32_t* tag,
                                           Clock::time_point deadline) = 0;
  // Whether acceptReady() works, so that connections can be made on first use. NCCL plug-ins'
  // accept() must meet connect() halfway: they are connected at init instead.
  virtual bool acceptsWithoutWaiting() const { return false; }
  // The next connection that already proved itself, without waiting; nullptr if none yet.
  virtual std::unique_ptr<RecvComm> acceptReady(ListenComm& listener, uint32_t* tag) {
    return nullptr;
  }

  // The other direction of a connection already made, where the plug-in's connections carry both
  // (sockets): messages to the peer over the connection it made (sendBack), or from it over the
  // one this side made (receiveBack). Two ranks' messages to each other then share a connection
  // and each one's data acknowledges the other's: TCP sends one packet per message, not two
  // (bench/net/tcp_exchange: 6.5 against 9.9 us per small exchange). nullptr where it cannot.
  virtual bool connectionsCarryBothWays() const { return false; }
  virtual std::unique_ptr<SendComm> sendBack(RecvComm& from) { return nullptr; }
  virtual std::unique_ptr<RecvComm> receiveBack(SendComm& to) { return nullptr; }
};

}  // namespace braid::net
