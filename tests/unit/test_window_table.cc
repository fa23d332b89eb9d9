// Registered windows (core/window_table.h): which calls a rank launched on its own can run on the
// direct engine, where it reaches its peers' buffers, and the signature the engine's barrier
// compares. First on addresses alone (never touched), then end to end: ranks on CPU threads, each
// knowing only its own call and the windows, run the direct engine's device form
// (coll/direct_engine.h) on the buffers located for them, checked against the multirank grid's
// independent reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <thread>
#include <vector>

#include "coll/direct_engine.h"
#include "core/window_table.h"
#include "device/cpu_group.h"
#include "device/device_cases.h"

namespace braid_test {
namespace {

using braid::CollArgs;
using braid::WindowCall;
using braid::WindowTable;

CollArgs callOf(Collective collective, uintptr_t send, uintptr_t recv, size_t count,
                braidDataType_t type = braidFloat32, braidRedOp_t op = braidSum) {
  CollArgs a;
  a.coll = collective;
  a.sendbuff = reinterpret_cast<const void*>(send);
  a.recvbuff = reinterpret_cast<void*>(recv);
  a.count = count;
  a.type = type;
  a.op = op;
  return a;
}

uintptr_t address(const void* p) {
  return reinterpret_cast<uintptr_t>(p);
}

constexpr uintptr_t kPart0 = 0x10000000, kPart1 = 0x90000000;  // two ranks' parts of a window

TEST(WindowTable, OnlyCallsWhoseBuffersLieWholeInWindowsAreLocated) {
  WindowTable table(0, 2);
  table.add(1, 4096, {kPart0, kPart1});
  EXPECT_TRUE(table.locate(callOf(Collective::AllReduce, kPart0, kPart0, 1024)));  // all of it
  EXPECT_FALSE(table.locate(callOf(Collective::AllReduce, kPart0 + 4, kPart0 + 4, 1024)))
      << "one element past the end";
  EXPECT_FALSE(table.locate(callOf(Collective::AllReduce, kPart0 - 4, kPart0 - 4, 1)))
      << "before the start";
  EXPECT_FALSE(table.locate(callOf(Collective::AllReduce, kPart0, kPart0 + 8192, 4)))
      << "the output outside";
  EXPECT_FALSE(table.locate(callOf(Collective::AllReduce, kPart1, kPart1, 4)))
      << "a peer's part is not this rank's window";
  EXPECT_FALSE(table.locate(callOf(Collective::ReduceScatter, kPart0, kPart0 + 2048, 513)))
      << "a reduce-scatter's input is ranks x count";
  EXPECT_FALSE(table.locate(callOf(Collective::Broadcast, kPart0, kPart0 + 64, 4)))
      << "the direct engine runs no broadcast";
  EXPECT_FALSE(table.locate(callOf(Collective::AllReduce, kPart0, kPart0, 0)));
  table.remove(1);
  EXPECT_FALSE(table.locate(callOf(Collective::AllReduce, kPart0, kPart0, 4)))
      << "a deregistered window";
}

TEST(WindowTable, PeersAreReachedAtTheSameOffsetsOfTheirParts) {
  constexpr size_t kWindow = 1 << 20;
  WindowTable rank0(0, 2), rank1(1, 2);
  for (WindowTable* t : {&rank0, &rank1}) {
    t->add(1, kWindow, {kPart0, kPart1});
    t->add(2, kWindow, {kPart0 + kWindow, kPart1 + kWindow});
  }
  auto at = [&](uintptr_t part, size_t send, size_t recv, size_t count = 100,
                braidDataType_t type = braidFloat32, braidRedOp_t op = braidSum) {
    return callOf(Collective::AllReduce, part + send, part + kWindow + recv, count, type, op);
  };
  const std::optional<WindowCall> mine = rank0.locate(at(kPart0, 256, 512));
  const std::optional<WindowCall> theirs = rank1.locate(at(kPart1, 256, 512));
  ASSERT_TRUE(mine && theirs);
  EXPECT_EQ(mine->signature, theirs->signature);
  for (const WindowCall* w : {&*mine, &*theirs}) {
    EXPECT_EQ(address(w->inputs[0]), kPart0 + 256);
    EXPECT_EQ(address(w->inputs[1]), kPart1 + 256);
    EXPECT_EQ(address(w->outputs[0]), kPart0 + kWindow + 512);
    EXPECT_EQ(address(w->outputs[1]), kPart1 + kWindow + 512);
  }
  // Whatever would make the ranks' calls differ makes their signatures differ.
  for (const CollArgs& other :
       {at(kPart1, 260, 512), at(kPart1, 256, 516), at(kPart1, 256, 512, 101),
        at(kPart1, 256, 512, 100, braidInt32), at(kPart1, 256, 512, 100, braidFloat32, braidMax),
        callOf(Collective::AllReduce, kPart1 + kWindow + 256, kPart1 + 512, 100)})
    EXPECT_NE(rank1.locate(other)->signature, mine->signature);
  EXPECT_NE(braid::directSignature(at(kPart0, 256, 512)), mine->signature)
      << "a call on windows never matches one launched with every rank";
}

// In place a rank's buffers sit rank x count apart inside one buffer, which every rank's call
// names at the same offset of its window.
TEST(WindowTable, InPlaceCallsAreLocatedFromTheWholeBuffer) {
  constexpr int kRanks = 4;
  constexpr size_t kCount = 10, kBytes = kCount * 4, kAt = 64;
  const std::vector<uintptr_t> parts = {kPart0, kPart0 + (1 << 20), kPart1, kPart1 + (1 << 20)};
  std::vector<std::unique_ptr<WindowTable>> tables;
  for (int r = 0; r < kRanks; ++r) {
    tables.push_back(std::make_unique<WindowTable>(r, kRanks));
    tables.back()->add(7, 4096, parts);
  }
  for (Collective c : {Collective::AllGather, Collective::ReduceScatter}) {
    SCOPED_TRACE(collectiveName(c));
    std::vector<uint64_t> signatures;
    for (int r = 0; r < kRanks; ++r) {
      const uintptr_t whole = parts[r] + kAt, block = whole + r * kBytes;
      const CollArgs a = c == Collective::AllGather ? callOf(c, block, whole, kCount)
                                                    : callOf(c, whole, block, kCount);
      const std::optional<WindowCall> w = tables[r]->locate(a);
      ASSERT_TRUE(w);
      signatures.push_back(w->signature);
      for (int p = 0; p < kRanks; ++p) {
        const uintptr_t peerWhole = parts[p] + kAt, peerBlock = peerWhole + p * kBytes;
        EXPECT_EQ(address(w->inputs[p]), c == Collective::AllGather ? peerBlock : peerWhole);
        EXPECT_EQ(address(w->outputs[p]), c == Collective::AllGather ? peerWhole : peerBlock);
      }
    }
    EXPECT_EQ(std::count(signatures.begin(), signatures.end(), signatures[0]), kRanks);
    // Rank 2 out of place (its block elsewhere in the window): another call.
    const uintptr_t whole = parts[2] + kAt, elsewhere = parts[2] + 2048;
    const CollArgs outOfPlace = c == Collective::AllGather ? callOf(c, elsewhere, whole, kCount)
                                                           : callOf(c, whole, elsewhere, kCount);
    EXPECT_NE(tables[2]->locate(outOfPlace)->signature, signatures[0]);
  }
}

TEST(WindowTable, OverlappingWindowsResolveToTheOldest) {
  WindowTable table(1, 2);
  table.add(3, 1 << 20, {kPart0, kPart1});
  table.add(4, 4096, {kPart0 + 8192, kPart1 + 8192});  // inside window 3
  WindowTable alone(1, 2);
  alone.add(3, 1 << 20, {kPart0, kPart1});
  const CollArgs a = callOf(Collective::AllReduce, kPart1 + 8192, kPart1 + 8192, 16);
  EXPECT_EQ(table.locate(a)->signature, alone.locate(a)->signature);
}

// Ranks launched apart on windows, end to end on CPU threads: each rank's buffers laid out as
// nccl.h puts them (in place or not), a window per buffer it owns, the call located by the rank's
// own table, the direct engine run with the located buffers and signature (2 channels of 4
// threads per rank), every output element against the reference.
class WindowedRanks {
 public:
  explicit WindowedRanks(int ranks) : n_(ranks), buffers_(ranks), arrivals_(2 * ranks) {}

  std::string run(const Case& c) {
    for (int r = 0; r < n_; ++r) layoutRank(c, r, n_, buffers_[r]);
    std::vector<WindowCall> calls;
    for (int r = 0; r < n_; ++r) {
      std::optional<WindowCall> w = tableOf(c, r)->locate(argsOf(c, r));
      if (!w) return "rank " + std::to_string(r) + ": the call's buffers were not located";
      calls.push_back(*w);
    }
    std::vector<char> ok(n_ * kChannels);
    CpuBlocks blocks(n_ * kChannels, kThreads);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    std::vector<std::thread> threads;
    for (int r = 0; r < n_; ++r)
      for (int ch = 0; ch < kChannels; ++ch)
        for (int t = 0; t < kThreads; ++t)
          threads.emplace_back([&, r, ch, t] {
            const int block = r * kChannels + ch;
            CpuGroup group = blocks.group(block, t, deadline);
            withReduction(c.type, c.op, [&](auto reduction, auto) {
              using R = decltype(reduction);
              using T = typename R::Storage;
              const braid::DirectCall<T> call{
                  c.collective,
                  n_,
                  r,
                  reinterpret_cast<const T* const*>(calls[r].inputs.data()),
                  reinterpret_cast<T* const*>(calls[r].outputs.data()),
                  nullptr,
                  c.count,
                  c.op == braidAvg ? n_ : 1};
              braid::DirectBarrier barrier{&arrivals_[ch * n_], nullptr, calls[r].signature};
              const bool done = braid::runDirect<R>(group, call, ch, kChannels, barrier);
              if (t == 0) ok[block] = done;
            });
          });
    for (auto& t : threads) t.join();
    for (int r = 0; r < n_; ++r) {
      if (!ok[r * kChannels] || !ok[r * kChannels + 1])
        return "rank " + std::to_string(r) + ": a barrier gave up";
      if (std::string wrong = checkRank(c, r, n_, buffers_[r]); !wrong.empty())
        return "rank " + std::to_string(r) + ": " + wrong;
    }
    return "";
  }

 private:
  static constexpr int kChannels = 2, kThreads = 4;

  // The buffer that holds rank r's call whole (in place: the one both lie in) is where a window
  // starts, the element shift of the layout before it: every rank's buffers then sit at the
  // same offsets of their parts, as symmetric windows have them.
  std::unique_ptr<WindowTable> tableOf(const Case& c, int r) const {
    const size_t size = dtypeSize(c.type), shift = c.salt % 2 * size;
    auto table = std::make_unique<WindowTable>(r, n_);
    std::vector<uintptr_t> inputs, outputs;
    for (const RankBuffers& b : buffers_) {
      inputs.push_back(address(b.input) - shift);
      outputs.push_back(address(b.output) - shift);
    }
    const bool inputOwns = !c.inPlace || c.collective == Collective::ReduceScatter;
    const bool outputOwns = !c.inPlace || c.collective != Collective::ReduceScatter;
    if (inputOwns) table->add(1, shift + buffers_[r].inputElems * size, inputs);
    if (outputOwns) table->add(2, shift + buffers_[r].outputElems * size, outputs);
    return table;
  }

  static CollArgs argsOf(const Case& c, const RankBuffers& b) {
    return callOf(c.collective, address(b.input), address(b.output), c.count, c.type, c.op);
  }
  CollArgs argsOf(const Case& c, int r) const { return argsOf(c, buffers_[r]); }

  int n_;
  std::vector<RankBuffers> buffers_;
  std::vector<braid::DirectArrival> arrivals_;  // by channel, then rank: they outlive the calls
};

TEST(WindowTable, RanksLaunchedApartRunTheDirectEngineOnTheirWindows) {
  for (int ranks : {1, 2, 3, 4}) {
    WindowedRanks grid(ranks);
    size_t cases = 0;
    for (Collective collective :
         {Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather})
      for (braidDataType_t type : kAllDtypes)
        for (braidRedOp_t op : kAllOps) {
          if (op == kPreMulSum || (!reduces(collective) && op != braidSum)) continue;
          for (size_t count : {size_t{1}, size_t{7}, size_t{1031}})
            for (bool inPlace : {false, true}) {
              const Case c{collective, type, op, count, 0, mixBits(11, ranks, cases++), inPlace};
              const std::string wrong = grid.run(c);
              EXPECT_EQ(wrong, "") << describe(c, {ranks, 2, 4, 2, Algorithm::Direct});
            }
        }
  }
}

}  // namespace
}  // namespace braid_test
