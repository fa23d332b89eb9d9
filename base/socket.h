// TCP building blocks shared by the bootstrap and the socket transport: addresses, the choice of
// interface, and non-blocking sockets whose every wait honours a deadline.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/wait.h"

namespace braid {

// An IPv4 or IPv6 address with a port.
class SocketAddress {
 public:
  SocketAddress() = default;
  SocketAddress(const sockaddr* address, socklen_t length);

  // A numeric address ("10.0.0.1", "fd00::2"); `origin` names where the text came from.
  static SocketAddress fromNumeric(const std::string& host, uint16_t port,
                                   const std::string& origin);
  // A host name or numeric address, resolved to a numeric one; IPv4 preferred.
  static SocketAddress resolve(const std::string& host, uint16_t port, const std::string& origin);
  // Every local address of `family` (AF_INET or AF_INET6).
  static SocketAddress wildcard(int family, uint16_t port);
  // From the 4 (IPv4) or 16 (IPv6) address bytes in network order.
  static SocketAddress fromBytes(int family, const uint8_t* bytes, uint16_t port);

  int family() const { return storage_.ss_family; }
  uint16_t port() const;
  void setPort(uint16_t port);
  // The address bytes in network order: 4 for IPv4, 16 for IPv6.
  std::vector<uint8_t> bytes() const;
  std::string host() const;      // numeric
  std::string toString() const;  // host:port, or [host]:port for IPv6
  bool operator==(const SocketAddress& other) const;

  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage_); }
  socklen_t length() const;

 private:
  sockaddr_storage storage_{};
};

// Splits "host:port" or "[ipv6]:port"; throws braidInvalidArgument naming `origin`.
std::pair<std::string, uint16_t> splitHostPort(const std::string& text, const std::string& origin);

struct NetInterface {
  std::string name;
  SocketAddress address;
};

// Whether interface `name` passes a BRAID_SOCKET_IFNAME-style filter: comma-separated name
// prefixes; a leading ^ excludes the listed ones; a leading = (after any ^) means exact names.
bool interfaceMatches(const std::string& name, const std::string& filter);

// UP interfaces with a usable address that pass `filter`, IPv4 addresses before IPv6 ones (IPv6
// link-local addresses are skipped: an address alone cannot name their scope). An empty filter
// means every interface except loopback and docker*/virbr* bridges, or loopback if nothing else
// is up. A non-empty filter that matches nothing is an error.
std::vector<NetInterface> findInterfaces(const std::string& filter);

// The interface for bootstrap traffic: the first of findInterfaces(BRAID_SOCKET_IFNAME). Chosen
// once per process and logged.
const NetInterface& bootstrapInterface();

// An owned, non-blocking, close-on-exec TCP socket. Blocking operations wait with poll() and fail
// with braidTimeout when the deadline passes; a closed peer is braidRemoteError. Errors read
// "<activity>: <what happened with peerName()>".
class Socket {
 public:
  Socket() = default;
  Socket(int fd, std::string peerName) : fd_(fd), peerName_(std::move(peerName)) {}
  Socket(Socket&& other) noexcept;
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket();

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  // How errors name the other end, e.g. "rank 3 (10.0.0.4:41000)".
  const std::string& peerName() const { return peerName_; }
  void setPeerName(std::string name) { peerName_ = std::move(name); }

  // Listens on `address`; port 0 picks an ephemeral port.
  static Socket listen(const SocketAddress& address, bool reuseAddress);
  // The same, but where the port is taken (at bind, or at listen after another socket with
  // SO_REUSEADDR bound it too) returns an invalid Socket with the errno in *bindErrno.
  static Socket listen(const SocketAddress& address, bool reuseAddress, int* bindErrno);
  // Whether a refused connection is tried again: the listener may not be up yet (a rendezvous), or
  // it was up before and a refusal means its process has ended (a peer's listener, known at init).
  enum class Refused { RetryUntilDeadline, IsFinal };
  // Connects to `address`, retrying unreachable attempts (and refused ones, unless final) until
  // the deadline.
  static Socket connect(const SocketAddress& address, std::string peerName,
                        Clock::time_point deadline, const std::string& activity,
                        Refused refused = Refused::RetryUntilDeadline);
  // One connection waiting on this listener, or an invalid Socket if none is; never waits.
  Socket acceptPending();
  // Another descriptor of this socket: a listener that several servers use in turn.
  Socket duplicate() const;

  SocketAddress localAddress() const;

  // Reads what is available, up to `bytes`, without waiting: the count read, 0 when the peer
  // closed the connection, -EAGAIN when nothing is available, or -errno.
  long readSome(void* data, size_t bytes);

  void sendAll(const void* data, size_t bytes, Clock::time_point deadline,
               const std::string& activity);
  void recvAll(void* data, size_t bytes, Clock::time_point deadline, const std::string& activity);

 private:
  int fd_ = -1;
  std::string peerName_;
};

// Whether `to` closing its end before the exchange ends fails it. In a ring step before the last,
// `to` still needs what this rank sends later, so its close means it failed or its process ended;
// in the last, `to` may have taken all it needs and left (a FIN after everything was read).
enum class WhenToCloses { Fails, MayHaveEnded };
// Sends `outBytes` to `to` while receiving `inBytes` from `from`, so that ranks that all send at
// once (a ring step) cannot block each other on full socket buffers.
void sendRecv(Socket& to, const void* out, size_t outBytes, Socket& from, void* in, size_t inBytes,
              Clock::time_point deadline, const std::string& activity,
              WhenToCloses toCloses = WhenToCloses::MayHaveEnded);

// Milliseconds until the deadline for poll(): rounded up, 0 once it has passed.
int pollTimeoutMs(Clock::time_point deadline);

}  // namespace braid
