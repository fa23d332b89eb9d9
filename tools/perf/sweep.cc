#include "perf/sweep.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>

#include "perf/collectives.h"
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

// The calls' send and receive buffers: host memory, or the communicator's device memory with
// host mirrors (same offsets) where inputs are filled and outputs checked.
class Buffers {
 public:
  Buffers(BenchComm& comm, int local, size_t bytes)
      : comm_(comm),
        local_(local),
        onDevice_(comm.buffersOnDevice()),
        bytes_(bytes),
        hostSend_(allocateTouched(bytes)),
        hostRecv_(allocateTouched(bytes)) {
    send_ = onDevice_ ? static_cast<char*>(comm.allocateBuffer(local, bytes)) : hostSend_.get();
    recv_ = onDevice_ ? static_cast<char*>(comm.allocateBuffer(local, bytes)) : hostRecv_.get();
  }
  ~Buffers() {
    if (!onDevice_) return;
    comm_.freeBuffer(local_, send_);
    comm_.freeBuffer(local_, recv_);
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;

  char* send() const { return send_; }
  char* recv() const { return recv_; }
  // Where p (in send() or recv()) is mirrored on the host.
  char* mirror(char* p) const {
    if (!onDevice_) return p;
    const bool inRecv = p >= recv_ && p <= recv_ + bytes_;
    return inRecv ? hostRecv_.get() + (p - recv_) : hostSend_.get() + (p - send_);
  }
  void upload(char* p, size_t bytes) {
    if (onDevice_ && bytes > 0) comm_.upload(local_, p, mirror(p), bytes);
  }
  void download(char* p, size_t bytes) {
    if (onDevice_ && bytes > 0) comm_.download(local_, mirror(p), p, bytes);
  }

 private:
  BenchComm& comm_;
  const int local_;
  const bool onDevice_;
  const size_t bytes_;
  HostBuffer hostSend_, hostRecv_;
  char* send_ = nullptr;
  char* recv_ = nullptr;
};

// One of the thread's ranks: its rank and its buffers.
struct RankSlot {
  RankSlot(BenchComm& comm, int local, size_t bytes)
      : rank(comm.rank() + local), buffers(comm, local, bytes) {}
  int rank;
  Buffers buffers;
};

class Sweeps {
 public:
  Sweeps(const Options& options, BenchComm& comm)
      : o_(options), coll_(*options.collective), comm_(comm), nranks_(comm.nranks()) {
    for (int local = 0; local < comm.localRanks(); ++local)
      slots_.push_back(std::make_unique<RankSlot>(comm, local, o_.maxBytes));
  }

  int64_t run(RunInfo info) {
    info.ranks = comm_.rankInfo();
    if (comm_.buffersOnDevice()) {
      // Measured by rank 0 alone (the others wait at the exchange), so that no other copy shares
      // the device meanwhile; every rank learns the figure.
      comm_.barrier();
      copyGBs_ = comm_.rank() == 0 ? comm_.deviceCopyGBs() : 0;
      comm_.maxOverRanks(&copyGBs_, 1);
      ranksOnDevice_ = comm_.ranksOnFirstDevice();
    }
    info.deviceCopyGBs = copyGBs_;
    if (comm_.rank() == 0) {
      reporter_.emplace(stdout, o_, std::move(info));
      reporter_->printHeader();
    }
    forEachTypeAndOp(o_, coll_.reduces,
                     [&](braidDataType_t type, braidRedOp_t op) { timeTest(type, op); });
    if (reporter_) reporter_->finish();
    return wrongTotal_;
  }

 private:
  char* sendPointer(const RankSlot& s, const Layout& l, size_t typeSize, bool inPlace) const {
    return inPlace ? s.buffers.recv() + l.sendInPlaceOffset * s.rank * typeSize : s.buffers.send();
  }
  char* recvPointer(const RankSlot& s, const Layout& l, size_t typeSize, bool inPlace) const {
    return s.buffers.recv() + (inPlace ? l.recvInPlaceOffset * s.rank * typeSize : 0);
  }

  // `calls` calls of every rank of the thread, together; as nccl-tests, the k-th is shifted by k
  // times the row's bytes while the buffers hold that many rows (then it starts over).
  void launch(const Layout& l, braidDataType_t type, braidRedOp_t op, bool inPlace, int calls = 1) {
    const size_t typeSize = datatypeInfo(type).size;
    const size_t rowBytes = l.bytes(typeSize);
    const size_t rows = std::max<size_t>(1, rowBytes == 0 ? 1 : o_.maxBytes / rowBytes);
    comm_.startGroup();
    for (int k = 0; k < calls; ++k) {
      const size_t shift = rowBytes * (static_cast<size_t>(k) % rows);
      for (size_t local = 0; local < slots_.size(); ++local) {
        const RankSlot& s = *slots_[local];
        comm_.launch(static_cast<int>(local), sendPointer(s, l, typeSize, inPlace) + shift,
                     recvPointer(s, l, typeSize, inPlace) + shift, l.paramCount, type, op);
      }
    }
    comm_.endGroup();
  }

  // Fresh input, poisoned output, one run, every output element compared.
  int64_t checkedRun(const Layout& l, braidDataType_t type, braidRedOp_t op, bool inPlace) {
    const ValueModel model(type, op, nranks_, ++checkSeed_);
    const size_t typeSize = datatypeInfo(type).size;
    for (const auto& slot : slots_) {
      RankSlot& s = *slot;
      const size_t poisoned = inPlace ? l.inPlaceExtent(s.rank) : l.recvCount;
      char* send = sendPointer(s, l, typeSize, inPlace);
      poisonElements(s.buffers.mirror(s.buffers.recv()), poisoned, type);
      fillElements(s.buffers.mirror(send), l.sendCount, type,
                   [&](size_t i) { return coll_.input(model, l, s.rank, i); });
      s.buffers.upload(s.buffers.recv(), poisoned * typeSize);
      s.buffers.upload(send, l.sendCount * typeSize);
    }
    launch(l, type, op, inPlace);
    comm_.complete();
    int64_t wrong = 0;
    for (const auto& slot : slots_) {
      RankSlot& s = *slot;
      if (!coll_.hasOutput(s.rank, o_.root)) continue;
      char* recv = recvPointer(s, l, typeSize, inPlace);
      s.buffers.download(recv, l.recvCount * typeSize);
      wrong += static_cast<int64_t>(countWrongElements(
          s.buffers.mirror(recv), l.recvCount, type,
          [&](size_t i) { return coll_.expected(model, l, s.rank, nranks_, o_.root, i); }));
    }
    return wrong;
  }

  Measurement benchTime(const Layout& l, braidDataType_t type, braidRedOp_t op, bool inPlace) {
    comm_.barrier();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < o_.iters; ++i) launch(l, type, op, inPlace, o_.aggIters);
    comm_.complete();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
        (o_.iters * o_.aggIters);

    int64_t wrong = -1;
    if (o_.check && (!inPlace || coll_.checksInPlace)) wrong = checkedRun(l, type, op, inPlace);

    double agreed[2] = {seconds, static_cast<double>(wrong)};
    comm_.maxOverRanks(agreed, 2);
    const size_t typeSize = datatypeInfo(type).size;
    const double algbw = agreed[0] > 0 ? l.bytes(typeSize) / 1.0e9 / agreed[0] : 0;
    // The fewest bytes the ranks sharing a device must move through its memory: each reads its
    // input and writes its output once.
    const double leastBytes = static_cast<double>(ranksOnDevice_) *
                              static_cast<double>(l.sendCount + l.recvCount) *
                              static_cast<double>(typeSize);
    const double copyFraction =
        copyGBs_ > 0 && agreed[0] > 0 ? leastBytes / agreed[0] / 1.0e9 / copyGBs_ : -1;
    return {agreed[0] * 1.0e6, algbw, algbw * coll_.busFactor(nranks_),
            static_cast<int64_t>(agreed[1]), copyFraction};
  }

  void warmUp(size_t bytes, braidDataType_t type, braidRedOp_t op) {
    const Layout l = coll_.layout(bytes / datatypeInfo(type).size, nranks_);
    for (int i = 0; i < o_.warmupIters; ++i) launch(l, type, op, false, o_.aggIters);
    comm_.complete();
  }

  // nccl-tests' TimeTest: warm up at the largest and the smallest size, then one row per size.
  void timeTest(braidDataType_t type, braidRedOp_t op) {
    comm_.barrier();
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
      const double predicted = comm_.predictedBusbw(l.bytes(info.size));
      if (reporter_)
        reporter_->addRow({l.bytes(info.size), l.paramCount, info.name, redop,
                           coll_.rooted ? o_.root : -1, outOfPlace, inPlace, predicted});
    }
  }

  const Options& o_;
  const Collective& coll_;
  BenchComm& comm_;
  const int nranks_;
  std::vector<std::unique_ptr<RankSlot>> slots_;
  double copyGBs_ = 0;
  int ranksOnDevice_ = 1;
  uint64_t checkSeed_ = 0;
  int64_t wrongTotal_ = 0;
  std::optional<Reporter> reporter_;
};

}  // namespace

int64_t runSweeps(const Options& options, BenchComm& comm, RunInfo run) {
  return Sweeps(options, comm).run(std::move(run));
}

}  // namespace braid_perf
