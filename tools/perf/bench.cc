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
#include "perf/report.h"
#include "perf/types.h"
#include "perf/values.h"

namespace braid_perf {
namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using HostBuffer = std::unique_ptr<char, FreeDeleter>;

// Page-aligned and touched once here, so no timed iteration pays for first-touch page faults.
HostBuffer allocateTouched(size_t bytes) {
  constexpr size_t kPage = 4096;
  const size_t rounded = std::max(kPage, (bytes + kPage - 1) / kPage * kPage);
  char* p = static_cast<char*>(std::aligned_alloc(kPage, rounded));
  if (p == nullptr) throw RunError(fmt::format("cannot allocate a {}-byte buffer", rounded));
  std::memset(p, 0, rounded);
  return HostBuffer(p);
}

// What one rank tells the others for the "Using devices" lines; a fixed size for all-gather.
struct RankRecord {
  int32_t pid;
  char host[124];
};

class RankBench {
 public:
  RankBench(const Options& options, braidComm_t comm, const LaunchInfo& launch)
      : o_(options), coll_(*options.collective), comm_(comm), launch_(launch) {
    call("braidCommCount", braidCommCount(comm, &nranks_));
    call("braidCommUserRank", braidCommUserRank(comm, &rank_));
    checkRoot(o_, nranks_);
    send_ = allocateTouched(o_.maxBytes);
    recv_ = allocateTouched(o_.maxBytes);
    scratch_ = allocateTouched(sizeof(RankRecord) * (nranks_ + 1));
    if (!o_.blocking) call("braidStreamCreate", braidStreamCreate(&stream_));
  }
  ~RankBench() {
    if (stream_ != nullptr) braidStreamDestroy(stream_);
  }

  int64_t run() {
    const std::vector<RankInfo> ranks = exchangeRankInfo();
    if (rank_ == 0) {
      int version = 0;
      braidGetVersion(&version);
      const char* plan = nullptr;
      call("braidCommDescribePlan", braidCommDescribePlan(comm_, &plan));
      reporter_.emplace(
          stdout, o_,
          RunInfo{launch_.mode, launch_.processes > 0 ? launch_.processes : nranks_,
                  o_.threadsPerProcess, nranks_,
                  fmt::format("{}.{}.{}", version / 10000, version / 100 % 100, version % 100),
                  ranks, "braid-perf", "braid", /*predicts=*/true, plan, launch_.binding});
      reporter_->printHeader();
    }
    forEachTypeAndOp(o_, coll_.reduces,
                     [&](braidDataType_t type, braidRedOp_t op) { timeTest(type, op); });
    if (reporter_) reporter_->finish();
    return wrongTotal_;
  }

 private:
  void call(const char* what, braidResult_t result) {
    if (result != braidSuccess)
      throw RunError(fmt::format("{} failed: {}: {}", what, braidGetErrorString(result),
                                 braidGetLastError(comm_)));
  }

  // A one-element all-reduce on the NULL stream: returns once every rank has entered it.
  void barrier() {
    call("braidAllReduce (barrier)",
         braidAllReduce(scratch_.get(), scratch_.get(), 1, braidFloat32, braidSum, comm_, nullptr));
  }

  // The slowest rank's time and the most wrong elements any rank saw, on every rank.
  void maxOverRanks(double values[2]) {
    double* shared = reinterpret_cast<double*>(scratch_.get());
    std::memcpy(shared, values, 2 * sizeof(double));
    call("braidAllReduce (result max)",
         braidAllReduce(shared, shared, 2, braidFloat64, braidMax, comm_, nullptr));
    std::memcpy(values, shared, 2 * sizeof(double));
  }

  std::vector<RankInfo> exchangeRankInfo() {
    RankRecord mine{};
    mine.pid = static_cast<int32_t>(getpid());
    gethostname(mine.host, sizeof mine.host - 1);
    char* all = scratch_.get();
    char* own = all + nranks_ * sizeof mine;  // past the gathered records
    std::memcpy(own, &mine, sizeof mine);
    call("braidAllGather (rank info)",
         braidAllGather(own, all, sizeof mine, braidUint8, comm_, nullptr));
    std::vector<RankInfo> ranks;
    for (int r = 0; r < nranks_; ++r) {
      RankRecord record;
      std::memcpy(&record, all + r * sizeof record, sizeof record);
      record.host[sizeof record.host - 1] = '\0';
      ranks.push_back({r, record.pid, record.host});
    }
    return ranks;
  }

  char* sendPointer(const Layout& l, size_t typeSize, bool inPlace) const {
    return inPlace ? recv_.get() + l.sendInPlaceOffset * rank_ * typeSize : send_.get();
  }
  char* recvPointer(const Layout& l, size_t typeSize, bool inPlace) const {
    return recv_.get() + (inPlace ? l.recvInPlaceOffset * rank_ * typeSize : 0);
  }

  void launch(const Layout& l, braidDataType_t type, braidRedOp_t op, bool inPlace) {
    const size_t typeSize = datatypeInfo(type).size;
    call(coll_.name,
         coll_.call({sendPointer(l, typeSize, inPlace), recvPointer(l, typeSize, inPlace),
                     l.paramCount, type, op, o_.root, rank_, nranks_, comm_, stream_}));
  }

  void complete() {
    if (stream_ != nullptr) call("braidStreamSynchronize", braidStreamSynchronize(stream_));
  }

  // Fresh input, poisoned output, one run, every output element compared.
  int64_t checkedRun(const Layout& l, braidDataType_t type, braidRedOp_t op, bool inPlace) {
    const ValueModel model(type, op, nranks_, ++checkSeed_);
    const size_t typeSize = datatypeInfo(type).size;
    if (inPlace)
      poisonElements(recv_.get(), l.inPlaceExtent(rank_), type);
    else
      poisonElements(recv_.get(), l.recvCount, type);
    fillElements(sendPointer(l, typeSize, inPlace), l.sendCount, type,
                 [&](size_t i) { return coll_.input(model, l, rank_, i); });
    launch(l, type, op, inPlace);
    complete();
    if (!coll_.hasOutput(rank_, o_.root)) return 0;
    return static_cast<int64_t>(countWrongElements(
        recvPointer(l, typeSize, inPlace), l.recvCount, type,
        [&](size_t i) { return coll_.expected(model, l, rank_, nranks_, o_.root, i); }));
  }

  Measurement benchTime(const Layout& l, braidDataType_t type, braidRedOp_t op, bool inPlace) {
    barrier();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < o_.iters; ++i) launch(l, type, op, inPlace);
    complete();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / o_.iters;

    int64_t wrong = -1;
    if (o_.check && (!inPlace || coll_.checksInPlace)) wrong = checkedRun(l, type, op, inPlace);

    double agreed[2] = {seconds, static_cast<double>(wrong)};
    maxOverRanks(agreed);
    const double algbw = agreed[0] > 0 ? l.bytes(datatypeInfo(type).size) / 1.0e9 / agreed[0] : 0;
    return {agreed[0] * 1.0e6, algbw, algbw * coll_.busFactor(nranks_),
            static_cast<int64_t>(agreed[1])};
  }

  double predictedBusbw(size_t bytes) {
    if (coll_.planned < 0) return -1;
    braidPrediction_t p;
    call("braidCommPredict",
         braidCommPredict(comm_, static_cast<braidCollective_t>(coll_.planned), bytes, &p));
    return p.busBandwidthGBs;
  }

  void warmUp(size_t bytes, braidDataType_t type, braidRedOp_t op) {
    const Layout l = coll_.layout(bytes / datatypeInfo(type).size, nranks_);
    for (int i = 0; i < o_.warmupIters; ++i) launch(l, type, op, false);
    complete();
  }

  // nccl-tests' TimeTest: warm up at the largest and the smallest size, then one row per size.
  void timeTest(braidDataType_t type, braidRedOp_t op) {
    barrier();
    warmUp(o_.maxBytes, type, op);
    warmUp(o_.minBytes, type, op);
    const DatatypeInfo& info = datatypeInfo(type);
    for (size_t size : sweepSizes(o_)) {
      const Layout l = coll_.layout(size / info.size, nranks_);
      const char* redop = coll_.reduces ? kOpNames[op] : kNoOpName;
      if (reporter_) reporter_->progress(l.bytes(info.size), info.name, redop);
      const Measurement outOfPlace = benchTime(l, type, op, false);
      const Measurement inPlace = benchTime(l, type, op, true);
      wrongTotal_ += std::max<int64_t>(outOfPlace.wrong, 0) + std::max<int64_t>(inPlace.wrong, 0);
      if (reporter_)
        reporter_->addRow({l.bytes(info.size), l.paramCount, info.name, redop,
                           coll_.rooted ? o_.root : -1, outOfPlace, inPlace,
                           predictedBusbw(l.bytes(info.size))});
    }
  }

  const Options& o_;
  const Collective& coll_;
  braidComm_t comm_;
  const LaunchInfo& launch_;
  int rank_ = 0;
  int nranks_ = 0;
  HostBuffer send_, recv_, scratch_;
  braidStream_t stream_ = nullptr;
  uint64_t checkSeed_ = 0;
  int64_t wrongTotal_ = 0;
  std::optional<Reporter> reporter_;
};

}  // namespace

int64_t runBenchmark(const Options& options, braidComm_t comm, const LaunchInfo& launch) {
  return RankBench(options, comm, launch).run();
}

}  // namespace braid_perf
