// The bootstrap's gatekeeper: serves the connections to a listener side by side until each has
// sent a complete hello proving the secret, dropping and logging the rest.
#include "core/bootstrap_gate.h"

#include <fmt/format.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/log.h"

namespace braid {
namespace {

using std::chrono::milliseconds;

}  // namespace

namespace bootstrap_detail {

std::optional<Admitted> Gatekeeper::admit(Clock::time_point deadline, const Socket* mustStay) {
  for (;;) {
    if (!ready_.empty()) {
      Admitted a = std::move(ready_.front());
      ready_.pop_front();
      return a;
    }
    Clock::time_point now = Clock::now();
    dropSilentConnections(now);
    if (now >= deadline) return std::nullopt;
    Clock::time_point wake = deadline;
    std::vector<pollfd> fds{{listener_.fd(), POLLIN, 0}};
    for (const Pending& p : pending_) {
      wake = std::min(wake, p.helloDeadline);
      fds.push_back({p.socket.fd(), POLLIN, 0});
    }
    if (mustStay != nullptr) fds.push_back({mustStay->fd(), POLLRDHUP, 0});
    int rc = ::poll(fds.data(), fds.size(), pollTimeoutMs(wake));
    if (rc < 0 && errno != EINTR) failErrno(braidSystemError, name_ + ": poll", errno);
    if (rc <= 0) continue;
    serve(fds);
    if (ready_.empty() && mustStay != nullptr && fds.back().revents != 0)
      fail(braidRemoteError,
           "{}: {} closed its connection while this rank waited (its process ended or its init "
           "failed)",
           name_, mustStay->peerName());
  }
}

void Gatekeeper::dropSilentConnections(Clock::time_point now) {
  std::erase_if(pending_, [&](const Pending& p) {
    if (now < p.helloDeadline) return false;
    drop(p.socket, fmt::format("no complete hello within {} ms ({} bytes received)",
                               milliseconds(kHelloTimeout).count(), p.have));
    return true;
  });
}

void Gatekeeper::serve(const std::vector<pollfd>& fds) {
  for (size_t i = 0; i < pending_.size(); ++i)
    if (fds[i + 1].revents != 0) progress(pending_[i]);
  std::erase_if(pending_, [](const Pending& p) { return !p.socket.valid(); });
  if ((fds[0].revents & POLLIN) != 0)
    for (Socket s = listener_.acceptPending(); s.valid(); s = listener_.acceptPending())
      pending_.push_back({std::move(s), Clock::now() + kHelloTimeout,
                          std::string(kHelloHeaderBytes, '\0'), 0, Hello{}, false});
}

void Gatekeeper::drop(const Socket& s, const std::string& reason) const {
  BRAID_WARN(log::kBootstrap, "{}: dropped the connection from {}: {}", name_, s.peerName(),
             reason);
}

void Gatekeeper::progress(Pending& p) {
  for (;;) {
    long n = p.socket.readSome(p.buffer.data() + p.have, p.buffer.size() - p.have);
    if (n == -EAGAIN || n == -EINTR) return;
    if (n <= 0) {
      drop(p.socket, n == 0 ? fmt::format("closed after {} hello bytes", p.have)
                            : fmt::format("read failed after {} hello bytes: {}", p.have,
                                          std::strerror(static_cast<int>(-n))));
      p.socket = Socket();
      return;
    }
    p.have += n;
    if (!p.headerChecked && p.have == kHelloHeaderBytes) {
      if (std::optional<std::string> why = checkHelloHeader(p.buffer, secret_, &p.hello)) {
        drop(p.socket, *why);
        p.socket = Socket();
        return;
      }
      p.headerChecked = true;
      p.buffer.resize(kHelloHeaderBytes + p.hello.payloadBytes);
    }
    if (p.headerChecked && p.have == p.buffer.size()) {
      p.hello.payload = p.buffer.substr(kHelloHeaderBytes);
      ready_.push_back({std::move(p.socket), std::move(p.hello)});
      p.socket = Socket();
      return;
    }
  }
}

}  // namespace bootstrap_detail
}  // namespace braid
