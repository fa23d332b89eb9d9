#include "transport/net/socket_net.h"

#include <fcntl.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include "base/error.h"
#include "base/log.h"
#include "base/random.h"

namespace braid::net {

namespace wire {

int messageParts(uint64_t bytes, int sockets) {
  return static_cast<int>(std::clamp<uint64_t>(bytes / kMinPartBytes, 1, sockets));
}

PartRange messagePart(uint64_t bytes, int parts, int part) {
  const uint64_t begin = bytes / parts * part + bytes % parts * part / parts;
  const uint64_t end = bytes / parts * (part + 1) + bytes % parts * (part + 1) / parts;
  return {begin, end - begin};
}

Handle packHandle(const SocketAddress& bound, const uint8_t* token) {
  HandleContents h{};
  h.family = bound.family() == AF_INET6 ? 6 : 4;
  h.port = bound.port();
  const std::vector<uint8_t> raw = bound.bytes();
  std::memcpy(h.address, raw.data(), raw.size());
  std::memcpy(h.token, token, kTokenBytes);
  Handle handle;
  std::memcpy(handle.bytes, &h, sizeof h);
  return handle;
}

SocketAddress unpackHandle(const Handle& handle, uint8_t* token, const char* plugin) {
  HandleContents h;
  std::memcpy(&h, handle.bytes, sizeof h);
  if ((h.family != 4 && h.family != 6) || h.port == 0)
    fail(braidInvalidArgument, "NET/{}: a handle with address family {} and port {}", plugin,
         h.family, h.port);
  std::memcpy(token, h.token, kTokenBytes);
  return SocketAddress::fromBytes(h.family == 4 ? AF_INET : AF_INET6, h.address, h.port);
}

int socketOfPart(uint64_t seq, int part, int sockets) {
  return static_cast<int>((seq + part) % sockets);
}

int partOnSocket(uint64_t seq, int socket, int sockets) {
  return static_cast<int>((socket + sockets - seq % sockets) % sockets);
}

}  // namespace wire

namespace {

using wire::FrameHeader;
using wire::HandleContents;
using wire::Hello;

constexpr size_t kHeaderBytes = sizeof(FrameHeader);
// A connection must send its hello this quickly: a stranger that sends nothing is dropped.
constexpr auto kHelloTimeout = std::chrono::seconds(5);
// Connections whose hello is still awaited, at most; more are refused until some finish.
constexpr size_t kMaxPendingSockets = 1024;

void setOption(int fd, int level, int name, int value, const char* what) {
  if (setsockopt(fd, level, name, &value, sizeof value) != 0)
    failErrno(braidSystemError, fmt::format("setting {} on a socket", what), errno);
}

// Turns a failed send or receive into a sentence about the peer.
[[noreturn]] void failTransfer(const std::string& activity, int err, int keepaliveMs) {
  switch (err) {
    case ETIMEDOUT:
      fail(braidRemoteError,
           "{}: no answer to TCP keepalive probes for {} s: the peer is unreachable (link down or "
           "host gone)",
           activity, (keepaliveMs + 999) / 1000);
    case ECONNRESET:
    case EPIPE:
      fail(braidRemoteError, "{}: the peer reset the connection (its process exited?)", activity);
    default: failErrno(braidSystemError, activity, err);
  }
}

class SocketMemoryRegion final : public MemoryRegion {};

// Splits a connection's sockets (wire::connectionSockets): the shared one and the connecting
// side's own are returned, the accepting side's go to `back`.
std::vector<Socket> forwardSockets(std::vector<Socket> sockets, std::vector<Socket>* back) {
  const size_t lanes = (sockets.size() - 1) / 2;
  std::vector<Socket> forward;
  for (size_t i = 0; i < sockets.size(); ++i)
    (i <= lanes ? forward : *back).push_back(std::move(sockets[i]));
  return forward;
}

// The part of a message socket `index` of a direction carries (0 the shared socket, then the
// direction's `ownSockets`), for a message sent on the shared socket (`shared`) or on its own.
std::optional<wire::PartRange> partOnLane(uint64_t seq, uint64_t bytes, bool shared, int index,
                                          int ownSockets) {
  if (shared || index == 0)
    return shared == (index == 0) ? std::optional(wire::PartRange{0, bytes}) : std::nullopt;
  const int parts = wire::messageParts(bytes, ownSockets);
  const int part = wire::partOnSocket(seq, index - 1, ownSockets);
  if (part >= parts) return std::nullopt;
  return wire::messagePart(bytes, parts, part);
}

// One direction of a connection: its sockets (the shared one first, then the direction's own) and
// the requests in flight on them. It holds the other direction's sockets until that direction's
// comm takes them (otherDirection).
template <typename RequestT, typename LaneT>
class SocketComm {
 protected:
  SocketComm(std::vector<Socket> sockets, std::vector<Socket> otherDirection, int keepaliveMs,
             std::string direction)
      : keepaliveMs_(keepaliveMs), otherDirection_(std::move(otherDirection)) {
    for (Socket& s : sockets) {
      lanes_.emplace_back();
      lanes_.back().activity = fmt::format("{} {}", direction, s.peerName());
      lanes_.back().socket = std::move(s);
    }
  }

  int socketCount() const { return static_cast<int>(lanes_.size()); }
  // Sockets of the direction's own after the shared one.
  int ownLanes() const { return socketCount() - 1; }
  // The same connection, for the other direction: the shared socket (each comm closes its own
  // descriptor, and the socket closes when both have), then the other direction's own.
  std::vector<Socket> otherDirection() {
    const LaneT& shared = lanes_[0];
    if (!shared.socket.valid())
      fail(braidRemoteError, "{}: the connection is closed", shared.activity);
    if (otherDirectionTaken_)
      fail(braidInternalError, "{}: the other direction was taken already", shared.activity);
    otherDirectionTaken_ = true;
    const int fd = fcntl(shared.socket.fd(), F_DUPFD_CLOEXEC, 0);
    if (fd < 0) failErrno(braidSystemError, shared.activity + ": duplicating the socket", errno);
    std::vector<Socket> sockets;
    sockets.emplace_back(fd, shared.socket.peerName());
    for (Socket& s : otherDirection_) sockets.push_back(std::move(s));
    otherDirection_.clear();
    return sockets;
  }
  // Requests are tested in posting order; test() calls this before reporting one done.
  void checkTestOrder(const RequestT& r) const { requests_.checkTestOrder(r, lanes_[0].activity); }

  int keepaliveMs_;
  std::vector<LaneT> lanes_;
  std::vector<Socket> otherDirection_;
  bool otherDirectionTaken_ = false;
  RequestRing<RequestT> requests_;
};

// A message is a head and a body that follows it (isendGather); isend's has no body.
struct SendRequest : Request {
  const uint8_t* head = nullptr;
  uint64_t headBytes = 0;
  const uint8_t* body = nullptr;
  uint64_t bytes = 0;  // the whole message
  uint64_t seq = 0;

  // Bytes [offset, offset + count) of the message as up to two iovecs in `out`; their count.
  int gather(uint64_t offset, uint64_t count, iovec* out) const {
    int n = 0;
    if (offset < headBytes) {
      const uint64_t take = std::min(count, headBytes - offset);
      out[n++] = {const_cast<uint8_t*>(head) + offset, take};
      offset += take;
      count -= take;
    }
    if (count > 0) out[n++] = {const_cast<uint8_t*>(body) + (offset - headBytes), count};
    return n;
  }
};

struct SendLane {
  Socket socket;
  std::string activity;                  // "sending to 10.0.0.2:4000", for errors
  uint64_t cursor = 0;                   // the next message this socket may carry a part of
  bool inFrame = false;                  // a part of message `cursor` is being written
  FrameHeader header;                    // of that part
  const SendRequest* request = nullptr;  // whose message that part belongs to
  size_t sent = 0;                       // header and payload bytes written
  bool wantsWrite = false;               // the socket's buffer was full at the last attempt
};

class SocketSendComm final : public SendComm, SocketComm<SendRequest, SendLane> {
 public:
  SocketSendComm(std::vector<Socket> sockets, std::vector<Socket> otherDirection, int keepaliveMs)
      : SocketComm(std::move(sockets), std::move(otherDirection), keepaliveMs, "sending to"),
        segmentBytes_(segmentBytes(lanes_[0].socket.fd())) {}
  using SocketComm::otherDirection;
  int keepaliveMs() const { return keepaliveMs_; }

  // Best effort: a socket in the middle of a frame, or too full to take the header, ends without
  // it, and its receiver sees a truncated frame or a lost peer.
  void end() override {
    FrameHeader end;
    end.flags = wire::kEndOfStream;
    for (const SendLane& lane : lanes_)
      if (!lane.inFrame) ::send(lane.socket.fd(), &end, sizeof end, MSG_DONTWAIT | MSG_NOSIGNAL);
  }

  // Best effort, as end(): the reason goes on every socket that is not in the middle of a frame
  // (the receiver may read any of them first); one too full to take the whole frame leaves its
  // receiver a truncated frame. Its seq counts the messages sent whole before it: the receiver
  // takes those first (they may still be on their way on other sockets).
  void abort(const std::string& reason) override {
    FrameHeader header;
    header.flags = wire::kRankFailed;
    header.bytes = std::min(reason.size(), kMaxReasonBytes);
    header.seq = requests_.posted();
    for (const SendLane& lane : lanes_) header.seq = std::min(header.seq, lane.cursor);
    iovec parts[2] = {{&header, sizeof header},
                      {const_cast<char*>(reason.data()), static_cast<size_t>(header.bytes)}};
    msghdr message{};
    message.msg_iov = parts;
    message.msg_iovlen = 2;
    for (const SendLane& lane : lanes_)
      if (!lane.inFrame) ::sendmsg(lane.socket.fd(), &message, MSG_DONTWAIT | MSG_NOSIGNAL);
  }

  std::unique_ptr<MemoryRegion> registerMemory(void*, size_t) override {
    return std::make_unique<SocketMemoryRegion>();
  }

  Request* isend(const void* data, size_t bytes, MemoryRegion*) override {
    return isendGather(const_cast<void*>(data), bytes, nullptr, 0, nullptr);
  }

  // The parts' system calls gather the head and the body: nothing is copied.
  Request* isendGather(void* head, size_t headBytes, const void* body, size_t bodyBytes,
                       MemoryRegion*) override {
    if (requests_.full()) return nullptr;
    SendRequest& r = requests_.next();
    r.head = static_cast<const uint8_t*>(head);
    r.headBytes = headBytes;
    r.body = static_cast<const uint8_t*>(body);
    r.bytes = headBytes + bodyBytes;
    return &r;
  }

  bool test(Request* request, size_t* bytes) override {
    auto& r = *static_cast<SendRequest*>(request);
    checkTestOrder(r);
    for (int i = 0; i < socketCount(); ++i) progress(i);
    // Every socket has moved past the message: all its parts are written.
    for (const SendLane& lane : lanes_)
      if (lane.cursor <= r.seq) return false;
    *bytes = r.bytes;
    requests_.reportDone();
    return true;
  }

  void pollDescriptors(std::vector<pollfd>& out) const override {
    for (const SendLane& lane : lanes_)
      if (lane.wantsWrite) out.push_back({lane.socket.fd(), POLLOUT, 0});
  }

 private:
  // The TCP segment's payload on this connection (its MSS), as the kernel reports it.
  static uint64_t segmentBytes(int fd) {
    int mss = 0;
    socklen_t size = sizeof mss;
    if (getsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &mss, &size) != 0 || mss <= 0) return 536;
    return static_cast<uint64_t>(mss);
  }

  // The part of message `r` socket `index` carries: all of a message that fits a segment with its
  // header on the shared socket (0), or its share on the direction's own.
  std::optional<wire::PartRange> partOn(const SendRequest& r, int index) const {
    const bool shared = ownLanes() == 0 || r.bytes + kHeaderBytes <= segmentBytes_;
    return partOnLane(r.seq, r.bytes, shared, index, ownLanes());
  }

  // Starts this socket's part of the next message that has one; false when none is posted.
  bool startFrame(int index) {
    SendLane& lane = lanes_[index];
    for (; lane.cursor < requests_.posted(); ++lane.cursor) {
      const SendRequest& r = requests_.at(lane.cursor);
      const std::optional<wire::PartRange> part = partOn(r, index);
      if (!part) continue;
      const wire::PartRange range = *part;
      lane.header = FrameHeader{};
      lane.header.seq = lane.cursor;
      lane.header.messageBytes = r.bytes;
      lane.header.offset = range.offset;
      lane.header.bytes = range.bytes;
      lane.request = &r;
      lane.sent = 0;
      lane.inFrame = true;
      return true;
    }
    return false;
  }

  void progress(int index) {
    SendLane& lane = lanes_[index];
    lane.wantsWrite = false;
    while (lane.inFrame || startFrame(index)) {
      // Header and payload in one call.
      iovec parts[3];
      int count = 0;
      if (lane.sent < kHeaderBytes)
        parts[count++] = {reinterpret_cast<uint8_t*>(&lane.header) + lane.sent,
                          kHeaderBytes - lane.sent};
      const size_t payloadSent = lane.sent > kHeaderBytes ? lane.sent - kHeaderBytes : 0;
      if (payloadSent < lane.header.bytes)
        count += lane.request->gather(lane.header.offset + payloadSent,
                                      lane.header.bytes - payloadSent, parts + count);
      msghdr message{};
      message.msg_iov = parts;
      message.msg_iovlen = count;
      const ssize_t n = ::sendmsg(lane.socket.fd(), &message, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          lane.wantsWrite = true;
          return;
        }
        failTransfer(lane.activity, errno, keepaliveMs_);
      }
      lane.sent += n;
      if (lane.sent == kHeaderBytes + lane.header.bytes) {
        lane.inFrame = false;
        ++lane.cursor;
      }
    }
  }

  const uint64_t segmentBytes_;
};

struct RecvRequest : Request {
  uint8_t* data = nullptr;
  uint64_t capacity = 0;
  uint64_t seq = 0;
  bool sized = false;     // a header has told the message's size
  bool onShared = false;  // ... and came on the shared socket
  uint64_t messageBytes = 0;
  uint64_t received = 0;
};

struct RecvLane {
  Socket socket;
  std::string activity;  // "receiving from 10.0.0.2:4000", for errors
  FrameHeader header;
  size_t headerHave = 0;
  bool placed = false;  // the header was matched with its posted request
  uint64_t payloadHave = 0;
  bool stalled = false;  // the header's message has no posted request yet
  // The sender ended the stream, on purpose or failing (a rank-failed frame); the socket is closed.
  bool ended = false;
  bool anyFrame = false;
  uint64_t lastSeq = 0;  // of the last complete frame, once anyFrame
  std::string reason;    // of a rank-failed frame, as it arrives
  // Bytes read ahead of the frame being parsed: a small message's header and payload come in one
  // system call instead of two (each costs a microsecond or more, on the small-message path).
  // Bounded, so what a peer sends still waits in the socket until its buffer is posted. 16 KiB:
  // 4-8 KiB all-reduces between 2 namespace hosts took 0.4-0.6 us less than with 4 KiB (3 rounds
  // of 10, interleaved); 64 KiB gained nothing more.
  std::array<uint8_t, 16384> ahead;
  size_t aheadBegin = 0, aheadEnd = 0;

  // As Socket::readSome: the bytes read ahead first; a short read refills them, a long one goes
  // straight into `data` (the payload of a large message is copied once, by the kernel).
  long read(void* data, size_t bytes) {
    if (aheadBegin == aheadEnd) {
      if (bytes >= ahead.size()) return socket.readSome(data, bytes);
      const long n = socket.readSome(ahead.data(), ahead.size());
      if (n <= 0) return n;
      aheadBegin = 0;
      aheadEnd = static_cast<size_t>(n);
    }
    const size_t n = std::min(bytes, aheadEnd - aheadBegin);
    std::memcpy(data, ahead.data() + aheadBegin, n);
    aheadBegin += n;
    return static_cast<long>(n);
  }
};

class SocketRecvComm final : public RecvComm, SocketComm<RecvRequest, RecvLane> {
 public:
  SocketRecvComm(std::vector<Socket> sockets, std::vector<Socket> otherDirection, int keepaliveMs)
      : SocketComm(std::move(sockets), std::move(otherDirection), keepaliveMs, "receiving from") {}
  using SocketComm::otherDirection;
  int keepaliveMs() const { return keepaliveMs_; }

  std::unique_ptr<MemoryRegion> registerMemory(void*, size_t) override {
    return std::make_unique<SocketMemoryRegion>();
  }

  Request* irecv(void* data, size_t capacity, MemoryRegion*) override {
    if (requests_.full()) return nullptr;
    RecvRequest& r = requests_.next();
    r.data = static_cast<uint8_t*>(data);
    r.capacity = capacity;
    return &r;
  }

  bool test(Request* request, size_t* bytes) override {
    auto& r = *static_cast<RecvRequest*>(request);
    checkTestOrder(r);
    if (!done(r))
      for (int i = 0; i < socketCount(); ++i)
        if (!lanes_[i].ended) progress(i);
    if (!done(r)) {
      failIfNothingMoreComes();  // messages a failed peer sent before failing are still taken
      return false;
    }
    *bytes = r.messageBytes;
    requests_.reportDone();
    return true;
  }

  void pollDescriptors(std::vector<pollfd>& out) const override {
    for (const RecvLane& lane : lanes_)
      if (!lane.stalled && !lane.ended) out.push_back({lane.socket.fd(), POLLIN, 0});
  }

  void checkPeer() override { failIfNothingMoreComes(); }

  // The sockets' receive low-water mark: poll() reports fewer bytes as not readable, while a read
  // returns whatever there is and an end or error still wakes. Linux clamps the receive window to
  // the mark where twice the mark exceeds the receive buffer (tcp_set_rcvlowat): callers keep it
  // far below (the default buffer is 128 KiB).
  void setPollThreshold(size_t bytes) override {
    for (const RecvLane& lane : lanes_)
      if (lane.socket.valid())
        setOption(lane.socket.fd(), SOL_SOCKET, SO_RCVLOWAT, static_cast<int>(bytes),
                  "SO_RCVLOWAT");
  }

 private:
  static bool done(const RecvRequest& r) { return r.sized && r.received == r.messageBytes; }

  // True when `n` bytes arrived; false when none are there yet; throws on EOF and errors.
  bool arrived(long n, const RecvLane& lane) const {
    if (n > 0) return true;
    if (n == -EAGAIN || n == -EINTR) return false;
    if (n < 0) failTransfer(lane.activity, static_cast<int>(-n), keepaliveMs_);
    if (lane.headerHave > 0)
      fail(braidRemoteError,
           "{}: the peer closed the connection in the middle of a frame ({} of {} header bytes, "
           "{} of {} payload bytes): truncated frame",
           lane.activity, lane.headerHave, kHeaderBytes, lane.payloadHave,
           lane.headerHave == kHeaderBytes ? lane.header.bytes : 0);
    fail(braidRemoteError, "{}: the peer closed the connection (its process exited?)",
         lane.activity);
  }

  // What can be checked before the message is posted: the magic and the order of messages.
  void checkHeader(const RecvLane& lane) const {
    const FrameHeader& h = lane.header;
    if (h.magic != wire::kFrameMagic)
      fail(braidRemoteError,
           "{}: a frame with bad magic 0x{:08x} (expected 0x{:08x}): not a braid peer, or a "
           "corrupt stream",
           lane.activity, h.magic, wire::kFrameMagic);
    if (h.flags == wire::kRankFailed) {
      if (h.bytes > kMaxReasonBytes)
        fail(braidRemoteError,
             "{}: the peer's rank failed, and its frame announces a {}-byte reason (at most {}): "
             "malformed frame",
             lane.activity, h.bytes, kMaxReasonBytes);
      return;
    }
    if (h.flags != 0)
      fail(braidRemoteError, "{}: a frame with unknown flags 0x{:x}", lane.activity, h.flags);
    if (h.seq < requests_.reported())
      fail(braidRemoteError, "{}: a frame of message #{}, which is already complete", lane.activity,
           h.seq);
    if (lane.anyFrame && h.seq <= lane.lastSeq)
      fail(braidRemoteError, "{}: a frame of message #{} after one of message #{}: out of order",
           lane.activity, h.seq, lane.lastSeq);
  }

  // Matches the header with its request: the size must fit, agree with the other parts, and the
  // part must be exactly the one this socket carries (the shared socket: a whole message, of any
  // size, since the sender's segment is its own to know).
  void place(int index, RecvRequest& r) const {
    const RecvLane& lane = lanes_[index];
    const FrameHeader& h = lane.header;
    if (h.messageBytes > r.capacity)
      fail(braidRemoteError,
           "{}: message #{} announces {} bytes but the receive buffer holds {}: oversized frame "
           "(ranks with different BRAID_BUFFSIZE or BRAID_FIFO_SLOTS?)",
           lane.activity, h.seq, h.messageBytes, r.capacity);
    if (r.sized && h.messageBytes != r.messageBytes)
      fail(braidRemoteError, "{}: parts of message #{} announce {} and {} bytes", lane.activity,
           h.seq, r.messageBytes, h.messageBytes);
    const std::optional<wire::PartRange> expected =
        partOnLane(h.seq, h.messageBytes, index == 0, index, ownLanes());
    if (expected != wire::PartRange{h.offset, h.bytes})
      fail(braidRemoteError,
           "{}: a malformed frame: bytes [{}, +{}) of the {}-byte message #{}, where this socket "
           "carries {}",
           lane.activity, h.offset, h.bytes, h.messageBytes, h.seq,
           expected ? fmt::format("bytes [{}, +{})", expected->offset, expected->bytes)
                    : std::string("no part of it"));
    // A message comes whole on the shared socket or in parts on the direction's own, not both.
    if (r.sized && (index == 0) != r.onShared)
      fail(braidRemoteError,
           "{}: a malformed frame: message #{} came both on the shared socket and in parts on "
           "this direction's own",
           lane.activity, h.seq);
    r.sized = true;
    r.onShared = index == 0;
    r.messageBytes = h.messageBytes;
  }

  // Reads what arrived of a rank-failed frame's reason (its size checked with the header); once it
  // is whole, the socket carries nothing more, and the peer's failure is kept for test() to tell
  // once the messages sent before it are taken.
  void readReason(RecvLane& lane) {
    const uint64_t bytes = lane.header.bytes;
    lane.reason.resize(bytes);
    while (lane.payloadHave < bytes) {
      const long n = lane.read(lane.reason.data() + lane.payloadHave, bytes - lane.payloadHave);
      if (!arrived(n, lane)) return;
      lane.payloadHave += n;
    }
    if (!peerFailure_ || lane.header.seq < sentBeforeFailure_) {
      peerFailure_ = fmt::format("{}: the peer's rank failed: {}", lane.activity, lane.reason);
      sentBeforeFailure_ = lane.header.seq;
    }
    lane.ended = true;
    lane.socket = Socket();
    failIfNothingMoreComes();
  }

  // The peer's failure, once every message it sent whole before failing is taken.
  void failIfNothingMoreComes() const {
    if (peerFailure_ && requests_.reported() >= sentBeforeFailure_)
      fail(braidRemoteError, "{}", *peerFailure_);
  }

  void progress(int index) {
    RecvLane& lane = lanes_[index];
    for (;;) {
      if (lane.headerHave < kHeaderBytes) {
        const long n = lane.read(reinterpret_cast<uint8_t*>(&lane.header) + lane.headerHave,
                                 kHeaderBytes - lane.headerHave);
        if (!arrived(n, lane)) return;
        lane.headerHave += n;
        if (lane.headerHave < kHeaderBytes) continue;
        if (lane.header.magic == wire::kFrameMagic && lane.header.flags == wire::kEndOfStream) {
          lane.ended = true;
          lane.socket = Socket();
          return;
        }
        checkHeader(lane);
      }
      const FrameHeader& h = lane.header;
      // A failed rank's reason needs no posted buffer: nothing follows it.
      if (h.flags == wire::kRankFailed) return readReason(lane);
      // Later messages wait in the socket until their buffer is posted: memory stays bounded.
      lane.stalled = h.seq >= requests_.posted();
      if (lane.stalled) return;
      RecvRequest& r = requests_.at(h.seq);
      if (!lane.placed) {
        place(index, r);
        lane.placed = true;
      }
      while (lane.payloadHave < h.bytes) {
        const long n = lane.read(r.data + h.offset + lane.payloadHave, h.bytes - lane.payloadHave);
        if (!arrived(n, lane)) return;
        lane.payloadHave += n;
      }
      r.received += h.bytes;
      lane.anyFrame = true;
      lane.lastSeq = h.seq;
      lane.headerHave = 0;
      lane.payloadHave = 0;
      lane.placed = false;
      // The next frame is parsed now only from bytes already read ahead: asking the socket for it
      // is a system call that usually finds nothing, on the path of the rank that waits for this
      // one. What the socket holds keeps its descriptor readable for the progress thread.
      if (lane.aheadBegin == lane.aheadEnd) return;
    }
  }

  std::optional<std::string> peerFailure_;  // a rank-failed frame's story
  uint64_t sentBeforeFailure_ = 0;          // the messages its rank sent whole before failing
};

// Connections on their way in: sockets whose hello is awaited, and connections waiting for the
// rest of their sockets.
class SocketListenComm final : public ListenComm {
 public:
  SocketListenComm(Socket listener, const uint8_t* token, int keepaliveMs)
      : listener_(std::move(listener)),
        where_("NET/Socket listener at " + listener_.localAddress().toString()),
        keepaliveMs_(keepaliveMs) {
    std::memcpy(token_, token, sizeof token_);
  }

  std::unique_ptr<RecvComm> accept(uint32_t* tag, Clock::time_point deadline) {
    for (;;) {
      if (std::unique_ptr<RecvComm> comm = takeComplete(tag)) return comm;
      if (Clock::now() >= deadline)
        fail(braidTimeout, "{}: no complete connection arrived before the deadline ({} pending)",
             where_, pending_.size() + waiting_.size());
      admitArrivals(deadline);
    }
  }

  // What has arrived is taken in without waiting; a connection complete by then, or nullptr.
  std::unique_ptr<RecvComm> acceptReady(uint32_t* tag) {
    admitArrivals(Clock::now());
    return takeComplete(tag);
  }

  void pollDescriptors(std::vector<pollfd>& out) const override {
    out.push_back({listener_.fd(), POLLIN, 0});
    for (const Pending& p : pending_) out.push_back({p.socket.fd(), POLLIN, 0});
  }

 private:
  std::unique_ptr<RecvComm> takeComplete(uint32_t* tag) {
    if (complete_.empty()) return nullptr;
    Connection c = std::move(complete_.front());
    complete_.pop_front();
    *tag = c.tag;
    std::vector<Socket> back;
    std::vector<Socket> forward = forwardSockets(std::move(c.sockets), &back);
    return std::make_unique<SocketRecvComm>(std::move(forward), std::move(back), keepaliveMs_);
  }

  // Drops connections silent past their hello's deadline, then waits until `wake` at most for new
  // connections and hello bytes, and takes in what arrived.
  void admitArrivals(Clock::time_point wake) {
    const Clock::time_point now = Clock::now();
    std::erase_if(pending_, [&](const Pending& p) {
      if (now < p.helloDeadline) return false;
      drop(p, fmt::format("no complete hello within {} s ({} of {} bytes)", kHelloTimeout.count(),
                          p.have, sizeof(Hello)));
      return true;
    });
    std::vector<pollfd> fds{{listener_.fd(), POLLIN, 0}};
    for (const Pending& p : pending_) {
      wake = std::min(wake, p.helloDeadline);
      fds.push_back({p.socket.fd(), POLLIN, 0});
    }
    const int rc = ::poll(fds.data(), fds.size(), pollTimeoutMs(wake));
    if (rc < 0 && errno != EINTR) failErrno(braidSystemError, where_ + ": poll", errno);
    if (rc <= 0) return;
    for (size_t i = 0; i < pending_.size(); ++i)
      if (fds[i + 1].revents != 0) readHello(pending_[i]);
    std::erase_if(pending_, [](const Pending& p) { return !p.socket.valid(); });
    if ((fds[0].revents & POLLIN) != 0) acceptWaiting();
  }

  struct Pending {
    Socket socket;
    Clock::time_point helloDeadline;
    Hello hello;
    size_t have = 0;
  };
  struct Connection {
    uint32_t tag = 0;
    std::vector<Socket> sockets;  // by index; invalid until that socket arrives
    int arrived = 0;
  };

  void drop(const Pending& p, const std::string& why) const {
    BRAID_WARN(log::kNet, "{}: dropped the connection from {}: {}", where_, p.socket.peerName(),
               why);
  }

  void acceptWaiting() {
    for (Socket s = listener_.acceptPending(); s.valid(); s = listener_.acceptPending()) {
      if (pending_.size() >= kMaxPendingSockets) {
        BRAID_WARN(log::kNet, "{}: refused the connection from {}: {} connections await a hello",
                   where_, s.peerName(), pending_.size());
        continue;
      }
      pending_.push_back({std::move(s), Clock::now() + kHelloTimeout, Hello{}, 0});
    }
  }

  // Reads what arrived of a hello; a complete one joins its connection, a bad one is dropped (its
  // socket left invalid for the caller to sweep away).
  void readHello(Pending& p) {
    for (;;) {
      const long n =
          p.socket.readSome(reinterpret_cast<uint8_t*>(&p.hello) + p.have, sizeof(Hello) - p.have);
      if (n == -EAGAIN || n == -EINTR) return;
      if (n <= 0) {
        drop(p, n == 0 ? fmt::format("closed after {} hello bytes", p.have)
                       : fmt::format("read failed: {}", std::strerror(static_cast<int>(-n))));
        p.socket = Socket();
        return;
      }
      p.have += n;
      if (p.have < sizeof(Hello)) continue;
      if (std::optional<std::string> why = admit(p)) {
        drop(p, *why);
        p.socket = Socket();
      }
      return;
    }
  }

  // Files a socket with a complete hello under its connection; says why it cannot be.
  std::optional<std::string> admit(Pending& p) {
    const Hello& h = p.hello;
    if (h.magic != wire::kHelloMagic) return fmt::format("bad magic 0x{:016x}", h.magic);
    if (std::memcmp(h.token, token_, sizeof token_) != 0)
      return std::string("wrong token (not a rank of this communicator)");
    if (h.sockets < 1 || h.sockets > wire::kMaxConnectionSockets || h.sockets % 2 == 0 ||
        h.socket >= h.sockets)
      return fmt::format(
          "socket {} of {} (a connection has 1 + 2n sockets, at most {}: one shared, n for "
          "each direction)",
          h.socket, h.sockets, wire::kMaxConnectionSockets);
    Connection& c = waiting_[{h.tag, h.connection}];
    if (c.sockets.empty()) {
      c.tag = h.tag;
      c.sockets.resize(h.sockets);
    }
    if (c.sockets.size() != h.sockets || c.sockets[h.socket].valid())
      return fmt::format("socket {} of {} of tag {}'s connection {} does not fit it", h.socket,
                         h.sockets, h.tag, h.connection);
    enableKeepalive(p.socket.fd(), keepaliveMs_);
    c.sockets[h.socket] = std::move(p.socket);
    if (++c.arrived == static_cast<int>(c.sockets.size())) {
      complete_.push_back(std::move(c));
      waiting_.erase({h.tag, h.connection});
    }
    return std::nullopt;
  }

  Socket listener_;
  std::string where_;
  int keepaliveMs_;
  uint8_t token_[wire::kTokenBytes];
  std::vector<Pending> pending_;
  std::map<std::pair<uint32_t, uint32_t>, Connection> waiting_;  // by (tag, connection)
  std::deque<Connection> complete_;
};

std::string readSysfs(const std::filesystem::path& path) {
  std::string value;
  std::ifstream(path) >> value;
  return value;
}

}  // namespace

// Keepalive probes serve the side that waits for data: a socket with unacknowledged data in flight
// does not probe. A sender into a dead link learns of it from the ranks that receive across it
// (their failure reasons travel on, SendComm::abort). No TCP_USER_TIMEOUT: since Linux 5.11 it
// also ends a connection to a peer that is alive but has not read for that long (zero window).
void enableKeepalive(int fd, int keepaliveMs) {
  setOption(fd, SOL_SOCKET, SO_KEEPALIVE, 1, "SO_KEEPALIVE");
  setOption(fd, IPPROTO_TCP, TCP_KEEPIDLE, 1, "TCP_KEEPIDLE");
  setOption(fd, IPPROTO_TCP, TCP_KEEPINTVL, 1, "TCP_KEEPINTVL");
  setOption(fd, IPPROTO_TCP, TCP_KEEPCNT, std::max(1, (keepaliveMs + 999) / 1000), "TCP_KEEPCNT");
}

const NetInterface& InterfaceNet::checkedDevice(int device) const {
  if (device < 0 || device >= deviceCount())
    fail(braidInvalidArgument, "NET/{} has no device {} (it has {})", name(), device,
         deviceCount());
  return devices_[device];
}

DeviceProperties InterfaceNet::properties(int device) const {
  const NetInterface& i = checkedDevice(device);
  const std::filesystem::path sysfs = "/sys/class/net/" + i.name;
  DeviceProperties p;
  p.name = i.name;
  p.address = i.address.host();
  std::error_code error;
  // Physical NICs link to their PCI function; virtual interfaces have no device link.
  if (std::filesystem::exists(sysfs / "device", error))
    p.pciPath = std::filesystem::canonical(sysfs / "device", error).string();
  const std::string speed = readSysfs(sysfs / "speed");
  p.speedMbps = speed.empty() || speed[0] == '-' ? 0 : std::atoi(speed.c_str());
  return p;
}

namespace {

class SocketNet final : public InterfaceNet {
 public:
  SocketNet(std::vector<NetInterface> devices, SocketOptions options)
      : InterfaceNet(std::move(devices)), options_(options) {
    if (options_.socketsPerConnection < 1 || options_.socketsPerConnection > kMaxSockets)
      fail(braidInvalidArgument, "BRAID_NSOCKS={} is out of range (expected 1..{})",
           options_.socketsPerConnection, kMaxSockets);
    if (options_.keepaliveMs < 1)
      fail(braidInvalidArgument, "BRAID_SOCKET_KEEPALIVE_MS={} must be positive",
           options_.keepaliveMs);
  }

  const char* name() const override { return "Socket"; }

  std::unique_ptr<ListenComm> listen(int device, Handle* handle) override {
    SocketAddress address = checkedDevice(device).address;
    address.setPort(0);
    Socket listener = Socket::listen(address, false);
    uint8_t token[wire::kTokenBytes];
    fillRandom(token, sizeof token);
    *handle = wire::packHandle(listener.localAddress(), token);
    return std::make_unique<SocketListenComm>(std::move(listener), token, options_.keepaliveMs);
  }

  std::unique_ptr<SendComm> connect(int device, const Handle& handle, uint32_t tag,
                                    Clock::time_point deadline) override {
    checkedDevice(device);
    Hello hello;
    const SocketAddress address = wire::unpackHandle(handle, hello.token, "Socket");
    const std::string activity = "NET/Socket: connecting to " + address.toString();
    hello.tag = tag;
    fillRandom(&hello.connection, sizeof hello.connection);
    const int count = wire::connectionSockets(options_.socketsPerConnection);
    hello.sockets = static_cast<uint16_t>(count);
    std::vector<Socket> sockets;
    for (int i = 0; i < count; ++i) {
      // The peer's listener was up before its handle was published: a refusal is its end.
      Socket s = Socket::connect(address, address.toString(), deadline, activity,
                                 Socket::Refused::IsFinal);
      enableKeepalive(s.fd(), options_.keepaliveMs);
      hello.socket = static_cast<uint16_t>(i);
      s.sendAll(&hello, sizeof hello, deadline, activity);
      sockets.push_back(std::move(s));
    }
    std::vector<Socket> back;
    std::vector<Socket> forward = forwardSockets(std::move(sockets), &back);
    return std::make_unique<SocketSendComm>(std::move(forward), std::move(back),
                                            options_.keepaliveMs);
  }

  std::unique_ptr<RecvComm> accept(ListenComm& listener, uint32_t* tag,
                                   Clock::time_point deadline) override {
    return static_cast<SocketListenComm&>(listener).accept(tag, deadline);
  }

  bool acceptsWithoutWaiting() const override { return true; }
  std::unique_ptr<RecvComm> acceptReady(ListenComm& listener, uint32_t* tag) override {
    return static_cast<SocketListenComm&>(listener).acceptReady(tag);
  }

  // The other direction of a connection: the shared socket, each direction its own stream on it,
  // and that direction's own sockets. No hello (the connection proved itself).
  bool connectionsCarryBothWays() const override { return true; }
  std::unique_ptr<SendComm> sendBack(RecvComm& from) override {
    auto& recv = static_cast<SocketRecvComm&>(from);
    return std::make_unique<SocketSendComm>(recv.otherDirection(), std::vector<Socket>{},
                                            recv.keepaliveMs());
  }
  std::unique_ptr<RecvComm> receiveBack(SendComm& to) override {
    auto& send = static_cast<SocketSendComm&>(to);
    return std::make_unique<SocketRecvComm>(send.otherDirection(), std::vector<Socket>{},
                                            send.keepaliveMs());
  }

 private:
  SocketOptions options_;
};

}  // namespace

std::unique_ptr<Net> makeSocketNet(std::vector<NetInterface> devices, SocketOptions options) {
  return std::make_unique<SocketNet>(std::move(devices), options);
}

std::unique_ptr<RecvComm> receiveOver(std::vector<Socket> sockets, int keepaliveMs) {
  return std::make_unique<SocketRecvComm>(std::move(sockets), std::vector<Socket>{}, keepaliveMs);
}

}  // namespace braid::net
