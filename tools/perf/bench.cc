#include "perf/bench.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "perf/collectives.h"
#include "perf/cuda_memory.h"
#include "perf/sweep.h"

namespace braid_perf {
namespace {

// What one rank tells the others for the "Using devices" lines; a fixed size for all-gather.
struct RankRecord {
  int32_t pid;
  char host[124];
};

// The thread's braid communicators (-g of them, consecutive ranks) as the sweeps drive them. A
// CPU communicator's calls go on a host stream (synchronized by complete()) or, with -z 1, on the
// NULL stream. A CUDA communicator's go on a CUDA stream of the rank, on buffers in its GPU's
// memory (with -z 1 each call is waited for). The tool's own exchanges (barrier, result max, rank
// info) are calls of every local rank in one group, each on a scratch buffer of its own (device
// memory on a CUDA communicator), waited for.
class BraidBenchComm : public BenchComm {
 public:
  BraidBenchComm(const Options& options, const std::vector<braidComm_t>& comms)
      : o_(options), coll_(*options.collective), onDevice_(options.device == "cuda") {
    for (braidComm_t comm : comms) {
      Local& l = locals_.emplace_back();
      l.comm = comm;
      call("braidCommCount", braidCommCount(comm, &nranks_));
      call("braidCommUserRank", braidCommUserRank(comm, &l.rank));
      l.scratch.resize((nranks_ + 1) * sizeof(RankRecord));
      if (onDevice_) {
        cuda::selectDevice(l.rank);
        l.stream = cuda::createStream();
        l.deviceScratch = cuda::allocate(l.scratch.size());
      } else if (!o_.blocking) {
        call("braidStreamCreate", braidStreamCreate(&l.stream));
      }
    }
    checkRoot(o_, nranks_);
  }
  ~BraidBenchComm() override {
    for (Local& l : locals_) {
      if (onDevice_) {
        cuda::selectDevice(l.rank);
        cuda::release(l.deviceScratch);
        cuda::destroyStream(l.stream);
      } else if (l.stream != nullptr) {
        braidStreamDestroy(l.stream);
      }
    }
  }

  int rank() const override { return locals_.front().rank; }
  int localRanks() const override { return static_cast<int>(locals_.size()); }
  int nranks() const override { return nranks_; }

  // A one-element all-reduce, waited for: returns once every rank has entered it.
  void barrier() override {
    float one = 1;
    exchange(&one, sizeof one, [&](Local& l, void* p) {
      return braidAllReduce(p, p, 1, braidFloat32, braidSum, l.comm, controlStream(l));
    });
  }

  void maxOverRanks(double* values, int count) override {
    exchange(values, count * sizeof(double), [&](Local& l, void* p) {
      return braidAllReduce(p, p, count, braidFloat64, braidMax, l.comm, controlStream(l));
    });
  }

  // Each local rank puts the same record (this process's) past the gathered ones.
  std::vector<RankInfo> rankInfo() override {
    std::vector<RankRecord> records(nranks_ + 1);
    RankRecord& mine = records[nranks_];
    mine.pid = static_cast<int32_t>(getpid());
    gethostname(mine.host, sizeof mine.host - 1);
    exchange(records.data(), records.size() * sizeof(RankRecord), [&](Local& l, void* p) {
      auto* gathered = static_cast<RankRecord*>(p);
      return braidAllGather(gathered + nranks_, gathered, sizeof mine, braidUint8, l.comm,
                            controlStream(l));
    });
    std::vector<RankInfo> ranks;
    for (int r = 0; r < nranks_; ++r) {
      RankRecord& record = records[r];
      record.host[sizeof record.host - 1] = '\0';
      ranks.push_back({r, record.pid, record.host});
    }
    hosts_ = ranks;
    return ranks;
  }

  void launch(int local, const void* send, void* recv, size_t count, braidDataType_t type,
              braidRedOp_t op) override {
    Local& l = locals_[local];
    call(coll_.name,
         coll_.call({send, recv, count, type, op, o_.root, l.rank, nranks_, l.comm, l.stream}));
    if (onDevice_ && o_.blocking && locals_.size() == 1) complete();
  }
  void startGroup() override {
    if (grouped()) call("braidGroupStart", braidGroupStart());
  }
  void endGroup() override {
    if (!grouped()) return;
    call("braidGroupEnd", braidGroupEnd());
    if (onDevice_ && o_.blocking) complete();
  }

  void complete() override {
    for (Local& l : locals_) {
      if (onDevice_) {
        cuda::synchronize(l.stream);
        braidResult_t async = braidSuccess;
        call("braidCommGetAsyncError", braidCommGetAsyncError(l.comm, &async));
        call(coll_.name, async);
      } else if (l.stream != nullptr) {
        call("braidStreamSynchronize", braidStreamSynchronize(l.stream));
      }
    }
  }

  bool buffersOnDevice() const override { return onDevice_; }
  // Every rank allocates its buffers in the same order, so its k-th window is every rank's.
  void* allocateBuffer(int local, size_t bytes) override {
    Local& l = locals_[local];
    cuda::selectDevice(l.rank);
    void* buffer = cuda::allocate(bytes);
    void* handle = nullptr;
    if (o_.registration == 1)
      call("braidCommRegister", braidCommRegister(l.comm, buffer, bytes, &handle));
    if (o_.registration == 2) {
      braidWindow_t window = nullptr;
      call("braidCommWindowRegister",
           braidCommWindowRegister(l.comm, buffer, bytes, &window, /*NCCL_WIN_COLL_SYMMETRIC*/ 1));
      handle = window;
    }
    if (handle != nullptr) l.registrations[buffer] = handle;
    return buffer;
  }
  void freeBuffer(int local, void* buffer) override {
    Local& l = locals_[local];
    cuda::selectDevice(l.rank);
    if (const auto it = l.registrations.find(buffer); it != l.registrations.end()) {
      if (o_.registration == 2)
        braidCommWindowDeregister(l.comm, static_cast<braidWindow_t>(it->second));
      else
        braidCommDeregister(l.comm, it->second);
      l.registrations.erase(it);
    }
    cuda::release(buffer);
  }
  void upload(int local, void* buffer, const void* host, size_t bytes) override {
    cuda::selectDevice(locals_[local].rank);
    cuda::upload(buffer, host, bytes);
  }
  void download(int local, void* host, const void* buffer, size_t bytes) override {
    cuda::selectDevice(locals_[local].rank);
    cuda::download(host, buffer, bytes);
  }

  double deviceCopyGBs() override {
    if (!onDevice_) return 0;
    cuda::selectDevice(rank());
    return cuda::copyBandwidthGBs();
  }
  // Rank r is on GPU r % GPUs of its host (launch.cc): the ranks on rank 0's host and GPU.
  int ranksOnFirstDevice() override {
    const int devices = std::max(1, cuda::deviceCount());
    int sharing = 0;
    for (const RankInfo& r : hosts_)
      sharing += r.host == hosts_.front().host && r.rank % devices == 0 ? 1 : 0;
    return std::max(1, sharing);
  }

  double predictedBusbw(size_t bytes) override {
    if (coll_.planned < 0) return -1;
    braidPrediction_t p;
    call("braidCommPredict",
         braidCommPredict(locals_.front().comm, static_cast<braidCollective_t>(coll_.planned),
                          bytes, &p));
    return p.busBandwidthGBs;
  }

  // The table's header: braid's version, the launch, and the communicator's plan.
  RunInfo runInfo(const LaunchInfo& launch) {
    int version = 0;
    braidGetVersion(&version);
    const char* plan = nullptr;
    call("braidCommDescribePlan", braidCommDescribePlan(locals_.front().comm, &plan));
    return RunInfo{launch.mode,
                   launch.processes > 0 ? launch.processes : nranks_,
                   o_.threadsPerProcess,
                   nranks_,
                   fmt::format("{}.{}.{}", version / 10000, version / 100 % 100, version % 100),
                   {},
                   "braid-perf",
                   "braid",
                   /*predicts=*/true,
                   plan,
                   launch.binding};
  }

 private:
  struct Local {
    braidComm_t comm = nullptr;
    int rank = 0;
    braidStream_t stream = nullptr;
    std::vector<char> scratch;             // the tool's exchanges, in host memory
    void* deviceScratch = nullptr;         // ... and on a CUDA communicator, in device memory
    std::map<void*, void*> registrations;  // -R: each buffer's handle or window
  };

  // Calls go in a group where one thread drives several ranks, or where -m aggregates them.
  bool grouped() const { return locals_.size() > 1 || o_.aggIters > 1; }

  // The stream of the tool's own exchanges: a CPU communicator's NULL (the call completes before
  // it returns, or at the group's end), a CUDA communicator's own.
  braidStream_t controlStream(const Local& l) const { return onDevice_ ? l.stream : nullptr; }

  // Runs `exchange` (a call of one local rank on controlStream()) on a copy of `bytes` of host
  // data for every local rank, in one group, waited for; the first's result comes back to `host`
  // (every rank's is the same).
  template <typename Exchange>
  void exchange(void* host, size_t bytes, Exchange&& run) {
    std::vector<void*> data;
    for (Local& l : locals_) {
      if (locals_.size() == 1 && !onDevice_) {
        data.push_back(host);
        continue;
      }
      std::memcpy(l.scratch.data(), host, bytes);
      if (onDevice_) {
        cuda::selectDevice(l.rank);
        cuda::upload(l.deviceScratch, l.scratch.data(), bytes);
      }
      data.push_back(onDevice_ ? l.deviceScratch : l.scratch.data());
    }
    startGroup();
    for (size_t i = 0; i < locals_.size(); ++i) call("braid exchange", run(locals_[i], data[i]));
    endGroup();
    if (onDevice_) complete();
    Local& first = locals_.front();
    if (onDevice_) {
      cuda::selectDevice(first.rank);
      cuda::download(host, first.deviceScratch, bytes);
    } else if (data.front() != host) {
      std::memcpy(host, data.front(), bytes);
    }
  }

  void call(const char* what, braidResult_t result) {
    if (result != braidSuccess)
      throw RunError(
          fmt::format("{} failed: {}: {}", what, braidGetErrorString(result),
                      braidGetLastError(locals_.empty() ? nullptr : locals_.front().comm)));
  }

  const Options& o_;
  const Collective& coll_;
  const bool onDevice_;
  int nranks_ = 0;
  std::vector<Local> locals_;
  std::vector<RankInfo> hosts_;  // rankInfo()'s answer
};

}  // namespace

int64_t runBenchmark(const Options& options, const std::vector<braidComm_t>& comms,
                     const LaunchInfo& launch) {
  BraidBenchComm bench(options, comms);
  return runSweeps(options, bench, bench.runInfo(launch));
}

}  // namespace braid_perf
