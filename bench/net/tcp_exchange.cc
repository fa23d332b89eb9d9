// The floor of a small exchange between two hosts over plain TCP, without braid: both sides send
// a message, then busy-poll for the other's, back to back (a 2-rank one-shot all-reduce's
// network part). Over one duplex connection each side's data carries the acknowledgement of the
// other's; over two one-way connections (as braid's and NCCL's net plug-ins connect, one per
// direction) each message is acknowledged by a packet of its own, sent by the reader.
// Usage: tcp_exchange duplex|oneway SELF_ADDR PEER_ADDR BYTES [ITERATIONS]  (both hosts; IPv4)
// Prints the median, 10th and 90th percentile time per exchange and the reads per exchange.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kPort = 29997;

[[noreturn]] void die(const char* what) {
  std::perror(what);
  std::exit(1);
}

sockaddr_in addressOf(const char* host) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(kPort);
  if (inet_pton(AF_INET, host, &a.sin_addr) != 1) die("inet_pton");
  return a;
}

int listenOn(const char* host) {
  const sockaddr_in a = addressOf(host);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) die("bind");
  if (listen(fd, 4) != 0) die("listen");
  return fd;
}

// Retries until the peer listens (both sides start at about the same time), for up to 10 s.
int connectTo(const char* host) {
  const sockaddr_in a = addressOf(host);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0) return fd;
    close(fd);
    usleep(10000);
  }
  die("connect");
}

int acceptOne(int listener) {
  const int fd = accept(listener, nullptr, nullptr);
  if (fd < 0) die("accept");
  return fd;
}

void noDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s duplex|oneway SELF_ADDR PEER_ADDR BYTES [ITERATIONS]\n",
                 argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const char* self = argv[2];
  const char* peer = argv[3];
  const size_t bytes = std::strtoul(argv[4], nullptr, 10);
  const int iterations = argc > 5 ? std::atoi(argv[5]) : 20000;
  if ((mode != "duplex" && mode != "oneway") || bytes == 0 || iterations <= 0) {
    std::fprintf(stderr, "tcp_exchange: bad arguments\n");
    return 2;
  }
  // The side with the lower address listens for the duplex connection.
  const bool lower = std::strcmp(self, peer) < 0;
  const int listener = listenOn(self);
  int out = -1, in = -1;
  if (mode == "duplex") {
    out = in = lower ? acceptOne(listener) : connectTo(peer);
  } else {
    out = connectTo(peer);
    in = acceptOne(listener);
  }
  noDelay(out);
  noDelay(in);

  std::vector<char> message(bytes, 1), buffer(bytes);
  std::vector<double> us(iterations);
  long reads = 0;
  for (int i = 0; i < iterations; ++i) {
    const auto start = std::chrono::steady_clock::now();
    if (send(out, message.data(), bytes, 0) != static_cast<ssize_t>(bytes)) die("send");
    for (size_t have = 0; have < bytes;) {
      const ssize_t n = recv(in, buffer.data() + have, bytes - have, MSG_DONTWAIT);
      ++reads;
      if (n > 0) have += n;
      if (n == 0) die("peer closed");
    }
    us[i] =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  }
  std::sort(us.begin(), us.end());
  std::printf("%-7s %8zu B  median %7.2f us  p10 %7.2f  p90 %7.2f  reads/exchange %.2f\n",
              mode.c_str(), bytes, us[iterations / 2], us[iterations / 10], us[iterations * 9 / 10],
              static_cast<double>(reads) / iterations);
  close(out);
  if (in != out) close(in);
  close(listener);
  return 0;
}
