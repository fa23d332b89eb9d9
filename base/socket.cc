#include "base/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <string_view>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "base/params.h"

namespace braid {

// ---- addresses ----

SocketAddress::SocketAddress(const sockaddr* address, socklen_t length) {
  std::memcpy(&storage_, address, std::min<size_t>(length, sizeof storage_));
}

SocketAddress SocketAddress::fromNumeric(const std::string& host, uint16_t port,
                                         const std::string& origin) {
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1)
    return fromBytes(AF_INET, reinterpret_cast<const uint8_t*>(&v4), port);
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1)
    return fromBytes(AF_INET6, reinterpret_cast<const uint8_t*>(&v6), port);
  fail(braidInvalidArgument, "{}: '{}' is not a numeric IPv4 or IPv6 address", origin, host);
}

SocketAddress SocketAddress::resolve(const std::string& host, uint16_t port,
                                     const std::string& origin) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0)
    fail(braidInvalidArgument, "{}: cannot resolve host '{}': {}", origin, host, gai_strerror(rc));
  const addrinfo* chosen = nullptr;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      chosen = a;
      break;
    }
    if (a->ai_family == AF_INET6 && chosen == nullptr) chosen = a;
  }
  if (chosen == nullptr) {
    freeaddrinfo(found);
    fail(braidInvalidArgument, "{}: host '{}' has no IPv4 or IPv6 address", origin, host);
  }
  SocketAddress address(chosen->ai_addr, chosen->ai_addrlen);
  freeaddrinfo(found);
  address.setPort(port);
  return address;
}

SocketAddress SocketAddress::wildcard(int family, uint16_t port) {
  static const uint8_t kZeros[16] = {};
  return fromBytes(family, kZeros, port);
}

SocketAddress SocketAddress::fromBytes(int family, const uint8_t* bytes, uint16_t port) {
  SocketAddress address;
  if (family == AF_INET) {
    auto* v4 = reinterpret_cast<sockaddr_in*>(&address.storage_);
    v4->sin_family = AF_INET;
    std::memcpy(&v4->sin_addr, bytes, 4);
  } else if (family == AF_INET6) {
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&address.storage_);
    v6->sin6_family = AF_INET6;
    std::memcpy(&v6->sin6_addr, bytes, 16);
  } else {
    fail(braidInvalidArgument, "address family {} is neither IPv4 nor IPv6", family);
  }
  address.setPort(port);
  return address;
}

uint16_t SocketAddress::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage_)->sin_port);
  if (family() == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_port);
  return 0;
}

void SocketAddress::setPort(uint16_t port) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage_)->sin_port = htons(port);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage_)->sin6_port = htons(port);
}

std::vector<uint8_t> SocketAddress::bytes() const {
  if (family() == AF_INET) {
    auto* a = reinterpret_cast<const uint8_t*>(
        &reinterpret_cast<const sockaddr_in*>(&storage_)->sin_addr);
    return {a, a + 4};
  }
  if (family() == AF_INET6) {
    auto* a = reinterpret_cast<const uint8_t*>(
        &reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr);
    return {a, a + 16};
  }
  return {};
}

std::string SocketAddress::host() const {
  char text[INET6_ADDRSTRLEN] = {};
  std::vector<uint8_t> raw = bytes();
  if (raw.empty() || inet_ntop(family(), raw.data(), text, sizeof text) == nullptr) return "?";
  return text;
}

std::string SocketAddress::toString() const {
  if (family() == AF_INET6) return fmt::format("[{}]:{}", host(), port());
  return fmt::format("{}:{}", host(), port());
}

bool SocketAddress::operator==(const SocketAddress& other) const {
  return family() == other.family() && port() == other.port() && bytes() == other.bytes();
}

socklen_t SocketAddress::length() const {
  return family() == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

std::pair<std::string, uint16_t> splitHostPort(const std::string& text, const std::string& origin) {
  std::string host, port;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      fail(braidInvalidArgument, "{}='{}' is not [ipv6-address]:port", origin, text);
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos)
      fail(braidInvalidArgument, "{}='{}' is not host:port", origin, text);
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string::npos)
      fail(braidInvalidArgument, "{}='{}': write an IPv6 address as [address]:port", origin, text);
  }
  char* end = nullptr;
  errno = 0;
  long value = port.empty() ? 0 : std::strtol(port.c_str(), &end, 10);
  if (host.empty() || port.empty() || errno != 0 || *end != '\0' || value < 1 || value > 65535)
    fail(braidInvalidArgument, "{}='{}' needs a host and a port between 1 and 65535", origin, text);
  return {host, static_cast<uint16_t>(value)};
}

// ---- interfaces ----

bool interfaceMatches(const std::string& name, const std::string& filter) {
  std::string_view list = filter;
  const bool exclude = !list.empty() && list.front() == '^';
  if (exclude) list.remove_prefix(1);
  const bool exact = !list.empty() && list.front() == '=';
  if (exact) list.remove_prefix(1);
  bool listed = false;
  while (!list.empty()) {
    size_t comma = std::min(list.find(','), list.size());
    std::string_view item = list.substr(0, comma);
    if (!item.empty() && (exact ? name == item : name.starts_with(item))) listed = true;
    list.remove_prefix(std::min(comma + 1, list.size()));
  }
  return listed != exclude;
}

namespace {

// Every UP interface address that can be dialled, in the order the kernel lists them.
struct InterfaceAddress {
  NetInterface interface;
  bool loopback;
};

std::vector<InterfaceAddress> listInterfaceAddresses() {
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) failErrno(braidSystemError, "listing network interfaces", errno);
  std::vector<InterfaceAddress> found;
  for (const ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_flags & IFF_UP) == 0) continue;
    int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    if (family == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr))
      continue;
    SocketAddress address(i->ifa_addr,
                          family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    address.setPort(0);
    found.push_back({{i->ifa_name, address}, (i->ifa_flags & IFF_LOOPBACK) != 0});
  }
  freeifaddrs(all);
  return found;
}

template <typename Keep>
std::vector<NetInterface> selectInterfaces(const std::vector<InterfaceAddress>& all, Keep keep) {
  std::vector<NetInterface> chosen;
  for (int family : {AF_INET, AF_INET6})
    for (const InterfaceAddress& a : all)
      if (a.interface.address.family() == family && keep(a)) chosen.push_back(a.interface);
  // IPv6 only where no IPv4 address qualifies.
  if (!chosen.empty() && chosen.front().address.family() == AF_INET)
    std::erase_if(chosen, [](const NetInterface& i) { return i.address.family() != AF_INET; });
  return chosen;
}

}  // namespace

std::vector<NetInterface> findInterfaces(const std::string& filter) {
  std::vector<InterfaceAddress> all = listInterfaceAddresses();
  if (!filter.empty()) {
    std::vector<NetInterface> chosen = selectInterfaces(
        all, [&](const InterfaceAddress& a) { return interfaceMatches(a.interface.name, filter); });
    if (chosen.empty()) {
      std::string names;
      for (const InterfaceAddress& a : all)
        if (names.find(a.interface.name) == std::string::npos)
          names += (names.empty() ? "" : ", ") + a.interface.name;
      fail(braidInvalidArgument,
           "BRAID_SOCKET_IFNAME='{}' matches no UP interface with an address (there are: {})",
           filter, names);
    }
    return chosen;
  }
  std::vector<NetInterface> chosen = selectInterfaces(all, [](const InterfaceAddress& a) {
    return !a.loopback && !a.interface.name.starts_with("docker") &&
           !a.interface.name.starts_with("virbr");
  });
  if (chosen.empty())
    chosen = selectInterfaces(all, [](const InterfaceAddress& a) { return a.loopback; });
  return chosen;
}

const NetInterface& bootstrapInterface() {
  static const NetInterface chosen = [] {
    const std::string& filter = param::SocketIfname();
    std::vector<NetInterface> found = findInterfaces(filter);
    if (found.empty()) fail(braidSystemError, "no UP network interface has an address");
    BRAID_INFO(log::kBootstrap, "bootstrap interface {} {} (BRAID_SOCKET_IFNAME='{}')",
               found.front().name, found.front().address.host(), filter);
    return found.front();
  }();
  return chosen;
}

// ---- sockets ----

int pollTimeoutMs(Clock::time_point deadline) {
  auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

namespace {

int openTcpSocket(int family) {
  int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) failErrno(braidSystemError, "creating a TCP socket", errno);
  return fd;
}

// Bootstrap and control messages are small and latency-bound; Nagle would hold them back.
void setNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

bool isRetryableConnectError(int err) {
  switch (err) {
    case ECONNREFUSED:
    case ETIMEDOUT:
    case ENETUNREACH:
    case EHOSTUNREACH:
    case ECONNRESET:
    case ECONNABORTED:
    case EAGAIN:
    case EINTR:
    case EADDRNOTAVAIL: return true;
    default: return false;
  }
}

// One connect attempt: 0 on success, else the errno; ETIMEDOUT when the deadline cut it short.
int tryConnect(int fd, const SocketAddress& address, Clock::time_point deadline) {
  if (::connect(fd, address.get(), address.length()) == 0) return 0;
  if (errno != EINPROGRESS) return errno;
  pollfd p{fd, POLLOUT, 0};
  for (;;) {
    int rc = ::poll(&p, 1, pollTimeoutMs(deadline));
    if (rc > 0) break;
    if (rc == 0) return ETIMEDOUT;
    if (errno != EINTR) return errno;
  }
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
  return err;
}

// Sends what `to` takes now, counting it in `sent`; fails where `to` has closed.
void sendAvailable(Socket& to, const char* out, size_t outBytes, size_t& sent,
                   const std::string& activity) {
  ssize_t n = ::send(to.fd(), out + sent, outBytes - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n > 0) {
    sent += n;
  } else if (errno == EPIPE || errno == ECONNRESET) {
    fail(braidRemoteError, "{}: {} closed the connection (sent {} of {} bytes)", activity,
         to.peerName(), sent, outBytes);
  } else if (errno != EAGAIN && errno != EINTR) {
    failErrno(braidSystemError, fmt::format("{}: sending to {}", activity, to.peerName()), errno);
  }
}

// Receives what has come from `from`, counting it in `received`; fails where `from` has closed.
void receiveAvailable(Socket& from, char* in, size_t inBytes, size_t& received,
                      const std::string& activity) {
  long n = from.readSome(in + received, inBytes - received);
  if (n > 0) {
    received += n;
  } else if (n == 0 || n == -ECONNRESET) {
    fail(braidRemoteError, "{}: {} closed the connection (received {} of {} bytes)", activity,
         from.peerName(), received, inBytes);
  } else if (n != -EAGAIN && n != -EINTR) {
    failErrno(braidSystemError, fmt::format("{}: receiving from {}", activity, from.peerName()),
              static_cast<int>(-n));
  }
}

// Moves bytes both ways at once; either side may be absent (zero bytes). Where `to` closing
// fails the exchange, its end is watched until the exchange ends, its part sent or not.
void transfer(Socket* to, const char* out, size_t outBytes, Socket* from, char* in, size_t inBytes,
              Clock::time_point deadline, const std::string& activity,
              WhenToCloses toCloses = WhenToCloses::MayHaveEnded) {
  const bool watchTo = to != nullptr && toCloses == WhenToCloses::Fails;
  size_t sent = 0, received = 0;
  while (sent < outBytes || received < inBytes) {
    pollfd fds[2];
    int count = 0, sendIndex = -1, recvIndex = -1;
    if (sent < outBytes || watchTo) {
      const int events = (sent < outBytes ? POLLOUT : 0) | (watchTo ? POLLRDHUP : 0);
      fds[count] = {to->fd(), static_cast<short>(events), 0};
      sendIndex = count++;
    }
    if (received < inBytes) {
      fds[count] = {from->fd(), POLLIN, 0};
      recvIndex = count++;
    }
    int timeout = pollTimeoutMs(deadline);
    if (timeout == 0) {
      if (recvIndex >= 0)
        fail(braidTimeout, "{}: timed out waiting for {} (received {} of {} bytes)", activity,
             from->peerName(), received, inBytes);
      fail(braidTimeout, "{}: timed out waiting for {} to take data (sent {} of {} bytes)",
           activity, to->peerName(), sent, outBytes);
    }
    int rc = ::poll(fds, count, timeout);
    if (rc < 0 && errno != EINTR) failErrno(braidSystemError, activity + ": poll", errno);
    if (rc <= 0) continue;
    if (sendIndex >= 0 && sent < outBytes && fds[sendIndex].revents != 0)
      sendAvailable(*to, out, outBytes, sent, activity);
    if (recvIndex >= 0 && fds[recvIndex].revents != 0)
      receiveAvailable(*from, in, inBytes, received, activity);
    // After what came: `to` may have failed on what it received, having sent its part first.
    const bool ended = sent == outBytes && received == inBytes;
    if (!ended && sendIndex >= 0 && watchTo &&
        (fds[sendIndex].revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0)
      fail(braidRemoteError,
           "{}: {} closed the connection before it had all this rank sends it (its process "
           "ended or it failed)",
           activity, to->peerName());
  }
}

}  // namespace

Socket::Socket(Socket&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), peerName_(std::move(other.peerName_)) {}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    peerName_ = std::move(other.peerName_);
  }
  return *this;
}

Socket::~Socket() {
  if (fd_ >= 0) ::close(fd_);
}

Socket Socket::listen(const SocketAddress& address, bool reuseAddress) {
  int err = 0;
  Socket s = listen(address, reuseAddress, &err);
  if (!s.valid())
    failErrno(braidSystemError, fmt::format("binding a listening socket to {}", address.toString()),
              err);
  return s;
}

Socket Socket::listen(const SocketAddress& address, bool reuseAddress, int* bindErrno) {
  Socket s(openTcpSocket(address.family()), "");
  if (reuseAddress) {
    int one = 1;
    setsockopt(s.fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  }
  if (::bind(s.fd_, address.get(), address.length()) != 0) {
    *bindErrno = errno;
    return Socket();
  }
  if (::listen(s.fd_, SOMAXCONN) != 0) {
    // Sockets with SO_REUSEADDR may all bind a port none of them listens on yet; the second to
    // listen finds it taken, as its bind would have a moment later.
    if (errno == EADDRINUSE) {
      *bindErrno = errno;
      return Socket();
    }
    failErrno(braidSystemError, fmt::format("listening on {}", address.toString()), errno);
  }
  return s;
}

Socket Socket::connect(const SocketAddress& address, std::string peerName,
                       Clock::time_point deadline, const std::string& activity, Refused refused) {
  auto backoff = std::chrono::milliseconds(5);
  for (;;) {
    Socket s(openTcpSocket(address.family()), peerName);
    int err = tryConnect(s.fd_, address, deadline);
    // Dialling an unused local port can make TCP connect the socket to itself.
    if (err == 0 && s.localAddress() == address) err = ECONNREFUSED;
    if (err == 0) {
      setNoDelay(s.fd_);
      return s;
    }
    if (err == ECONNREFUSED && refused == Refused::IsFinal)
      fail(braidRemoteError,
           "{}: {} refused the connection: nothing listens there any more (its process exited?)",
           activity, peerName);
    if (!isRetryableConnectError(err))
      failErrno(braidSystemError, fmt::format("{}: connecting to {}", activity, peerName), err);
    if (Clock::now() + backoff >= deadline)
      fail(braidTimeout, "{}: could not connect to {} before the deadline (last attempt: {})",
           activity, peerName, std::strerror(err));
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
}

Socket Socket::acceptPending() {
  sockaddr_storage peer{};
  socklen_t len = sizeof peer;
  int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
      BRAID_WARN(log::kBootstrap, "accepting a connection: {}", std::strerror(errno));
    return Socket();
  }
  setNoDelay(fd);
  return Socket(fd, SocketAddress(reinterpret_cast<sockaddr*>(&peer), len).toString());
}

Socket Socket::duplicate() const {
  int fd = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) failErrno(braidSystemError, "duplicating a socket descriptor", errno);
  return Socket(fd, peerName_);
}

SocketAddress Socket::localAddress() const {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    failErrno(braidSystemError, "getsockname", errno);
  return SocketAddress(reinterpret_cast<sockaddr*>(&a), len);
}

long Socket::readSome(void* data, size_t bytes) {
  ssize_t n = ::recv(fd_, data, bytes, MSG_DONTWAIT);
  if (n >= 0) return n;
  return errno == EWOULDBLOCK ? -EAGAIN : -errno;
}

void Socket::sendAll(const void* data, size_t bytes, Clock::time_point deadline,
                     const std::string& activity) {
  transfer(this, static_cast<const char*>(data), bytes, nullptr, nullptr, 0, deadline, activity);
}

void Socket::recvAll(void* data, size_t bytes, Clock::time_point deadline,
                     const std::string& activity) {
  transfer(nullptr, nullptr, 0, this, static_cast<char*>(data), bytes, deadline, activity);
}

void sendRecv(Socket& to, const void* out, size_t outBytes, Socket& from, void* in, size_t inBytes,
              Clock::time_point deadline, const std::string& activity, WhenToCloses toCloses) {
  transfer(&to, static_cast<const char*>(out), outBytes, &from, static_cast<char*>(in), inBytes,
           deadline, activity, toCloses);
}

}  // namespace braid
