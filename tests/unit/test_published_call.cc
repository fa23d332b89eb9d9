// A rank's published call (transport.h: publishCall / publishedCall), which a waiting peer on its
// host reads to name a call that differs from its own: read back as written, and never a mix of
// two calls while the rank rewrites it (the sequence lock), on real threads.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "transport/transport.h"

namespace braid {
namespace {

CallTag tagOf(uint64_t n) {
  CallTag tag;
  tag.sequence = n;
  tag.count = 3 * n + 1;
  tag.root = static_cast<int32_t>(n % 7);
  tag.collective = static_cast<uint8_t>(n % 5);
  tag.datatype = static_cast<uint8_t>(n % 11);
  tag.op = static_cast<uint8_t>(n % 3);
  tag.comm = n * 7919;
  return tag;
}

TEST(PublishedCall, NothingUntilPublishedThenWhatWasWritten) {
  RankControl control;
  EXPECT_FALSE(publishedCall(control).has_value());
  publishCall(control, tagOf(9));
  const std::optional<CallTag> read = publishedCall(control);
  ASSERT_TRUE(read.has_value());
  EXPECT_TRUE(*read == tagOf(9));
  publishCall(control, tagOf(10));
  EXPECT_TRUE(*publishedCall(control) == tagOf(10));
}

TEST(PublishedCall, AReaderNeverSeesTwoCallsMixed) {
  RankControl control;
  std::atomic<bool> enough{false};
  std::thread writer([&] {
    for (uint64_t n = 1; !enough.load(std::memory_order_relaxed); ++n)
      publishCall(control, tagOf(n));
  });
  uint64_t last = 0;
  for (int reads = 0; reads < 100000;) {
    const std::optional<CallTag> read = publishedCall(control);
    if (!read) continue;
    ++reads;
    if (!(*read == tagOf(read->sequence)) || read->sequence < last) {
      ADD_FAILURE() << "call " << read->sequence << " read mixed, or after call " << last;
      break;
    }
    last = read->sequence;
  }
  enough = true;
  writer.join();
}

}  // namespace
}  // namespace braid
