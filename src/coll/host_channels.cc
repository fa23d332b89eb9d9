#include "coll/host_channels.h"

#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "base/error.h"

namespace braid {
namespace {

// A channel's watchdog that also gives up once another channel has failed.
class StoppableDog final : public Watchdog {
 public:
  StoppableDog(Watchdog& inner, const std::atomic<bool>& stopped)
      : inner_(inner), stopped_(stopped) {
    pacedAs(inner);
  }
  void poll(int peer, const char* waitingFor) override {
    if (stopped_.load(std::memory_order_acquire))
      fail(braidInternalError, "a channel stopped: another channel of its call failed");
    inner_.poll(peer, waitingFor);
  }
  bool drive(int peer) override { return inner_.drive(peer); }
  void stopDriving() override { inner_.stopDriving(); }

 private:
  Watchdog& inner_;
  const std::atomic<bool>& stopped_;
};

}  // namespace

void runOnChannels(std::span<Watchdog* const> dogs,
                   const std::function<void(int channel, Watchdog& dog)>& body) {
  std::atomic<bool> stopped{false};
  std::mutex firstMutex;
  std::exception_ptr first;  // under firstMutex: the failure that stopped the others
  auto run = [&](int channel) {
    StoppableDog dog(*dogs[channel], stopped);
    try {
      body(channel, dog);
    } catch (...) {
      std::lock_guard<std::mutex> lock(firstMutex);
      if (!stopped.exchange(true)) first = std::current_exception();
    }
  };
  std::vector<std::thread> helpers;
  try {
    for (int c = 1; c < static_cast<int>(dogs.size()); ++c) helpers.emplace_back(run, c);
  } catch (...) {  // no thread to be had: the channels started stop too
    std::lock_guard<std::mutex> lock(firstMutex);
    if (!stopped.exchange(true)) first = std::current_exception();
  }
  if (!stopped.load()) run(0);
  for (std::thread& helper : helpers) helper.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace braid
