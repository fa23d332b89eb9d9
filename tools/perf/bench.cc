#include "perf/bench.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
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

// A braid communicator as the sweeps drive it. A CPU communicator's calls go on a host stream
// (synchronized by complete()) or, with -z 1, on the NULL stream. A CUDA communicator's go on a
// CUDA stream of the rank, on buffers in its GPU's memory (with -z 1 each call is waited for);
// its own exchanges (barrier, result max, rank info) pass through a small device buffer.
class BraidBenchComm : public BenchComm {
 public:
  BraidBenchComm(const Options& options, braidComm_t comm)
      : o_(options), coll_(*options.collective), comm_(comm), onDevice_(options.device == "cuda") {
    call("braidCommCount", braidCommCount(comm, &nranks_));
    call("braidCommUserRank", braidCommUserRank(comm, &rank_));
    checkRoot(o_, nranks_);
    scratch_.resize(nranks_ + 1);
    if (onDevice_) {
      stream_ = cuda::createStream();
      deviceScratch_ = static_cast<char*>(cuda::allocate(scratch_.size() * sizeof(RankRecord)));
    } else if (!o_.blocking) {
      call("braidStreamCreate", braidStreamCreate(&stream_));
    }
  }
  ~BraidBenchComm() override {
    if (onDevice_) {
      cuda::release(deviceScratch_);
      cuda::destroyStream(stream_);
    } else if (stream_ != nullptr) {
      braidStreamDestroy(stream_);
    }
  }

  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }

  // A one-element all-reduce, waited for: returns once every rank has entered it.
  void barrier() override {
    float one = 1;
    exchange(&one, sizeof one, [&](void* p) {
      return braidAllReduce(p, p, 1, braidFloat32, braidSum, comm_, controlStream());
    });
  }

  void maxOverRanks(double* values, int count) override {
    exchange(values, count * sizeof(double), [&](void* p) {
      return braidAllReduce(p, p, count, braidFloat64, braidMax, comm_, controlStream());
    });
  }

  std::vector<RankInfo> rankInfo() override {
    RankRecord& mine = scratch_[nranks_];  // past the gathered records
    mine = RankRecord{};
    mine.pid = static_cast<int32_t>(getpid());
    gethostname(mine.host, sizeof mine.host - 1);
    exchange(scratch_.data(), scratch_.size() * sizeof(RankRecord), [&](void* p) {
      auto* records = static_cast<RankRecord*>(p);
      return braidAllGather(records + nranks_, records, sizeof mine, braidUint8, comm_,
                            controlStream());
    });
    std::vector<RankInfo> ranks;
    for (int r = 0; r < nranks_; ++r) {
      RankRecord& record = scratch_[r];
      record.host[sizeof record.host - 1] = '\0';
      ranks.push_back({r, record.pid, record.host});
    }
    return ranks;
  }

  void launch(const void* send, void* recv, size_t count, braidDataType_t type,
              braidRedOp_t op) override {
    call(coll_.name,
         coll_.call({send, recv, count, type, op, o_.root, rank_, nranks_, comm_, stream_}));
    if (onDevice_ && o_.blocking) complete();
  }

  void complete() override {
    if (onDevice_) {
      cuda::synchronize(stream_);
      braidResult_t async = braidSuccess;
      call("braidCommGetAsyncError", braidCommGetAsyncError(comm_, &async));
      call(coll_.name, async);
    } else if (stream_ != nullptr) {
      call("braidStreamSynchronize", braidStreamSynchronize(stream_));
    }
  }

  bool buffersOnDevice() const override { return onDevice_; }
  void* allocateBuffer(size_t bytes) override { return cuda::allocate(bytes); }
  void freeBuffer(void* buffer) override { cuda::release(buffer); }
  void upload(void* buffer, const void* host, size_t bytes) override {
    cuda::upload(buffer, host, bytes);
  }
  void download(void* host, const void* buffer, size_t bytes) override {
    cuda::download(host, buffer, bytes);
  }

  double predictedBusbw(size_t bytes) override {
    if (coll_.planned < 0) return -1;
    braidPrediction_t p;
    call("braidCommPredict",
         braidCommPredict(comm_, static_cast<braidCollective_t>(coll_.planned), bytes, &p));
    return p.busBandwidthGBs;
  }

  // The table's header: braid's version, the launch, and the communicator's plan.
  RunInfo runInfo(const LaunchInfo& launch) {
    int version = 0;
    braidGetVersion(&version);
    const char* plan = nullptr;
    call("braidCommDescribePlan", braidCommDescribePlan(comm_, &plan));
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
  // The stream of the tool's own exchanges: a CPU communicator's NULL (the call completes before
  // it returns), a CUDA communicator's own.
  braidStream_t controlStream() const { return onDevice_ ? stream_ : nullptr; }

  // Runs `exchange` (a call on controlStream()) over `bytes` of host data in place: on a CUDA
  // communicator through the device scratch buffer, waited for.
  template <typename Exchange>
  void exchange(void* host, size_t bytes, Exchange&& run) {
    if (!onDevice_) return call("braid exchange", run(host));
    cuda::upload(deviceScratch_, host, bytes);
    call("braid exchange", run(deviceScratch_));
    complete();
    cuda::download(host, deviceScratch_, bytes);
  }

  void call(const char* what, braidResult_t result) {
    if (result != braidSuccess)
      throw RunError(fmt::format("{} failed: {}: {}", what, braidGetErrorString(result),
                                 braidGetLastError(comm_)));
  }

  const Options& o_;
  const Collective& coll_;
  braidComm_t comm_;
  int rank_ = 0;
  int nranks_ = 0;
  const bool onDevice_;
  std::vector<RankRecord> scratch_;
  char* deviceScratch_ = nullptr;  // scratch_'s size, on a CUDA communicator
  braidStream_t stream_ = nullptr;
};

}  // namespace

int64_t runBenchmark(const Options& options, braidComm_t comm, const LaunchInfo& launch) {
  BraidBenchComm bench(options, comm);
  return runSweeps(options, bench, bench.runInfo(launch));
}

}  // namespace braid_perf
