// Helpers for fault tests that run ranks as forked processes: memory the parent and children
// share for reports, forking a child that never returns into the test, bounded waits that
// kill children which overrun, and a free port for a rendezvous the test knows.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace braid_test {

using Clock = std::chrono::steady_clock;

// Nanoseconds on CLOCK_MONOTONIC, which every process of the machine shares.
inline int64_t monotonicNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// A T in anonymous shared memory: children forked after construction see the parent's object.
template <typename T>
class SharedBlock {
 public:
  SharedBlock() {
    void* p = mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error(std::string("mmap: ") + std::strerror(errno));
    value_ = new (p) T();
  }
  ~SharedBlock() {
    value_->~T();
    munmap(value_, sizeof(T));
  }
  SharedBlock(const SharedBlock&) = delete;
  SharedBlock& operator=(const SharedBlock&) = delete;

  T& operator*() { return *value_; }
  T* operator->() { return value_; }

 private:
  T* value_ = nullptr;
};

// Forks a child that runs body() and exits with its return value (an escaped exception exits
// with 100); the child never returns into the caller's test.
inline pid_t forkChild(const std::function<int()>& body) {
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid > 0) return pid;
  int code = 100;
  try {
    code = body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child %d: %s\n", getpid(), e.what());
  }
  std::exit(code);
}

struct ChildStatus {
  int status = 0;        // as waitpid reports it
  bool overran = false;  // still running at the deadline, so killed
};

inline std::string describe(const ChildStatus& child) {
  std::string text;
  if (WIFEXITED(child.status))
    text = "exited with code " + std::to_string(WEXITSTATUS(child.status));
  else if (WIFSIGNALED(child.status))
    text = std::string("killed by ") + strsignal(WTERMSIG(child.status));
  else
    text = "status " + std::to_string(child.status);
  return child.overran ? text + " after overrunning its deadline" : text;
}

// Reaps every child; those still running at `deadline` are SIGKILLed and marked overran.
inline std::vector<ChildStatus> waitChildren(const std::vector<pid_t>& pids,
                                             Clock::time_point deadline) {
  std::vector<ChildStatus> result(pids.size());
  std::vector<bool> done(pids.size(), false);
  size_t remaining = pids.size();
  while (remaining > 0) {
    bool pastDeadline = Clock::now() >= deadline;
    for (size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      if (pastDeadline) {
        kill(pids[i], SIGKILL);
        result[i].overran = true;
        waitpid(pids[i], &result[i].status, 0);  // SIGKILL cannot be ignored: returns promptly
      } else if (waitpid(pids[i], &result[i].status, WNOHANG) != pids[i]) {
        continue;
      }
      done[i] = true;
      --remaining;
    }
    if (remaining > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return result;
}

// A port that is free now and outside the kernel's ephemeral range, so no outgoing connection
// or port-0 bind elsewhere on the machine takes it before the root binds it.
inline uint16_t pickFreePort() {
  int ephemeralLow = 32768, ephemeralHigh = 60999;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeralLow >> ephemeralHigh;
  std::mt19937 random(std::random_device{}());
  std::uniform_int_distribution<int> candidates(10000, std::max(10001, ephemeralLow - 1));
  for (int attempt = 0; attempt < 100; ++attempt) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);  // where the root binds
    addr.sin_port = htons(candidates(random));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    bool available = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    if (fd >= 0) close(fd);
    if (available) return ntohs(addr.sin_port);
  }
  throw std::runtime_error("no free port found below the ephemeral range");
}

}  // namespace braid_test
