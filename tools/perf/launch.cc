#include "perf/launch.h"

#include <fmt/format.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "perf/bench.h"
#include "perf/cuda_memory.h"

namespace braid_perf {
namespace {

using Clock = std::chrono::steady_clock;

// How long the other processes may go on after one failed, to report their own view of it.
constexpr std::chrono::seconds kGraceAfterFailure{10};

// The variable that says an external launcher started this process, or nullptr.
const char* launcherVariable() {
  if (std::getenv("OMPI_COMM_WORLD_RANK") != nullptr) return "OMPI_COMM_WORLD_RANK";
  if (std::getenv("SLURM_PROCID") != nullptr) return "SLURM_PROCID";
  if (std::getenv("RANK") != nullptr && std::getenv("WORLD_SIZE") != nullptr) return "RANK";
  if (std::getenv("BRAID_COMM_ID") != nullptr) return "BRAID_COMM_ID";
  return nullptr;
}

// Ends the process at once: a failed rank's siblings may be blocked in a collective, and the
// peers notice a dead process sooner than a stuck one.
[[noreturn]] void exitNow(int status) {
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(status);
}

char timeoutMessage[160];
size_t timeoutMessageLength = 0;

void onTimeout(int) {
  ssize_t ignored = write(STDERR_FILENO, timeoutMessage, timeoutMessageLength);
  (void)ignored;
  _exit(kExitFailed);
}

braidConfig_t communicatorConfig(const Options& o) {
  braidConfig_t config = BRAID_CONFIG_INITIALIZER;
  config.commName = "braid-perf";
  config.device = o.device.c_str();
  return config;
}

// One thread's ranks (-g of them) from communicator init to destroy. A usage error (every rank
// finds the same one) returns; a failure ends the process.
template <typename Init>
int runRanks(const Options& o, const LaunchInfo& launch, std::string who, Init init) {
  std::vector<braidComm_t> comms(o.ranksPerThread, nullptr);
  int rank = -1;
  auto destroyAll = [&] {
    braidResult_t worst = braidSuccess;
    for (braidComm_t& comm : comms) {
      if (comm == nullptr) continue;
      if (const braidResult_t r = braidCommDestroy(comm); r != braidSuccess) worst = r;
      comm = nullptr;
    }
    return worst;
  };
  try {
    const braidResult_t result = init(comms);
    if (result != braidSuccess)
      throw RunError(fmt::format("communicator init failed: {}: {}", braidGetErrorString(result),
                                 braidGetLastError(nullptr)));
    if (braidCommUserRank(comms.front(), &rank) == braidSuccess)
      who = o.ranksPerThread == 1 ? fmt::format("rank {}", rank)
                                  : fmt::format("ranks {}-{}", rank, rank + o.ranksPerThread - 1);
    const int64_t wrong = runBenchmark(o, comms, launch);
    const braidResult_t destroyed = destroyAll();
    if (destroyed != braidSuccess)
      throw RunError(fmt::format("braidCommDestroy failed: {}: {}", braidGetErrorString(destroyed),
                                 braidGetLastError(nullptr)));
    return wrong == 0 ? kExitPassed : kExitWrongValues;
  } catch (const UsageError& e) {
    if (rank == 0) fmt::print(stderr, "braid-perf: {}\n", e.what());
    destroyAll();
    return kExitUsage;
  } catch (const std::exception& e) {
    fmt::print(stderr, "braid-perf: {}: {}\n", who, e.what());
    exitNow(kExitFailed);
  }
}

// Ranks firstRank .. firstRank + -t x -g - 1 of nranks as threads of this process, -g per thread
// (created in one group, as NCCL requires of a thread that inits several ranks).
int runRankThreads(const Options& o, const LaunchInfo& launch, const braidUniqueId& id, int nranks,
                   int firstRank) {
  std::vector<int> status(o.threadsPerProcess, kExitPassed);
  std::vector<std::thread> threads;
  for (int t = 0; t < o.threadsPerProcess; ++t) {
    threads.emplace_back([&, t] {
      const int first = firstRank + t * o.ranksPerThread;
      status[t] =
          runRanks(o, launch, fmt::format("rank {}", first), [&](std::vector<braidComm_t>& comms) {
            braidConfig_t config = communicatorConfig(o);
            braidGroupStart();
            for (int i = 0; i < o.ranksPerThread; ++i) {
              // This host's ranks share its GPUs.
              if (o.device == "cuda") cuda::selectDevice(first + i);
              braidCommInitRankConfig(&comms[i], nranks, id, first + i, &config);
            }
            return braidGroupEnd();
          });
    });
  }
  for (std::thread& t : threads) t.join();
  return *std::max_element(status.begin(), status.end());
}

struct Child {
  int index;
  pid_t pid;
  bool running = true;
  int status = kExitPassed;
  std::string failure;  // empty unless it failed or was stopped
};

std::string describe(const Child& c, int ranksPerProcess) {
  const int first = c.index * ranksPerProcess;
  const std::string ranks = ranksPerProcess == 1
                                ? fmt::format("rank {}", first)
                                : fmt::format("ranks {}-{}", first, first + ranksPerProcess - 1);
  return fmt::format("process {} ({}, pid {})", c.index, ranks, c.pid);
}

void recordExit(Child& c, int waitStatus) {
  c.running = false;
  if (WIFEXITED(waitStatus)) {
    c.status = WEXITSTATUS(waitStatus);
    if (c.status >= kExitFailed) c.failure = fmt::format("exited with status {}", c.status);
  } else if (WIFSIGNALED(waitStatus)) {
    c.status = kExitFailed;
    c.failure = fmt::format("was killed by signal {} ({})", WTERMSIG(waitStatus),
                            strsignal(WTERMSIG(waitStatus)));
  }
}

// Waits for every child; past -T (plus a grace), or a grace after one fails, kills the rest.
int superviseChildren(const Options& o, std::vector<Child>& children) {
  const Clock::time_point deadline =
      Clock::now() + std::chrono::seconds(o.timeoutSeconds) + kGraceAfterFailure;
  Clock::time_point stopAt = deadline;
  std::string stopReason = fmt::format("did not finish within -T {} seconds", o.timeoutSeconds);
  size_t running = children.size();
  while (running > 0) {
    for (Child& c : children) {
      int waitStatus = 0;
      if (!c.running || waitpid(c.pid, &waitStatus, WNOHANG) != c.pid) continue;
      recordExit(c, waitStatus);
      --running;
      if (c.failure.empty() || stopAt != deadline) continue;
      stopAt = std::min(deadline, Clock::now() + kGraceAfterFailure);
      stopReason = fmt::format("was stopped after process {} failed", c.index);
    }
    if (running > 0 && Clock::now() >= stopAt) {
      for (Child& c : children) {
        if (!c.running) continue;
        kill(c.pid, SIGKILL);
        int waitStatus = 0;
        waitpid(c.pid, &waitStatus, 0);  // returns at once: SIGKILL cannot be caught
        c.running = false;
        c.status = kExitFailed;
        c.failure = stopReason;
        --running;
      }
    }
    if (running > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  int worst = kExitPassed;
  for (const Child& c : children) {
    if (!c.failure.empty())
      fmt::print(stderr, "braid-perf: {} {}\n", describe(c, o.ranksPerProcess()), c.failure);
    worst = std::max(worst, std::min(c.status, static_cast<int>(kExitFailed)));
  }
  return worst;
}

// The CPUs this process may run on, in order.
std::vector<int> allowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

// Process p gets CPUs [p*t, (p+1)*t) of the allowed ones when every rank fits on a core of its
// own, as mpirun binds by default: left to itself the kernel may wake a rank onto its peer's core
// (the waker's), where the two take turns while the other core idles.
void bindToCores(const std::vector<int>& cpus, int process, int threadsPerProcess) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int t = 0; t < threadsPerProcess; ++t) CPU_SET(cpus[process * threadsPerProcess + t], &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0)
    fmt::print(stderr, "braid-perf: process {}: could not bind to its cores: {}\n", process,
               std::strerror(errno));
}

int runForked(const Options& o) {
  const int nranks = o.processes * o.ranksPerProcess();
  checkRoot(o, nranks);
  braidUniqueId id;
  const braidResult_t result = braidGetUniqueId(&id);
  if (result != braidSuccess)
    throw RunError(fmt::format("braidGetUniqueId failed: {}: {}", braidGetErrorString(result),
                               braidGetLastError(nullptr)));
  const std::vector<int> cpus = allowedCpus();
  const bool bind =
      o.bindCores && static_cast<size_t>(o.processes * o.threadsPerProcess) <= cpus.size();
  const LaunchInfo launch{
      "fork", o.processes,
      bind ? fmt::format("process p on CPUs {}p..{}p+{} (--bind core)", o.threadsPerProcess,
                         o.threadsPerProcess, o.threadsPerProcess - 1)
      : o.bindCores ? fmt::format("none: {} ranks, {} CPUs (--bind core binds only when every "
                                  "rank has a core)",
                                  o.processes * o.threadsPerProcess, cpus.size())
                    : "none (--bind none)"};
  std::fflush(stdout);  // or the children would print what is buffered again
  std::fflush(stderr);
  std::vector<Child> children;
  for (int p = 0; p < o.processes; ++p) {
    const pid_t pid = fork();
    if (pid == 0) {
      if (bind) bindToCores(cpus, p, o.threadsPerProcess);
      armTimeout("braid-perf", o.timeoutSeconds);
      exitNow(runRankThreads(o, launch, id, nranks, p * o.ranksPerProcess()));
    }
    if (pid < 0) {
      const int err = errno;
      for (const Child& c : children) kill(c.pid, SIGKILL);
      for (const Child& c : children) waitpid(c.pid, nullptr, 0);
      throw RunError(fmt::format("fork of process {} failed: {}", p, std::strerror(err)));
    }
    children.push_back(Child{p, pid, true, kExitPassed, ""});
  }
  return superviseChildren(o, children);
}

int runInThisProcess(const Options& o) {
  checkRoot(o, o.ranksPerProcess());
  armTimeout("braid-perf", o.timeoutSeconds);
  braidUniqueId id;
  const braidResult_t result = braidGetUniqueId(&id);
  if (result != braidSuccess)
    throw RunError(fmt::format("braidGetUniqueId failed: {}: {}", braidGetErrorString(result),
                               braidGetLastError(nullptr)));
  return runRankThreads(o, {"threads", 1}, id, o.ranksPerProcess(), 0);
}

int runUnderLauncher(const Options& o, const char* variable) {
  if (o.ranksPerProcess() > 1)
    throw UsageError(fmt::format(
        "-t {} -g {}: several ranks per process are not available under an external launcher "
        "({} is set); start {} times as many processes instead",
        o.threadsPerProcess, o.ranksPerThread, variable, o.ranksPerProcess()));
  armTimeout("braid-perf", o.timeoutSeconds);
  const LaunchInfo launch{fmt::format("environment ({})", variable), 0};
  return runRanks(o, launch, "this process", [&](std::vector<braidComm_t>& comms) {
    braidConfig_t config = communicatorConfig(o);
    return braidCommInitFromEnv(&comms.front(), &config);
  });
}

}  // namespace

void armTimeout(const char* tool, int seconds) {
  const int n = std::snprintf(timeoutMessage, sizeof timeoutMessage,
                              "%s: pid %d did not finish within -T %d seconds; stopping\n", tool,
                              static_cast<int>(getpid()), seconds);
  timeoutMessageLength = static_cast<size_t>(std::max(n, 0));
  std::signal(SIGALRM, onTimeout);
  alarm(static_cast<unsigned>(seconds));
}

int launchAndRun(const Options& options) {
  try {
    if (options.processes > 0) return runForked(options);
    if (const char* variable = launcherVariable()) return runUnderLauncher(options, variable);
    return runInThisProcess(options);
  } catch (const RunError& e) {
    fmt::print(stderr, "braid-perf: {}\n", e.what());
    return kExitFailed;
  }
}

}  // namespace braid_perf
