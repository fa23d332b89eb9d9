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
#include "perf/sweep.h"

namespace braid_perf {
namespace {

// What one rank tells the others for the "Using devices" lines; a fixed size for all-gather.
struct RankRecord {
  int32_t pid;
  char host[124];
};

// A braid communicator as the sweeps drive it: calls on a host stream (synchronized by
// complete()) or, with -z 1, on the NULL stream.
class BraidBenchComm : public BenchComm {
 public:
  BraidBenchComm(const Options& options, braidComm_t comm)
      : o_(options), coll_(*options.collective), comm_(comm) {
    call("braidCommCount", braidCommCount(comm, &nranks_));
    call("braidCommUserRank", braidCommUserRank(comm, &rank_));
    checkRoot(o_, nranks_);
    scratch_.resize(nranks_ + 1);
    if (!o_.blocking) call("braidStreamCreate", braidStreamCreate(&stream_));
  }
  ~BraidBenchComm() override {
    if (stream_ != nullptr) braidStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }

  // A one-element all-reduce on the NULL stream: returns once every rank has entered it.
  void barrier() override {
    float one = 1;
    call("braidAllReduce (barrier)",
         braidAllReduce(&one, &one, 1, braidFloat32, braidSum, comm_, nullptr));
  }

  void maxOverRanks(double* values, int count) override {
    call("braidAllReduce (result max)",
         braidAllReduce(values, values, count, braidFloat64, braidMax, comm_, nullptr));
  }

  std::vector<RankInfo> rankInfo() override {
    RankRecord& mine = scratch_[nranks_];  // past the gathered records
    mine = RankRecord{};
    mine.pid = static_cast<int32_t>(getpid());
    gethostname(mine.host, sizeof mine.host - 1);
    call("braidAllGather (rank info)",
         braidAllGather(&mine, scratch_.data(), sizeof mine, braidUint8, comm_, nullptr));
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
  }

  void complete() override {
    if (stream_ != nullptr) call("braidStreamSynchronize", braidStreamSynchronize(stream_));
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
  std::vector<RankRecord> scratch_;
  braidStream_t stream_ = nullptr;
};

}  // namespace

int64_t runBenchmark(const Options& options, braidComm_t comm, const LaunchInfo& launch) {
  BraidBenchComm bench(options, comm);
  return runSweeps(options, bench, bench.runInfo(launch));
}

}  // namespace braid_perf
