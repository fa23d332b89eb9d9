#include "peer_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "perf/collectives.h"
#include "perf/types.h"
#include "perf/values.h"

namespace braid_perf {
namespace {

template <typename T>
bool contains(const std::vector<T>& values, const T& value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

class PeerBench {
 public:
  PeerBench(const Options& options, PeerComm& comm, const PeerInfo& info)
      : o_(options),
        coll_(*options.collective),
        comm_(comm),
        info_(info),
        send_(o_.maxBytes),  // value-initialized: every page touched before any timing
        recv_(o_.maxBytes) {}

  int64_t run() {
    const std::vector<RankInfo> ranks = comm_.rankInfo();
    if (comm_.rank() == 0) {
      RunInfo run;
      run.launch = info_.launch;
      run.processes = run.nranks = comm_.nranks();
      run.threadsPerProcess = 1;
      run.braidVersion = info_.version;
      run.ranks = ranks;
      run.tool = info_.tool;
      run.library = info_.library;
      reporter_.emplace(stdout, o_, std::move(run));
      reporter_->printHeader();
    }
    forEachTypeAndOp(o_, coll_.reduces,
                     [&](braidDataType_t type, braidRedOp_t op) { timeTest(type, op); });
    if (reporter_) reporter_->finish();
    return wrongTotal_;
  }

 private:
  char* sendPointer(const Layout& l, size_t typeSize, bool inPlace) {
    return inPlace ? recv_.data() + l.sendInPlaceOffset * comm_.rank() * typeSize : send_.data();
  }
  char* recvPointer(const Layout& l, size_t typeSize, bool inPlace) {
    return recv_.data() + (inPlace ? l.recvInPlaceOffset * comm_.rank() * typeSize : 0);
  }

  void launch(const Layout& l, braidDataType_t type, braidRedOp_t op, bool inPlace) {
    const size_t typeSize = datatypeInfo(type).size;
    comm_.run(sendPointer(l, typeSize, inPlace), recvPointer(l, typeSize, inPlace), l.paramCount,
              type, op);
  }

  int64_t checkedRun(const Layout& l, braidDataType_t type, braidRedOp_t op, bool inPlace) {
    const int rank = comm_.rank(), nranks = comm_.nranks();
    const ValueModel model(type, op, nranks, ++checkSeed_);
    const size_t typeSize = datatypeInfo(type).size;
    poisonElements(recv_.data(), inPlace ? l.inPlaceExtent(rank) : l.recvCount, type);
    fillElements(sendPointer(l, typeSize, inPlace), l.sendCount, type,
                 [&](size_t i) { return coll_.input(model, l, rank, i); });
    launch(l, type, op, inPlace);
    if (!coll_.hasOutput(rank, o_.root)) return 0;
    return static_cast<int64_t>(countWrongElements(
        recvPointer(l, typeSize, inPlace), l.recvCount, type,
        [&](size_t i) { return coll_.expected(model, l, rank, nranks, o_.root, i); }));
  }

  Measurement benchTime(const Layout& l, braidDataType_t type, braidRedOp_t op, bool inPlace) {
    comm_.barrier();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < o_.iters; ++i) launch(l, type, op, inPlace);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / o_.iters;
    int64_t wrong = -1;
    if (o_.check && (!inPlace || coll_.checksInPlace)) wrong = checkedRun(l, type, op, inPlace);
    double agreed[2] = {seconds, static_cast<double>(wrong)};
    comm_.maxOverRanks(agreed, 2);
    const double algbw = agreed[0] > 0 ? l.bytes(datatypeInfo(type).size) / 1.0e9 / agreed[0] : 0;
    return {agreed[0] * 1.0e6, algbw, algbw * coll_.busFactor(comm_.nranks()),
            static_cast<int64_t>(agreed[1])};
  }

  void warmUp(size_t bytes, braidDataType_t type, braidRedOp_t op) {
    const Layout l = coll_.layout(bytes / datatypeInfo(type).size, comm_.nranks());
    for (int i = 0; i < o_.warmupIters; ++i) launch(l, type, op, false);
  }

  // As braid-perf: warm up at the largest and the smallest size, then one row per size.
  void timeTest(braidDataType_t type, braidRedOp_t op) {
    comm_.barrier();
    warmUp(o_.maxBytes, type, op);
    warmUp(o_.minBytes, type, op);
    const DatatypeInfo& info = datatypeInfo(type);
    for (size_t size : sweepSizes(o_)) {
      const Layout l = coll_.layout(size / info.size, comm_.nranks());
      const char* redop = coll_.reduces ? kOpNames[op] : kNoOpName;
      if (reporter_) reporter_->progress(l.bytes(info.size), info.name, redop);
      const Measurement outOfPlace = benchTime(l, type, op, false);
      const Measurement inPlace = benchTime(l, type, op, true);
      wrongTotal_ += std::max<int64_t>(outOfPlace.wrong, 0) + std::max<int64_t>(inPlace.wrong, 0);
      if (reporter_)
        reporter_->addRow(
            {l.bytes(info.size), l.paramCount, info.name, redop, -1, outOfPlace, inPlace});
    }
  }

  const Options& o_;
  const Collective& coll_;
  PeerComm& comm_;
  const PeerInfo& info_;
  std::vector<char> send_, recv_;
  uint64_t checkSeed_ = 0;
  int64_t wrongTotal_ = 0;
  std::optional<Reporter> reporter_;
};

}  // namespace

int64_t runPeerBenchmark(const Options& options, PeerComm& comm, const PeerInfo& info) {
  return PeerBench(options, comm, info).run();
}

std::optional<Options> parsePeerOptions(int argc, char** argv,
                                        const std::vector<std::string>& collectives,
                                        const std::vector<braidDataType_t>& datatypes,
                                        const std::vector<braidRedOp_t>& ops) {
  std::optional<Options> o = parseOptions(argc, argv);
  if (!o) return o;
  if (!contains(collectives, std::string(o->collective->name)))
    throw UsageError(fmt::format("{}: not measured by this driver; expected one of: {}",
                                 o->collective->name, fmt::join(collectives, ", ")));
  for (braidDataType_t type : o->datatypes)
    if (!contains(datatypes, type))
      throw UsageError(
          fmt::format("-d {}: this library has no such datatype", datatypeInfo(type).name));
  if (o->collective->reduces)
    for (braidRedOp_t op : o->ops)
      if (!contains(ops, op))
        throw UsageError(fmt::format("-o {}: this library has no such reduction", kOpNames[op]));
  if (o->processes > 0 || o->threadsPerProcess > 1)
    throw UsageError("--np and -t: one rank per process; start the ranks with mpirun -np N");
  o->blocking = true;  // every peer call returns when its result is in place
  return o;
}

}  // namespace braid_perf
