#include "multirank/rank_launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>

namespace braid_test {
namespace {

// braidCommInitAll takes no config: its communicators get the tests' timeout and the CPU device
// from the environment, set before any braid call reads it (an explicit BRAID_TIMEOUT wins).
[[maybe_unused]] const bool kEnvironmentSet = [] {
  setenv("BRAID_TIMEOUT", std::to_string(kOpTimeoutMs).c_str(), /*overwrite=*/0);
  setenv("BRAID_DEVICE", "cpu", /*overwrite=*/1);
  return true;
}();

constexpr auto kPollInterval = std::chrono::milliseconds(50);

// Progress slots in an anonymous shared mapping: visible to threads and to forked children.
class ProgressBoard {
 public:
  explicit ProgressBoard(int nranks) : nranks_(nranks), bytes_(sizeof(ProgressSlot) * nranks) {
    void* memory = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) {
      std::perror("rank_launcher: mmap of the progress board");
      std::abort();
    }
    slots_ = new (memory) ProgressSlot[nranks];
  }
  ~ProgressBoard() { munmap(slots_, bytes_); }
  ProgressBoard(const ProgressBoard&) = delete;
  ProgressBoard& operator=(const ProgressBoard&) = delete;

  ProgressSlot* slot(int rank) { return &slots_[rank]; }

  // True when some rank published a new step since the last call.
  bool advanced() {
    bool changed = false;
    seen_.resize(nranks_, -2);
    for (int rank = 0; rank < nranks_; ++rank) {
      const int64_t step = slots_[rank].step.load(std::memory_order_relaxed);
      changed |= step != seen_[rank];
      seen_[rank] = step;
    }
    return changed;
  }

  std::string whereIs(int rank, const RankProgram& program) {
    const int64_t step = slots_[rank].step.load(std::memory_order_relaxed);
    return step < 0 ? "before its first step" : "in " + program.describeStep(step);
  }

 private:
  int nranks_;
  size_t bytes_;
  ProgressSlot* slots_;
  std::vector<int64_t> seen_;
};

// Watches for stalls: call tick() each poll round; true once nothing advanced for the limit.
class StallClock {
 public:
  explicit StallClock(std::chrono::seconds limit) : limit_(limit) {}
  bool stalled(ProgressBoard& board) {
    const auto now = std::chrono::steady_clock::now();
    if (board.advanced()) lastAdvance_ = now;
    return now - lastAdvance_ > limit_;
  }

 private:
  std::chrono::seconds limit_;
  std::chrono::steady_clock::time_point lastAdvance_ = std::chrono::steady_clock::now();
};

Failures runGuarded(const RankProgram& program, const RankEnv& env) {
  try {
    return program.run(env);
  } catch (const std::exception& e) {
    return {std::string("threw ") + e.what()};
  } catch (...) {
    return {"threw a non-standard exception"};
  }
}

void prefixRank(int rank, const Failures& from, Failures& to) {
  for (const std::string& line : from) to.push_back("rank " + std::to_string(rank) + ": " + line);
}

Failures launchThreads(int nranks, const RankProgram& program, const braidUniqueId& id,
                       ProgressBoard& board, std::chrono::seconds stallLimit) {
  std::vector<Failures> perRank(nranks);
  std::atomic<int> finished{0};
  std::vector<std::atomic<bool>> rankDone(nranks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < nranks; ++rank) {
    threads.emplace_back([&, rank] {
      perRank[rank] = runGuarded(program, RankEnv{rank, nranks, id, board.slot(rank)});
      rankDone[rank].store(true);
      finished.fetch_add(1);
    });
  }
  StallClock clock(stallLimit);
  while (finished.load() < nranks) {
    std::this_thread::sleep_for(kPollInterval);
    if (!clock.stalled(board)) continue;
    std::fprintf(stderr,
                 "FATAL: no rank advanced for %lld s; threads cannot be stopped, exiting.\n",
                 static_cast<long long>(stallLimit.count()));
    for (int rank = 0; rank < nranks; ++rank) {
      if (!rankDone[rank].load()) {
        std::fprintf(stderr, "  rank %d stuck %s\n", rank, board.whereIs(rank, program).c_str());
      }
    }
    std::fflush(stderr);
    std::_Exit(EXIT_FAILURE);
  }
  Failures failures;
  for (int rank = 0; rank < nranks; ++rank) {
    threads[rank].join();
    prefixRank(rank, perRank[rank], failures);
  }
  return failures;
}

// A child writes its failures to a pipe, NUL-separated, and exits 0 when there were none.
[[noreturn]] void runChild(const RankProgram& program, const RankEnv& env, int reportFd) {
  const Failures failures = runGuarded(program, env);
  std::string report;
  for (const std::string& line : failures) report += line + '\0';
  size_t written = 0;
  while (written < report.size()) {
    const ssize_t n = write(reportFd, report.data() + written, report.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  _exit(failures.empty() ? 0 : 1);
}

struct Child {
  pid_t pid = -1;
  int reportFd = -1;  // read end; -1 once at EOF
  std::string report;
  bool exited = false;
  int status = 0;
};

void drain(Child& child) {
  char buffer[4096];
  for (;;) {
    const ssize_t n = read(child.reportFd, buffer, sizeof buffer);
    if (n > 0) {
      child.report.append(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {  // EOF: the child is gone or done writing
      close(child.reportFd);
      child.reportFd = -1;
    }
    return;  // EAGAIN: nothing more for now
  }
}

void collectChild(int rank, const Child& child, const RankProgram& program, ProgressBoard& board,
                  Failures& failures) {
  Failures lines;
  size_t start = 0;
  for (size_t end; (end = child.report.find('\0', start)) != std::string::npos; start = end + 1) {
    lines.push_back(child.report.substr(start, end - start));
  }
  if (WIFSIGNALED(child.status)) {
    lines.push_back("process killed by signal " + std::to_string(WTERMSIG(child.status)) + " (" +
                    strsignal(WTERMSIG(child.status)) + ") " + board.whereIs(rank, program));
  } else if (WIFEXITED(child.status) && WEXITSTATUS(child.status) != 0 && lines.empty()) {
    lines.push_back("process exited with status " + std::to_string(WEXITSTATUS(child.status)) +
                    " without a report, " + board.whereIs(rank, program));
  }
  prefixRank(rank, lines, failures);
}

Failures launchProcesses(int nranks, const RankProgram& program, const braidUniqueId& id,
                         ProgressBoard& board, std::chrono::seconds stallLimit) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<Child> children(nranks);
  Failures failures;
  for (int rank = 0; rank < nranks; ++rank) {
    int fds[2];
    if (pipe(fds) != 0) {
      failures.push_back(std::string("pipe: ") + std::strerror(errno));
      break;
    }
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      for (int earlier = 0; earlier < rank; ++earlier) close(children[earlier].reportFd);
      runChild(program, RankEnv{rank, nranks, id, board.slot(rank)}, fds[1]);
    }
    close(fds[1]);
    if (pid < 0) {
      close(fds[0]);
      failures.push_back(std::string("fork: ") + std::strerror(errno));
      break;
    }
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    children[rank].pid = pid;
    children[rank].reportFd = fds[0];
  }

  StallClock clock(stallLimit);
  for (;;) {
    std::vector<pollfd> open;
    for (const Child& child : children) {
      if (child.reportFd >= 0) open.push_back({child.reportFd, POLLIN, 0});
    }
    poll(open.data(), open.size(), static_cast<int>(kPollInterval.count()));
    bool running = false;
    for (Child& child : children) {
      if (child.pid < 0) continue;
      if (child.reportFd >= 0) drain(child);
      if (!child.exited && waitpid(child.pid, &child.status, WNOHANG) == child.pid) {
        child.exited = true;
      }
      running |= !child.exited || child.reportFd >= 0;
    }
    if (!running) break;
    if (!clock.stalled(board)) continue;
    for (int rank = 0; rank < nranks; ++rank) {
      Child& child = children[rank];
      if (child.pid < 0 || child.exited) continue;
      failures.push_back("rank " + std::to_string(rank) + ": no rank advanced for " +
                         std::to_string(stallLimit.count()) + " s; killed while " +
                         board.whereIs(rank, program));
      kill(child.pid, SIGKILL);
      waitpid(child.pid, &child.status, 0);
      child.exited = true;
      child.status = 0;  // reported above
    }
    for (Child& child : children) {
      if (child.reportFd >= 0) close(child.reportFd);
      child.reportFd = -1;
    }
    break;
  }
  for (int rank = 0; rank < nranks; ++rank) {
    if (children[rank].pid >= 0) collectChild(rank, children[rank], program, board, failures);
  }
  return failures;
}

}  // namespace

Failures launchRanks(Launch how, int nranks, const RankProgram& program,
                     std::chrono::seconds stallLimit) {
  braidUniqueId id{};
  if (how == Launch::OneWorker) {
    nranks = 1;
  } else if (braidResult_t result = braidGetUniqueId(&id); result != braidSuccess) {
    return {"braidGetUniqueId returned " + describeResult(result, nullptr)};
  }
  ProgressBoard board(nranks);
  return how == Launch::Processes ? launchProcesses(nranks, program, id, board, stallLimit)
                                  : launchThreads(nranks, program, id, board, stallLimit);
}

braidResult_t initRank(braidComm_t* comm, const RankEnv& env, int timeoutMs) {
  braidConfig_t config = BRAID_CONFIG_INITIALIZER;
  config.timeoutMs = timeoutMs;
  config.device = "cpu";
  return braidCommInitRankConfig(comm, env.nranks, env.id, env.rank, &config);
}

std::string ranksParamName(const RanksParam& param) {
  return std::string(param.how == Launch::Threads ? "threads_" : "processes_") +
         std::to_string(param.nranks) + "ranks";
}

std::string describeResult(braidResult_t result, braidComm_t comm) {
  static const char* const kNames[] = {
      "braidSuccess",       "braidUnhandledCudaError", "braidSystemError",
      "braidInternalError", "braidInvalidArgument",    "braidInvalidUsage",
      "braidRemoteError",   "braidInProgress",         "braidTimeout"};
  const std::string name = result >= 0 && result < braidNumResults
                               ? kNames[result]
                               : "result " + std::to_string(static_cast<int>(result));
  const char* text = braidGetErrorString(result);
  const char* last = braidGetLastError(comm);
  return name + " (" + (text ? text : "null") + "): " + (last ? last : "null");
}

}  // namespace braid_test
