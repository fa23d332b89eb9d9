// libFuzzer target for the socket transport's frame parsing: the input is what a connected peer
// sends on one socket (frame headers and payloads), read by the receiving side into four posted
// 64 KiB buffers. Any input either completes messages or fails with braid::Error; nothing is
// written outside the buffers (ASan).
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/error.h"
#include "transport/net/socket_net.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 0;
  for (size_t sent = 0; sent < size;) {
    const ssize_t n = write(fds[1], data + sent, size - sent);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  close(fds[1]);  // the peer is done: what follows the input is end of stream
  std::vector<braid::Socket> sockets;
  sockets.emplace_back(fds[0], "the fuzzer");
  constexpr size_t kRequests = 4, kCapacity = 64 << 10;
  std::vector<std::vector<uint8_t>> buffers(kRequests, std::vector<uint8_t>(kCapacity));
  try {
    std::unique_ptr<braid::net::RecvComm> comm = braid::net::receiveOver(std::move(sockets), 1000);
    std::vector<braid::net::Request*> requests;
    for (auto& buffer : buffers) requests.push_back(comm->irecv(buffer.data(), kCapacity, nullptr));
    // Every message either completes or the stream fails; a stream ended on purpose leaves the
    // rest pending, so the tries are bounded.
    for (size_t i = 0, tries = 0; i < kRequests && tries < 64; ++tries) {
      size_t bytes = 0;
      if (comm->test(requests[i], &bytes)) ++i;
    }
  } catch (const braid::Error&) {
  }
  return 0;
}
