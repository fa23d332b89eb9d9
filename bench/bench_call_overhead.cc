// Per-call overhead of braid's public API: a 1-element float32 all-reduce on a 1-rank
// communicator, where no data moves, so the time is argument checking, dispatch and (on a host
// stream) the hand-off to the stream's worker thread and back.
//   NullStream:               each call completes before it returns.
//   HostStream/Enqueue:       enqueue only; the batch ends with one braidStreamSynchronize.
//   HostStream/Synchronized:  enqueue + synchronize per call, the round trip a caller waits for.
//   GroupedTwoRanks:          a 4-byte all-reduce on 2 ranks of this process driven from one
//                             thread inside braidGroupStart/End: the other rank runs on a worker.
#include <benchmark/benchmark.h>

#include <vector>

#include "braid/braid.h"

namespace {

// Ranks of this process (braidCommInitAll) for one benchmark; skips it with braid's message if
// braid fails.
class LocalRanks {
 public:
  LocalRanks(benchmark::State& state, int nranks) : state_(state), comms_(nranks) {
    if (braidCommInitAll(comms_.data(), nranks, nullptr) != braidSuccess) {
      state.SkipWithError(braidGetLastError(nullptr));
      comms_.clear();
    }
  }
  ~LocalRanks() {
    for (braidComm_t comm : comms_) braidCommDestroy(comm);
  }
  braidComm_t comm(int rank = 0) const { return comms_[rank]; }
  bool ok() const { return !comms_.empty(); }

  // False after ending the benchmark with braid's message.
  bool call(braidResult_t result) {
    if (result == braidSuccess) return true;
    state_.SkipWithError(braidGetLastError(nullptr));
    return false;
  }

 private:
  benchmark::State& state_;
  std::vector<braidComm_t> comms_;
};

void NullStream(benchmark::State& state) {
  LocalRanks rank(state, 1);
  float value = 1.0f;
  for (auto _ : state) {
    if (!rank.ok() ||
        !rank.call(braidAllReduce(&value, &value, 1, braidFloat32, braidSum, rank.comm(), nullptr)))
      break;
  }
}
BENCHMARK(NullStream);

void HostStream(benchmark::State& state, bool synchronizeEachCall) {
  LocalRanks rank(state, 1);
  braidStream_t stream = nullptr;
  if (!rank.ok() || !rank.call(braidStreamCreate(&stream))) return;
  float value = 1.0f;
  for (auto _ : state) {
    if (!rank.call(braidAllReduce(&value, &value, 1, braidFloat32, braidSum, rank.comm(), stream)))
      break;
    if (synchronizeEachCall && !rank.call(braidStreamSynchronize(stream))) break;
  }
  rank.call(braidStreamSynchronize(stream));  // the enqueued calls count in the batch's time
  braidStreamDestroy(stream);
}
BENCHMARK_CAPTURE(HostStream, Enqueue, false);
BENCHMARK_CAPTURE(HostStream, Synchronized, true);

void GroupedTwoRanks(benchmark::State& state) {
  LocalRanks ranks(state, 2);
  float values[2] = {1.0f, 2.0f};
  for (auto _ : state) {
    if (!ranks.ok()) break;
    braidGroupStart();
    for (int r = 0; r < 2; ++r)
      braidAllReduce(&values[r], &values[r], 1, braidFloat32, braidMax, ranks.comm(r), nullptr);
    if (!ranks.call(braidGroupEnd())) break;
  }
}
BENCHMARK(GroupedTwoRanks)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
