// Per-call overhead of braid's public API: a 1-element float32 all-reduce on a 1-rank
// communicator, where no data moves, so the time is argument checking, dispatch and (on a host
// stream) the hand-off to the stream's worker thread and back.
//   NullStream:               each call completes before it returns.
//   HostStream/Enqueue:       enqueue only; the batch ends with one braidStreamSynchronize.
//   HostStream/Synchronized:  enqueue + synchronize per call, the round trip a caller waits for.
#include <benchmark/benchmark.h>

#include "braid/braid.h"

namespace {

// A 1-rank communicator for one benchmark; skips it with braid's message if braid fails.
class OneRank {
 public:
  explicit OneRank(benchmark::State& state) : state_(state) {
    if (braidCommInitAll(&comm_, 1, nullptr) != braidSuccess) {
      state.SkipWithError(braidGetLastError(nullptr));
      comm_ = nullptr;
    }
  }
  ~OneRank() {
    if (comm_ != nullptr) braidCommDestroy(comm_);
  }
  braidComm_t comm() const { return comm_; }
  bool ok() const { return comm_ != nullptr; }

  // False after ending the benchmark with braid's message.
  bool call(braidResult_t result) {
    if (result == braidSuccess) return true;
    state_.SkipWithError(braidGetLastError(comm_));
    return false;
  }

 private:
  benchmark::State& state_;
  braidComm_t comm_ = nullptr;
};

void NullStream(benchmark::State& state) {
  OneRank rank(state);
  float value = 1.0f;
  for (auto _ : state) {
    if (!rank.ok() ||
        !rank.call(braidAllReduce(&value, &value, 1, braidFloat32, braidSum, rank.comm(), nullptr)))
      break;
  }
}
BENCHMARK(NullStream);

void HostStream(benchmark::State& state, bool synchronizeEachCall) {
  OneRank rank(state);
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

}  // namespace

BENCHMARK_MAIN();
