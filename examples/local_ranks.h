// Runs a function on N local ranks, each with its own CPU communicator: as threads of this process
// or as forked processes (what torchrun or mpirun -np N does on one machine). Every collective has
// a timeout, so a broken rank makes its peers fail instead of hanging them.
#pragma once

#include <braid/braid.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace local_ranks {

enum class Launch { kThreads, kProcesses };

inline constexpr int kTimeoutMs = 60000;

// What each rank's function returned (its bytes travel back from a process through a temporary
// file, so a large result never blocks on a full pipe), and each rank's failure ("" if none).
struct Outcome {
  std::vector<std::string> results;
  std::vector<std::string> errors;

  std::string joinedErrors() const {
    std::string all;
    for (size_t rank = 0; rank < errors.size(); ++rank)
      if (!errors[rank].empty()) all += "rank " + std::to_string(rank) + ": " + errors[rank] + "\n";
    return all;
  }
};

using RankFunction = std::function<std::string(braidComm_t comm, int rank)>;

namespace detail {

// One rank from communicator init to destroy; returns its failure, or "" and sets *result.
inline std::string runRank(int nranks, const braidUniqueId& id, int rank, int timeoutMs,
                           const RankFunction& fn, std::string* result) {
  braidConfig_t config = BRAID_CONFIG_INITIALIZER;
  config.timeoutMs = timeoutMs;
  config.device = "cpu";
  braidComm_t comm = nullptr;
  if (braidCommInitRankConfig(&comm, nranks, id, rank, &config) != braidSuccess)
    return std::string("braidCommInitRankConfig: ") + braidGetLastError(nullptr);
  try {
    *result = fn(comm, rank);
  } catch (const std::exception& e) {
    braidCommAbort(comm);  // peers waiting on this rank fail now rather than at the timeout
    return e.what();
  }
  if (braidCommDestroy(comm) != braidSuccess)
    return std::string("braidCommDestroy: ") + braidGetLastError(nullptr);
  return "";
}

inline void runThreads(int nranks, const braidUniqueId& id, int timeoutMs, const RankFunction& fn,
                       Outcome& out) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < nranks; ++rank)
    threads.emplace_back([&, rank] {
      out.errors[rank] = runRank(nranks, id, rank, timeoutMs, fn, &out.results[rank]);
    });
  for (std::thread& t : threads) t.join();
}

struct Child {
  pid_t pid = -1;
  std::FILE* file = nullptr;  // 'R' + result or 'E' + error, written by the child
  bool running = true;
  std::string failure;  // how the process ended, if not by exiting with status 0
};

inline std::string describeExit(int status) {
  if (WIFSIGNALED(status))
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
    return "exited with status " + std::to_string(WEXITSTATUS(status));
  return "";
}

inline std::string readAll(std::FILE* file) {
  std::string bytes;
  std::rewind(file);  // the child's writes moved the offset both processes share
  char buffer[1 << 16];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, file)) > 0;) bytes.append(buffer, n);
  return bytes;
}

// Waits for every child. Once one has ended, the others are at most a collective behind it: past
// the collective timeout plus a grace they are killed.
inline void supervise(std::vector<Child>& children, int timeoutMs) {
  using Clock = std::chrono::steady_clock;
  Clock::time_point killAt = Clock::time_point::max();
  auto running =
      std::count_if(children.begin(), children.end(), [](const Child& c) { return c.running; });
  while (running > 0) {
    for (Child& c : children) {
      int status = 0;
      if (!c.running || waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.running = false;
      c.failure = describeExit(status);
      --running;
      if (killAt == Clock::time_point::max())
        killAt = Clock::now() + std::chrono::milliseconds(timeoutMs) + std::chrono::seconds(10);
    }
    if (running > 0 && Clock::now() >= killAt) {
      for (Child& c : children) {
        if (!c.running) continue;
        kill(c.pid, SIGKILL);
        waitpid(c.pid, nullptr, 0);
        c.running = false;
        c.failure = "killed: still running " + std::to_string(timeoutMs / 1000) +
                    " s (the collective timeout) after another rank had ended";
        --running;
      }
    }
    if (running > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

inline void runProcesses(int nranks, const braidUniqueId& id, int timeoutMs, const RankFunction& fn,
                         Outcome& out) {
  std::vector<Child> children(nranks);
  std::fflush(stdout);  // or every child would print what is buffered again
  std::fflush(stderr);
  for (int rank = 0; rank < nranks; ++rank) {
    Child& c = children[rank];
    c.file = std::tmpfile();
    if (c.file == nullptr) {
      out.errors[rank] = std::string("no temporary file for its result: ") + std::strerror(errno);
      c.running = false;
      continue;
    }
    c.pid = fork();
    if (c.pid == 0) {
      std::string result;
      const std::string error = runRank(nranks, id, rank, timeoutMs, fn, &result);
      const std::string record = error.empty() ? "R" + result : "E" + error;
      const bool written = std::fwrite(record.data(), 1, record.size(), c.file) == record.size() &&
                           std::fflush(c.file) == 0;
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(written && error.empty() ? 0 : 1);  // no atexit handlers or static destructors
    }
    if (c.pid < 0) {
      out.errors[rank] = std::string("could not start its process: ") + std::strerror(errno);
      c.running = false;
    }
  }
  // A rank that did not start leaves the others unable to complete: stop them now.
  if (std::any_of(children.begin(), children.end(), [](const Child& c) { return !c.running; }))
    for (const Child& c : children)
      if (c.running) kill(c.pid, SIGKILL);
  supervise(children, timeoutMs);
  for (int rank = 0; rank < nranks; ++rank) {
    const Child& c = children[rank];
    const std::string record = c.file != nullptr ? readAll(c.file) : "";
    if (c.file != nullptr) std::fclose(c.file);
    if (!record.empty() && record[0] == 'R')
      out.results[rank] = record.substr(1);
    else if (!record.empty())
      out.errors[rank] = record.substr(1);
    else if (out.errors[rank].empty())
      out.errors[rank] =
          c.failure.empty() ? "its process reported nothing" : "its process was " + c.failure;
  }
}

}  // namespace detail

inline Outcome run(int nranks, Launch launch, int timeoutMs, const RankFunction& fn) {
  Outcome out;
  out.results.resize(nranks);
  out.errors.resize(nranks);
  braidUniqueId id;
  if (braidGetUniqueId(&id) != braidSuccess) {
    out.errors.assign(nranks, std::string("braidGetUniqueId: ") + braidGetLastError(nullptr));
    return out;
  }
  if (launch == Launch::kThreads)
    detail::runThreads(nranks, id, timeoutMs, fn, out);
  else
    detail::runProcesses(nranks, id, timeoutMs, fn, out);
  return out;
}

// Threads sharing this process's memory; returns the ranks' failures, one line each.
inline std::string onThreads(int nranks, const std::function<void(braidComm_t, int)>& fn) {
  return run(nranks, Launch::kThreads, kTimeoutMs,
             [&](braidComm_t comm, int rank) {
               fn(comm, rank);
               return std::string();
             })
      .joinedErrors();
}

}  // namespace local_ranks
