// The choice of FIFO slot stores (coll/slot_stores.h): fixed policies, and auto mode following
// which stores measured faster, re-trying the other, per size class.
#include <gtest/gtest.h>

#include "base/error.h"
#include "coll/slot_stores.h"

namespace braid {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// Runs `calls` calls of `bytes` through the chooser, each taking the given seconds per byte for
// the stores it was given; returns how many used streaming stores.
int streamingCalls(SlotStoreChooser& chooser, size_t bytes, int calls, double cachedPerByte,
                   double streamingPerByte) {
  int streaming = 0;
  for (int i = 0; i < calls; ++i) {
    const SlotStores stores = chooser.choose(bytes);
    streaming += stores == SlotStores::kStreaming;
    const double perByte = stores == SlotStores::kCached ? cachedPerByte : streamingPerByte;
    chooser.record(bytes, stores, perByte * static_cast<double>(bytes));
  }
  return streaming;
}

TEST(SlotStores, FixedPoliciesIgnoreMeasurements) {
  SlotStoreChooser cached("cached"), streaming("streaming");
  EXPECT_EQ(streamingCalls(cached, 64 * kMiB, 50, 1.0, 0.1), 0);
  EXPECT_EQ(streamingCalls(streaming, 64 * kMiB, 50, 0.1, 1.0), 50);
  EXPECT_EQ(streamingCalls(streaming, 1024, 5, 0.1, 1.0), 5);  // forced at every size
}

TEST(SlotStores, BadPolicyIsNamed) {
  try {
    SlotStoreChooser chooser("fast");
    FAIL() << "accepted 'fast'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), braidInvalidArgument);
    EXPECT_STREQ(e.what(), "BRAID_SLOT_STORES='fast' is not one of auto, cached, streaming");
  }
}

TEST(SlotStores, AutoKeepsSmallCallsCached) {
  SlotStoreChooser chooser("auto");
  EXPECT_EQ(streamingCalls(chooser, SlotStoreChooser::kMinAdaptiveBytes - 1, 100, 1.0, 0.1), 0);
}

// Warm-up call, one measured call each way, then the faster, except one call in kRetryPeriod.
TEST(SlotStores, AutoUsesTheFasterAndRetriesTheOther) {
  const int calls = 3 + 10 * SlotStoreChooser::kRetryPeriod;
  SlotStoreChooser slowCached("auto");
  const int streaming = streamingCalls(slowCached, 64 * kMiB, calls, 5.0, 1.0);
  EXPECT_GE(streaming, calls - 1 - 11);  // cached: the warm-up, its measurement and the retries
  EXPECT_LE(streaming, calls - 1 - 9);
  SlotStoreChooser fastCached("auto");
  const int retries = streamingCalls(fastCached, 64 * kMiB, calls, 1.0, 2.0);
  EXPECT_GE(retries, 1 + 9);  // the first measurement and the retries
  EXPECT_LE(retries, 1 + 11);
}

// The cores' placement changes mid-job: within a retry period the chooser follows.
TEST(SlotStores, AutoFollowsAChange) {
  SlotStoreChooser chooser("auto");
  const int period = SlotStoreChooser::kRetryPeriod;
  streamingCalls(chooser, 64 * kMiB, 3 * period, 1.0, 2.0);  // cached faster
  streamingCalls(chooser, 64 * kMiB, 2 * period, 5.0, 1.0);  // now streaming is: switch
  EXPECT_GE(streamingCalls(chooser, 64 * kMiB, period, 5.0, 1.0), period - 1);
  streamingCalls(chooser, 64 * kMiB, 2 * period, 1.0, 2.0);  // and back
  EXPECT_LE(streamingCalls(chooser, 64 * kMiB, period, 1.0, 2.0), 1);
}

// Size classes learn separately: 2 MiB calls do not inherit what 64 MiB calls measured.
TEST(SlotStores, AutoLearnsPerSizeClass) {
  SlotStoreChooser chooser("auto");
  streamingCalls(chooser, 64 * kMiB, 40, 5.0, 1.0);
  EXPECT_LE(streamingCalls(chooser, 2 * kMiB, 40, 1.0, 2.0), 4);
  EXPECT_GE(streamingCalls(chooser, 64 * kMiB, 16, 5.0, 1.0), 15);
}

}  // namespace
}  // namespace braid
