// The bootstrap's gatekeeper: a listener that admits only connections proving the unique id's
// secret, shared by the root and the ranks' ring.
#pragma once

#include <poll.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/socket.h"
#include "base/wait.h"
#include "core/bootstrap_wire.h"

namespace braid::bootstrap_detail {

struct Admitted {
  Socket socket;
  Hello hello;
};

// A listening socket that admits only connections proving the secret. Each connection must
// send a complete hello within kHelloTimeout; anything else is dropped and logged, never fatal,
// and connections are served side by side so a silent one cannot stall the rest.
class Gatekeeper {
 public:
  Gatekeeper(Socket listener, const uint8_t* secret, std::string name)
      : listener_(std::move(listener)), name_(std::move(name)) {
    std::memcpy(secret_, secret, sizeof secret_);
  }

  const std::string& name() const { return name_; }

  // The next connection with a valid hello, or nothing once the deadline passes. `mustStay`, if
  // given, is a connection whose close fails the wait (braidRemoteError) where no hello has come
  // meanwhile: the next rank of a ring that forms, which cannot end before this rank has joined.
  std::optional<Admitted> admit(Clock::time_point deadline, const Socket* mustStay = nullptr);

  void reject(const Admitted& a, const std::string& reason) const { drop(a.socket, reason); }

 private:
  struct Pending {
    Socket socket;
    Clock::time_point helloDeadline;
    std::string buffer;  // sized to the bytes expected so far
    size_t have;
    Hello hello;
    bool headerChecked;
  };

  void drop(const Socket& s, const std::string& reason) const;
  void dropSilentConnections(Clock::time_point now);
  // Reads the pending connections and accepts new ones, as poll() found them (fds: the listener,
  // then each pending connection).
  void serve(const std::vector<pollfd>& fds);

  // Reads what has arrived; a finished hello moves to ready_, a bad one is dropped (its socket
  // is closed, left invalid for the caller to sweep away).
  void progress(Pending& p);

  Socket listener_;
  uint8_t secret_[32];
  std::string name_;
  std::vector<Pending> pending_;
  std::deque<Admitted> ready_;
};

}  // namespace braid::bootstrap_detail
