// The TCP socket plug-in. A connection is a shared socket and, per direction, BRAID_NSOCKS
// sockets of its own. A message that fits one TCP segment travels whole on the shared socket,
// where the other side's next message carries its acknowledgement; a larger one is split into
// parts that travel side by side on its direction's sockets, where the acknowledgement the
// receiver sends at once (for two segments or more) meets no send of the receiver's own. Each
// part goes behind a header the receiver checks before it reads a byte of payload. Every socket is
// non-blocking, and every wait is a poll() bounded by a deadline or left to the caller (the proxy).
// A peer host that stops answering TCP keepalive probes turns into an error on the sockets that
// wait for it.
#pragma once

#include <bit>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/socket.h"
#include "transport/net/net.h"

namespace braid::net {

struct SocketOptions {
  // Sockets each direction owns, for messages of more than a segment: 1..kMaxSockets.
  int socketsPerConnection = 1;
  int keepaliveMs = 20000;  // unanswered keepalive probes for this long: the peer is unreachable
};

constexpr int kMaxSockets = 16;

// `devices` in order of preference (findInterfaces); device i of the plug-in is devices[i].
std::unique_ptr<Net> makeSocketNet(std::vector<NetInterface> devices, SocketOptions options);

// Probes a TCP connection that is idle every second; `keepaliveMs` without an answer ends it with
// ETIMEDOUT.
void enableKeepalive(int fd, int keepaliveMs);

// A plug-in whose devices are network interfaces (`devices`, in order of preference): sockets, and
// UCX, whose connection manager listens on an interface's address.
class InterfaceNet : public Net {
 public:
  explicit InterfaceNet(std::vector<NetInterface> devices) : devices_(std::move(devices)) {}
  int deviceCount() const override { return static_cast<int>(devices_.size()); }
  // Name, address, PCI function and speed, from sysfs.
  DeviceProperties properties(int device) const override;

 protected:
  const NetInterface& checkedDevice(int device) const;

 private:
  std::vector<NetInterface> devices_;
};

// The receiving side of a connection over sockets that passed the handshake: what reads frames a
// peer sends, the shared socket first, then the direction's own. For tests and the fuzz target
// that play that peer.
std::unique_ptr<RecvComm> receiveOver(std::vector<Socket> sockets, int keepaliveMs);

// What travels on the sockets, exposed for tests that play a misbehaving peer. Hosts of one job
// share the byte order, which must be little-endian.
namespace wire {

static_assert(std::endian::native == std::endian::little);

constexpr uint64_t kHelloMagic = 0x314e2d6469617262;  // "braid-N1"
constexpr uint32_t kFrameMagic = 0x46646962;          // "bidF"
constexpr size_t kTokenBytes = 16;
// Parts are at least this large: smaller messages travel whole on one socket.
constexpr uint64_t kMinPartBytes = 32 << 10;

// The sockets of a connection with `lanes` sockets per direction: socket 0 is shared by both
// directions; sockets 1..lanes carry the connecting side's larger messages, the next `lanes` the
// accepting side's.
constexpr int connectionSockets(int lanes) {
  return 1 + 2 * lanes;
}
constexpr int kMaxConnectionSockets = connectionSockets(kMaxSockets);

// The first bytes on every socket of a connection.
struct Hello {
  uint64_t magic = kHelloMagic;
  uint8_t token[kTokenBytes] = {};  // the listener's, from its handle: proves who sent the handle
  uint32_t tag = 0;                 // the connecting rank
  uint32_t connection = 0;          // random per connect(): groups the sockets of one connection
  uint16_t socket = 0;              // this socket's index in the connection
  uint16_t sockets = 0;             // sockets in the connection
  uint32_t reserved = 0;
};
static_assert(sizeof(Hello) == 40);

// Flags of a frame header.
constexpr uint32_t kEndOfStream = 1;  // the sender closes this socket on purpose; nothing follows
// The sender's rank failed: `bytes` (at most kMaxReasonBytes) of its reason follow, and nothing
// after them. Its other fields are unused.
constexpr uint32_t kRankFailed = 2;

// Precedes each part of a message. A message on the shared socket is one part; one on its
// direction's N sockets is split, and its part p travels on the direction's socket (seq + p) % N.
struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint32_t flags = 0;
  uint64_t seq = 0;           // message number on this connection, from 0
  uint64_t messageBytes = 0;  // the whole message
  uint64_t offset = 0;        // of this part in the message
  uint64_t bytes = 0;         // of this part; its payload follows the header
};
static_assert(sizeof(FrameHeader) == 40);

// What a listener's Handle holds.
struct HandleContents {
  uint8_t family;  // 4 or 6
  uint8_t reserved;
  uint16_t port;
  uint8_t address[16];  // network order; IPv4 in the first 4 bytes
  uint8_t token[kTokenBytes];
};
static_assert(sizeof(HandleContents) <= sizeof(Handle));

// A listener's handle: where it is bound and its token.
Handle packHandle(const SocketAddress& bound, const uint8_t* token);
// The address in `handle`, its token copied to `token`; a malformed handle is braidInvalidArgument
// naming `plugin`.
SocketAddress unpackHandle(const Handle& handle, uint8_t* token, const char* plugin);

struct PartRange {
  uint64_t offset;
  uint64_t bytes;
  bool operator==(const PartRange&) const = default;
};

// How many parts a message of `bytes` is split into over `sockets` sockets (at least 1, so an
// empty message still sends one header).
int messageParts(uint64_t bytes, int sockets);
// Part `part` of `parts`: equal shares in order, none empty unless the message is.
PartRange messagePart(uint64_t bytes, int parts, int part);
// The socket that carries part `part` of message `seq`, and the part a socket carries.
int socketOfPart(uint64_t seq, int part, int sockets);
int partOnSocket(uint64_t seq, int socket, int sockets);

}  // namespace wire
}  // namespace braid::net
