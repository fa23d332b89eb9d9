// How a blocking wait treats its watchdog: it drives while it spins and yields, and says once
// that it stops driving before it sleeps (a network proxy then takes the links back).
#include <gtest/gtest.h>

#include <thread>

#include "base/wait.h"

namespace braid {
namespace {

// Counts the calls; its drive() can move the word itself, as a rank driving a link would.
struct CountingDog : Watchdog {
  CountingDog() {
    spins = 32;
    yields = 4;
    sliceNs = 1000 * 1000;
  }
  void poll(int, const char*) override {}
  bool drive(int) override {
    ++drives;
    if (moveOnDrive != 0 && drives == moveOnDrive) word.publish(1);
    return false;
  }
  void stopDriving() override {
    ++stops;
    drivesAtStop = drives;
  }
  WakeableCounter word;
  int moveOnDrive = 0;  // the drive() that publishes 1; 0: none does
  int drives = 0;
  int stops = 0;
  int drivesAtStop = -1;
};

TEST(Wait, AWaitThatSleepsStopsDrivingOnceAndDrivesNoMore) {
  CountingDog dog;
  std::thread mover([&] {
    // Moves the word only once the wait has counted itself asleep.
    while (std::atomic_ref<uint32_t>(dog.word.sleepers).load() == 0) std::this_thread::yield();
    dog.word.publish(1);
  });
  EXPECT_EQ(waitUntil(
                dog.word, [](uint32_t v) { return v == 1; }, dog, 0, "a test"),
            1u);
  mover.join();
  EXPECT_EQ(dog.stops, 1);
  EXPECT_GT(dog.drivesAtStop, 0);
  EXPECT_EQ(dog.drives, dog.drivesAtStop) << "drove after it said it stopped";
}

TEST(Wait, AWaitThatItsOwnDrivingEndsNeverStopsDriving) {
  CountingDog dog;
  dog.moveOnDrive = 2;
  EXPECT_EQ(waitUntil(
                dog.word, [](uint32_t v) { return v == 1; }, dog, 0, "a test"),
            1u);
  EXPECT_EQ(dog.drives, 2);
  EXPECT_EQ(dog.stops, 0);
}

}  // namespace
}  // namespace braid
