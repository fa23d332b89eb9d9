// The device form of the ring engine (coll/ring_engine.h, the code nvcc compiles into kernels)
// on CPU threads: a "grid" of R ranks x C channels x T threads per block, each block's threads
// meeting at a std::barrier where a kernel has __syncthreads, FIFOs in ordinary memory, the
// element reductions of kernels/element_reduce.h. Every collective x dtype x op runs at counts
// 0, 1, 7, 1031 and beyond the FIFO, for R in {1, 2, 3, 4, 8}, T in {1, 4, 32}, FIFO slots
// {2, 4} and C in {1, 2}; outputs are poisoned first and every element is compared with the
// multirank grid's independent reference (grid_common.h). The same binary is built with
// ThreadSanitizer (label tsan).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "coll/ring_engine.h"
#include "kernels/element_reduce.h"
#include "multirank/grid_common.h"

namespace braid_test {
namespace {

using braid::Collective;
using Clock = std::chrono::steady_clock;

// A thread block's stand-in: its threads meet at one barrier; waits yield (two cores run every
// thread of the grid) and give up at the deadline.
// A block's vote for CpuGroup::any: two flags used in turn, so one can be cleared while the
// other is in use.
struct Vote {
  std::atomic<bool> flag[2] = {false, false};
};

class CpuGroup {
 public:
  CpuGroup(int index, int size, std::barrier<>* barrier, Vote* vote, Clock::time_point deadline)
      : index_(index), size_(size), barrier_(barrier), vote_(vote), deadline_(deadline) {}
  int index() const { return index_; }
  int size() const { return size_; }
  void sync() { barrier_->arrive_and_wait(); }
  // Every thread has left the previous vote once all reach this barrier, so the leader may clear
  // that vote's flag for the next one.
  bool any(bool mine) {
    std::atomic<bool>& flag = vote_->flag[phase_ % 2];
    if (mine) flag.store(true);
    barrier_->arrive_and_wait();
    const bool result = flag.load();
    if (index_ == 0) vote_->flag[(phase_ + 1) % 2].store(false);
    ++phase_;
    return result;
  }
  bool keepWaiting() {
    std::this_thread::yield();
    return Clock::now() < deadline_;
  }

 private:
  int index_, size_;
  std::barrier<>* barrier_;
  Vote* vote_;
  Clock::time_point deadline_;
  unsigned phase_ = 0;
};

struct Shape {
  int ranks, channels, threads, slots;
};

std::string shapeName(const Shape& s) {
  return std::to_string(s.ranks) + "ranks_" + std::to_string(s.channels) + "ch_" +
         std::to_string(s.threads) + "threads_" + std::to_string(s.slots) + "slots";
}

constexpr size_t kSlotBytes = 256;  // small, so that 1031 elements take many chunks
constexpr auto kDeadline = std::chrono::seconds(60);

struct Case {
  Collective collective;
  braidDataType_t type;
  braidRedOp_t op;
  size_t count;
  int root;
  uint64_t salt;
};

const char* collectiveName(Collective c) {
  switch (c) {
    case Collective::AllReduce: return "allreduce";
    case Collective::ReduceScatter: return "reducescatter";
    case Collective::AllGather: return "allgather";
    case Collective::Broadcast: return "broadcast";
    case Collective::Reduce: return "reduce";
    default: return "?";
  }
}

bool reduces(Collective c) {
  return c == Collective::AllReduce || c == Collective::ReduceScatter || c == Collective::Reduce;
}

std::string describe(const Case& c, const Shape& s) {
  return std::string(collectiveName(c.collective)) + " " + dtypeName(c.type) + " " +
         (reduces(c.collective) ? opName(c.op) : "") + " count=" + std::to_string(c.count) +
         " root=" + std::to_string(c.root) + " " + shapeName(s);
}

// Calls f(R{}) with the element reduction of (type, op).
template <typename F>
void withReduction(braidDataType_t type, braidRedOp_t op, F&& f) {
  auto withType = [&](auto typeConstant) {
    constexpr braidDataType_t kType = decltype(typeConstant)::value;
    visitOp(op, [&](auto opConstant) {
      constexpr braidRedOp_t kOp = decltype(opConstant)::value;
      if constexpr (kOp != kPreMulSum) f(braid::kernels::ElementReduce<kType, kOp>{});
    });
  };
  switch (type) {
#define BRAID_TYPE_CASE(t) \
  case t: return withType(std::integral_constant<braidDataType_t, t>{});
    BRAID_TYPE_CASE(braidInt8)
    BRAID_TYPE_CASE(braidUint8)
    BRAID_TYPE_CASE(braidInt32)
    BRAID_TYPE_CASE(braidUint32)
    BRAID_TYPE_CASE(braidInt64)
    BRAID_TYPE_CASE(braidUint64)
    BRAID_TYPE_CASE(braidFloat16)
    BRAID_TYPE_CASE(braidFloat32)
    BRAID_TYPE_CASE(braidFloat64)
    BRAID_TYPE_CASE(braidBfloat16)
    BRAID_TYPE_CASE(braidFloat8e4m3)
    BRAID_TYPE_CASE(braidFloat8e5m2)
#undef BRAID_TYPE_CASE
    default: break;
  }
}

// One rank's buffers for a case: 64-byte aligned plus a shift of 0 or 1 element (salt), so the
// engine meets both its 16-byte path and its element path.
struct RankBuffers {
  std::vector<unsigned char> inputStorage, outputStorage;
  unsigned char* input = nullptr;
  unsigned char* output = nullptr;
  size_t inputElems = 0, outputElems = 0;
};

unsigned char* alignedIn(std::vector<unsigned char>& storage, size_t bytes, size_t shift) {
  storage.assign(bytes + 128, 0xa5);
  auto base = (reinterpret_cast<uintptr_t>(storage.data()) + 63) / 64 * 64;
  return reinterpret_cast<unsigned char*>(base) + shift;
}

// The grid of one shape: FIFOs, buffers, and every case run by R x C x T threads that live for
// all the cases, meeting at a grid-wide barrier between them.
class Grid {
 public:
  Grid(const Shape& shape, std::vector<Case> cases)
      : shape_(shape),
        cases_(std::move(cases)),
        fifoWords_(static_cast<size_t>(shape.ranks * shape.channels)),
        slots_(fifoWords_.size()),
        buffers_(static_cast<size_t>(shape.ranks)),
        gridBarrier_(shape.ranks * shape.channels * shape.threads) {
    for (auto& s : slots_) s.assign(kSlotBytes * shape.slots + 64, 0);
    for (int b = 0; b < shape.ranks * shape.channels; ++b) {
      blockBarriers_.push_back(std::make_unique<std::barrier<>>(shape.threads));
      votes_.push_back(std::make_unique<Vote>());
    }
  }

  std::vector<std::string> run() {
    std::vector<std::thread> threads;
    for (int rank = 0; rank < shape_.ranks; ++rank)
      for (int channel = 0; channel < shape_.channels; ++channel)
        for (int t = 0; t < shape_.threads; ++t)
          threads.emplace_back([this, rank, channel, t] { thread(rank, channel, t); });
    for (auto& t : threads) t.join();
    return failures_;
  }

 private:
  // The FIFO rank `rank` receives on for `channel` (written by the previous rank).
  size_t fifoIndex(int rank, int channel) const {
    return static_cast<size_t>(rank * shape_.channels + channel);
  }
  uint8_t* slotsOf(size_t fifo) {
    return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(slots_[fifo].data()) + 63) / 64 *
                                      64);
  }

  void thread(int rank, int channel, int t) {
    const bool rankLeader = channel == 0 && t == 0;
    for (const Case& c : cases_) {
      if (rankLeader) prepare(c, rank);
      gridBarrier_.arrive_and_wait();  // every rank's buffers and FIFOs are ready
      const bool ok = runBlock(c, rank, channel, t);
      gridBarrier_.arrive_and_wait();  // every block is done
      if (!ok && t == 0)
        fail(c, "rank " + std::to_string(rank) + " channel " + std::to_string(channel) +
                    ": a wait gave up");
      if (rankLeader) check(c, rank);
      gridBarrier_.arrive_and_wait();  // checks done before the next case's buffers
    }
  }

  void fail(const Case& c, const std::string& what) {
    std::lock_guard<std::mutex> lock(failuresMutex_);
    if (failures_.size() < 20) failures_.push_back(describe(c, shape_) + ": " + what);
  }

  size_t inputElems(const Case& c) const {
    return c.collective == Collective::ReduceScatter ? c.count * shape_.ranks : c.count;
  }
  size_t outputElems(const Case& c) const {
    return c.collective == Collective::AllGather ? c.count * shape_.ranks : c.count;
  }

  // Inputs from the grid's generators, outputs poisoned, this rank's receiving FIFOs reset.
  void prepare(const Case& c, int rank) {
    RankBuffers& b = buffers_[rank];
    const size_t size = dtypeSize(c.type);
    const size_t shift = c.salt % 2 * size;
    b.inputElems = inputElems(c);
    b.outputElems = outputElems(c);
    b.input = alignedIn(b.inputStorage, b.inputElems * size, shift);
    b.output = alignedIn(b.outputStorage, b.outputElems * size, shift);
    const InputKind kind = reduces(c.collective) ? inputKindFor(c.op) : InputKind::Data;
    visitDtype(c.type, [&](auto element) {
      using T = decltype(element);
      visitKind(kind, [&](auto k) {
        for (size_t i = 0; i < b.inputElems; ++i) {
          const T v = inputValue<T, k()>(c.salt, rank, i);
          std::memcpy(b.input + i * size, &v, size);
        }
      });
    });
    for (int channel = 0; channel < shape_.channels; ++channel)
      fifoWords_[fifoIndex(rank, channel)] = braid::FifoWords{};
  }

  bool runBlock(const Case& c, int rank, int channel, int t) {
    const int next = (rank + 1) % shape_.ranks;
    braid::FifoRecvView in;
    const size_t mine = fifoIndex(rank, channel), theirs = fifoIndex(next, channel);
    in.words = &fifoWords_[mine];
    in.slots = slotsOf(mine);
    in.slotBytes = kSlotBytes;
    in.nSlots = static_cast<uint32_t>(shape_.slots);
    braid::FifoSendView out;
    out.words = &fifoWords_[theirs];
    out.slots = slotsOf(theirs);
    out.slotBytes = kSlotBytes;
    out.nSlots = static_cast<uint32_t>(shape_.slots);
    CpuGroup group(t, shape_.threads, blockBarriers_[mine].get(), votes_[mine].get(),
                   Clock::now() + kDeadline);
    const RankBuffers& b = buffers_[rank];
    bool ok = true;
    withReduction(c.type, c.op, [&](auto reduction) {
      using R = decltype(reduction);
      using T = typename R::Storage;
      braid::RingCall<T> call{c.collective,
                              shape_.ranks,
                              rank,
                              c.root,
                              reinterpret_cast<const T*>(b.input),
                              reinterpret_cast<T*>(b.output),
                              c.count,
                              c.count,
                              c.op == braidAvg ? shape_.ranks : 1};
      ok = braid::runChannelOnViews<R>(group, call, channel, shape_.channels, in, out);
    });
    return ok;
  }

  // Every output element against the reference; the input must be unchanged.
  void check(const Case& c, int rank) {
    const RankBuffers& b = buffers_[rank];
    const int n = shape_.ranks;
    size_t wrong = 0;
    std::string first;
    visitDtype(c.type, [&](auto element) {
      using T = decltype(element);
      const T poison = bitsAs<T>(0xa5a5a5a5a5a5a5a5ULL);
      auto expected = [&](size_t i) -> T {
        switch (c.collective) {
          case Collective::AllGather:
            return inputValue<T, InputKind::Data>(c.salt, static_cast<int>(i / c.count),
                                                  i % c.count);
          case Collective::Broadcast: return inputValue<T, InputKind::Data>(c.salt, c.root, i);
          case Collective::Reduce:
            if (rank != c.root) return poison;
            [[fallthrough]];
          default: {
            const size_t index = c.collective == Collective::ReduceScatter ? rank * c.count + i : i;
            T v{};
            visitOp(c.op, [&](auto op) { v = referenceReduce<T, op()>(c.salt, n, index); });
            return v;
          }
        }
      };
      for (size_t i = 0; i < b.outputElems; ++i) {
        T got;
        std::memcpy(&got, b.output + i * sizeof(T), sizeof(T));
        const T want = expected(i);
        if (sameBits(got, want)) continue;
        if (wrong++ == 0)
          first = "element " + std::to_string(i) + " is " + formatElement(got) + ", expected " +
                  formatElement(want);
      }
      const InputKind kind = reduces(c.collective) ? inputKindFor(c.op) : InputKind::Data;
      visitKind(kind, [&](auto k) {
        for (size_t i = 0; i < b.inputElems; ++i) {
          T got;
          std::memcpy(&got, b.input + i * sizeof(T), sizeof(T));
          if (!sameBits(got, inputValue<T, k()>(c.salt, rank, i)) && wrong++ == 0)
            first = "input element " + std::to_string(i) + " was changed";
        }
      });
    });
    if (wrong > 0)
      fail(c, "rank " + std::to_string(rank) + ": " + std::to_string(wrong) + " of " +
                  std::to_string(b.outputElems) + " elements wrong, first " + first);
  }

  Shape shape_;
  std::vector<Case> cases_;
  std::vector<braid::FifoWords> fifoWords_;
  std::vector<std::vector<uint8_t>> slots_;
  std::vector<RankBuffers> buffers_;
  std::barrier<> gridBarrier_;
  std::vector<std::unique_ptr<std::barrier<>>> blockBarriers_;
  std::vector<std::unique_ptr<Vote>> votes_;
  std::mutex failuresMutex_;
  std::vector<std::string> failures_;
};

// Every collective x dtype x op (reducing) at every count; roots 0 and R-1 for broadcast and
// reduce.
std::vector<Case> casesFor(const Shape& shape) {
  std::vector<Case> cases;
  const size_t beyondFifo = 3 * kSlotBytes * shape.slots + 5;  // elements: bytes of int8 and more
  const Collective collectives[] = {Collective::AllReduce, Collective::ReduceScatter,
                                    Collective::AllGather, Collective::Broadcast,
                                    Collective::Reduce};
  for (Collective collective : collectives)
    for (braidDataType_t type : kAllDtypes)
      for (braidRedOp_t op : kAllOps) {
        if (op == kPreMulSum || (!reduces(collective) && op != braidSum)) continue;
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1031}, beyondFifo}) {
          std::vector<int> roots = {0};
          if ((collective == Collective::Broadcast || collective == Collective::Reduce) &&
              shape.ranks > 1)
            roots.push_back(shape.ranks - 1);
          for (int root : roots)
            cases.push_back({collective, type, op, count, root, mixBits(7, 0, cases.size())});
        }
      }
  return cases;
}

// The device form's element reductions of the 8-bit floats, every pair of patterns x op, against
// the reference of reference/fp8.h (fp32 arithmetic, one saturating rounding).
TEST(DeviceElementReduce, EveryFp8PairMatchesTheReference) {
  auto check = [](auto typeConstant, auto widen, auto narrow) {
    constexpr braidDataType_t kType = decltype(typeConstant)::value;
    for (braidRedOp_t op : {braidSum, braidProd, braidMax, braidMin, braidAvg}) {
      visitOp(op, [&](auto opConstant) {
        constexpr braidRedOp_t kOp = decltype(opConstant)::value;
        if constexpr (kOp != kPreMulSum) {
          using R = braid::kernels::ElementReduce<kType, kOp>;
          const int divisor = kOp == braidAvg ? 3 : 1;
          for (int a = 0; a < 256; ++a)
            for (int b = 0; b < 256; ++b) {
              const float x = widen(static_cast<uint8_t>(a)), y = widen(static_cast<uint8_t>(b));
              float wide = kOp == braidProd ? x * y : x + y;
              if (kOp == braidMax) wide = std::isnan(x) || std::isnan(y) ? NAN : std::max(x, y);
              if (kOp == braidMin) wide = std::isnan(x) || std::isnan(y) ? NAN : std::min(x, y);
              if (kOp == braidAvg) wide /= static_cast<float>(divisor);
              const uint8_t want = narrow(wide);
              const uint8_t got =
                  R::apply(static_cast<uint8_t>(a), static_cast<uint8_t>(b), divisor);
              const bool same = std::isnan(widen(want)) ? std::isnan(widen(got))
                                : (kOp == braidMax || kOp == braidMin) && widen(want) == 0
                                    ? widen(got) == 0
                                    : got == want;
              ASSERT_TRUE(same) << dtypeName(kType) << " " << opName(kOp) << "(" << a << ", " << b
                                << "): got " << int{got} << ", expected " << int{want};
            }
        }
      });
    }
  };
  check(std::integral_constant<braidDataType_t, braidFloat8e4m3>{}, e4m3ToFloat, floatToE4m3);
  check(std::integral_constant<braidDataType_t, braidFloat8e5m2>{}, e5m2ToFloat, floatToE5m2);
}

class DeviceForm : public testing::TestWithParam<Shape> {};

TEST_P(DeviceForm, EveryCollectiveMatchesTheReference) {
  Grid grid(GetParam(), casesFor(GetParam()));
  for (const std::string& failure : grid.run()) ADD_FAILURE() << failure;
}

std::vector<Shape> shapes() {
  std::vector<Shape> all;
  for (int ranks : {1, 2, 3, 4, 8})
    for (int threads : {1, 4, 32})
      for (int slots : {2, 4}) all.push_back({ranks, ranks == 3 ? 2 : 1, threads, slots});
  return all;
}

INSTANTIATE_TEST_SUITE_P(Grid, DeviceForm, testing::ValuesIn(shapes()),
                         [](const testing::TestParamInfo<Shape>& info) {
                           return shapeName(info.param);
                         });

}  // namespace
}  // namespace braid_test
