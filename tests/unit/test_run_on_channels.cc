// Several channels of one host call at once (coll/host_channels.h): each on a thread of its own
// (channel 0 on the caller's), and the first failure stopping the others' waits and reaching the
// caller once every channel has ended. Built also with ThreadSanitizer (label tsan).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "base/error.h"
#include "coll/host_channels.h"

namespace {

// A communicator's watchdog as a channel sees it: counts its polls, fails nothing itself.
struct CountingDog : braid::Watchdog {
  std::atomic<int> polls{0};
  void poll(int, const char*) override { ++polls; }
};

std::vector<braid::Watchdog*> dogsOf(std::vector<CountingDog>& dogs) {
  std::vector<braid::Watchdog*> out;
  for (CountingDog& d : dogs) out.push_back(&d);
  return out;
}

TEST(RunOnChannels, EachChannelRunsOnceOnAThreadOfItsOwnTheFirstOnTheCallers) {
  std::vector<CountingDog> dogs(4);
  std::mutex mutex;
  std::set<int> channels;
  std::set<std::thread::id> threads;
  std::thread::id firstThread;
  braid::runOnChannels(dogsOf(dogs), [&](int channel, braid::Watchdog& dog) {
    dog.poll(-1, "nothing");  // reaches the channel's own watchdog
    std::lock_guard<std::mutex> lock(mutex);
    channels.insert(channel);
    threads.insert(std::this_thread::get_id());
    if (channel == 0) firstThread = std::this_thread::get_id();
  });
  EXPECT_EQ(channels, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(threads.size(), 4u);
  EXPECT_EQ(firstThread, std::this_thread::get_id());
  for (CountingDog& d : dogs) EXPECT_EQ(d.polls.load(), 1);
}

TEST(RunOnChannels, TheFirstFailureStopsTheOthersWaitsAndReachesTheCaller) {
  std::vector<CountingDog> dogs(3);
  std::atomic<int> ended{0}, ranOut{0};
  try {
    braid::runOnChannels(dogsOf(dogs), [&](int channel, braid::Watchdog& dog) {
      struct Ended {
        std::atomic<int>& n;
        ~Ended() { ++n; }
      } count{ended};
      if (channel == 2) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        braid::fail(braidRemoteError, "channel 2 lost its peer");
      }
      // The others wait for ever unless stopped: a minute bounds the test.
      const auto limit = std::chrono::steady_clock::now() + std::chrono::minutes(1);
      while (std::chrono::steady_clock::now() < limit) {
        dog.poll(-1, "data");
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      ++ranOut;  // not stopped
    });
    ADD_FAILURE() << "no failure reached the caller";
  } catch (const braid::Error& e) {
    EXPECT_EQ(e.code(), braidRemoteError);
    EXPECT_STREQ(e.what(), "channel 2 lost its peer");
  }
  EXPECT_EQ(ended.load(), 3);  // every channel ended before the caller heard
  EXPECT_EQ(ranOut.load(), 0);
}

}  // namespace
