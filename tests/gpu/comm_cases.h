// What the GPU tests of CUDA communicators share: a rank's communicator on the current device,
// the cases (the device form's, plus messages beyond the low-latency limit and the FIFOs), and
// one case run on device buffers through the public API and checked against the multirank
// grid's independent reference.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "braid/braid.h"
#include "gpu/gpu_common.h"

namespace braid_test {

inline constexpr int kTimeoutMs = 30000;

// `algorithms`: the config's choice (as BRAID_ALGO), or null for the cost model's.
inline braidResult_t initCudaRank(braidComm_t* comm, int nranks, const braidUniqueId& id, int rank,
                                  int timeoutMs = kTimeoutMs, const char* algorithms = nullptr) {
  braidConfig_t config = BRAID_CONFIG_INITIALIZER;
  config.device = "cuda";
  config.timeoutMs = timeoutMs;
  config.algorithms = algorithms;
  return braidCommInitRankConfig(comm, nranks, id, rank, &config);
}

inline std::string describe(braidResult_t result, braidComm_t comm) {
  return std::string(braidGetErrorString(result)) + ": " + braidGetLastError(comm);
}

// A rank on device 0 with a stream of its own and its CUDA communicator; "" or what failed.
struct CudaRank {
  cudaStream_t stream = nullptr;
  braidComm_t comm = nullptr;
};
inline std::string openCudaRank(int nranks, const braidUniqueId& id, int rank, CudaRank& out,
                                int timeoutMs = kTimeoutMs, const char* algorithms = nullptr) {
  if (cudaSetDevice(0) != cudaSuccess ||
      cudaStreamCreateWithFlags(&out.stream, cudaStreamNonBlocking) != cudaSuccess)
    return "cudaSetDevice or cudaStreamCreate failed";
  const braidResult_t r = initCudaRank(&out.comm, nranks, id, rank, timeoutMs, algorithms);
  return r == braidSuccess ? "" : "init: " + describe(r, nullptr);
}
// Finalizes and destroys what openCudaRank made.
inline void closeCudaRank(CudaRank& rank) {
  if (rank.comm != nullptr) {
    braidCommFinalize(rank.comm);
    braidCommDestroy(rank.comm);
  }
  if (rank.stream != nullptr) cudaStreamDestroy(rank.stream);
}

// One case's call on this rank's device buffers, queued on the stream (a send to the next rank
// and a receive from the previous one in a group of their own, where none is open): its result.
// PreMulSum's operator is made in `op`, for the caller to destroy.
inline braidResult_t issueCase(const Case& c, int rank, int n, braidComm_t comm,
                               cudaStream_t stream, const DeviceRank& dev, braidRedOp_t& op) {
  op = c.op;
  if (c.op == kPreMulSum) {
    visitDtype(c.type, [&](auto element) {
      using T = decltype(element);
      T scalar = premulScalar<T>(rank, c.salt);
      braidRedOpCreatePreMulSum(&op, &scalar, c.type, braidScalarHostImmediate, comm);
    });
  }
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  braidResult_t r = braidSuccess;
  switch (c.collective) {
    case Collective::AllReduce:
      r = braidAllReduce(dev.input, dev.output, c.count, c.type, op, comm, stream);
      break;
    case Collective::ReduceScatter:
      r = braidReduceScatter(dev.input, dev.output, c.count, c.type, op, comm, stream);
      break;
    case Collective::AllGather:
      r = braidAllGather(dev.input, dev.output, c.count, c.type, comm, stream);
      break;
    case Collective::Broadcast:
      r = braidBroadcast(dev.input, dev.output, c.count, c.type, c.root, comm, stream);
      break;
    case Collective::Reduce:
      r = braidReduce(dev.input, dev.output, c.count, c.type, op, c.root, comm, stream);
      break;
    default:  // send to the next rank, receive from the previous one
      braidGroupStart();
      braidSend(dev.input, c.count, c.type, next, comm, stream);
      braidRecv(dev.output, c.count, c.type, prev, comm, stream);
      r = braidGroupEnd();
  }
  return r;
}

// One case's call (issueCase), the stream waited for: "" or what failed. Every rank of the
// communicator calls it with the same case.
inline std::string callCase(const Case& c, int rank, int n, braidComm_t comm, cudaStream_t stream,
                            const DeviceRank& dev) {
  braidRedOp_t op = braidSum;
  const braidResult_t r = issueCase(c, rank, n, comm, stream, dev, op);
  const bool premul = c.op == kPreMulSum;
  const std::string what = describe(c, Shape{n, 0, 0, 0, Algorithm::Simple});
  if (r != braidSuccess) return what + ": " + describe(r, comm);
  if (cudaStreamSynchronize(stream) != cudaSuccess) return what + ": cudaStreamSynchronize failed";
  braidResult_t async = braidSuccess;
  braidCommGetAsyncError(comm, &async);
  if (async != braidSuccess) return what + ": " + describe(async, comm);
  if (premul) braidRedOpDestroy(op, comm);
  return "";
}

// One case on this rank: buffers to the device, the call (callCase), the buffers back and
// checked. Every rank of the communicator calls it with the same case.
inline void runCase(const Case& c, int rank, int n, braidComm_t comm, cudaStream_t stream,
                    std::vector<std::string>& failures) {
  RankBuffers host;
  layoutRank(c, rank, n, host);
  DeviceArena arena;
  DeviceRank dev;
  if (!toDevice(host, arena, dev)) return failures.push_back("cudaMalloc or cudaMemcpy failed");
  if (const std::string failed = callCase(c, rank, n, comm, stream, dev); !failed.empty())
    return failures.push_back(failed);
  const std::string what = describe(c, Shape{n, 0, 0, 0, Algorithm::Simple});
  if (!toHost(dev, host)) return failures.push_back(what + ": cudaMemcpy failed");
  const std::string wrong = checkRank(c, rank, n, host, AverageAs::Api);
  if (!wrong.empty()) failures.push_back(what + ": " + wrong);
}

// The device form's cases (every collective x dtype x op at counts 0 .. a few thousand: the
// low-latency protocol), and messages beyond the low-latency limit and the FIFOs (Simple), a
// few dtypes and ops each.
inline std::vector<Case> commCases(int n) {
  std::vector<Case> cases = casesFor(Shape{n, 2, 256, 8, Algorithm::Simple});
  for (Collective collective :
       {Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather,
        Collective::Broadcast, Collective::Reduce, Collective::Send}) {
    if (collective == Collective::Send && n == 1) continue;
    for (auto [type, op] : {std::pair{braidFloat32, braidSum}, std::pair{braidBfloat16, braidAvg},
                            std::pair{braidInt8, braidMax}})
      for (size_t count : {size_t{100'003}, size_t{(1 << 22) + 5}}) {
        const braidRedOp_t used = reduces(collective) ? op : braidSum;
        cases.push_back({collective, type, used, count, n - 1, mixBits(9, 0, cases.size())});
      }
  }
  return cases;
}

// Whether this process may use a CUDA device, asked of a forked child: a test that forks its
// ranks must not touch CUDA first (a forked child cannot use a context its parent made).
inline bool childSeesCudaDevice() {
  const pid_t probe = fork();
  if (probe == 0) _exit(noCudaDevice().empty() ? 0 : 1);
  int status = 0;
  waitpid(probe, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// n ranks as forked processes on device 0, each first running `beforeCuda(rank)` (it returns
// why it failed, or ""), then the cases of commCases(n) in fp32 and bf16. Each child reports
// through its exit status and stderr; returns one line per rank that failed.
inline std::vector<std::string> runForkedRanks(
    int n, const std::function<std::string(int rank)>& beforeCuda) {
  braidUniqueId id;
  if (braidGetUniqueId(&id) != braidSuccess) return {"braidGetUniqueId failed"};
  std::vector<pid_t> children;
  for (int rank = 0; rank < n; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      std::vector<std::string> failures;
      CudaRank me;
      if (const std::string before = beforeCuda(rank); !before.empty()) {
        failures.push_back(before);
      } else if (const std::string failed = openCudaRank(n, id, rank, me); !failed.empty()) {
        failures.push_back(failed);
      } else {
        for (const Case& c : commCases(n)) {
          if (c.type != braidFloat32 && c.type != braidBfloat16) continue;
          runCase(c, rank, n, me.comm, me.stream, failures);
          if (!failures.empty()) break;
        }
      }
      closeCudaRank(me);
      for (const std::string& f : failures) std::fprintf(stderr, "rank %d: %s\n", rank, f.c_str());
      _exit(failures.empty() ? 0 : 1);
    }
    children.push_back(pid);
  }
  std::vector<std::string> failed;
  for (int rank = 0; rank < n; ++rank) {
    int status = 0;
    waitpid(children[rank], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      failed.push_back("rank " + std::to_string(rank) + " failed (its stderr says how)");
  }
  return failed;
}

}  // namespace braid_test
