// A communicator's status (core/comm_status.h): init's outcome as waiters see it, the error code
// and sentence that end a communicator, and the pending operations finalize waits for; on real
// threads.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "core/comm_status.h"

namespace {

using braid::CommStatus;
using braid::PendingOperations;

// Runs `wait` on a thread, checks it is still waiting after the thread got going and yielded a
// while, then runs `release` and checks the wait returned.
template <class Wait, class Release>
void expectBlocksUntil(Wait wait, Release release) {
  std::atomic<bool> started{false}, returned{false};
  std::thread waiter([&] {
    started = true;
    wait();
    returned = true;
  });
  while (!started) std::this_thread::yield();
  for (int i = 0; i < 1000; ++i) std::this_thread::yield();
  EXPECT_FALSE(returned.load()) << "returned before it was released";
  release();
  waiter.join();
  EXPECT_TRUE(returned.load());
}

TEST(CommStatus, InProgressUntilInitEndsThenSuccessUntilItFails) {
  CommStatus status;
  EXPECT_EQ(status.code(), braidInProgress);
  EXPECT_FALSE(status.ready());
  expectBlocksUntil([&] { status.waitReady(); }, [&] { status.markReady(std::nullopt); });
  EXPECT_TRUE(status.ready());
  EXPECT_EQ(status.code(), braidSuccess);
  status.fail(braidRemoteError);
  EXPECT_EQ(status.code(), braidRemoteError);
  EXPECT_NO_THROW(status.waitReady());  // init itself went well
}

TEST(CommStatus, InitsErrorReachesEveryWaiterAndTheLastError) {
  CommStatus status;
  status.markReady(braid::Error(braidSystemError, "rank 1: init: no route to rank 0"));
  EXPECT_EQ(status.code(), braidSystemError);
  EXPECT_EQ(status.lastError(), "rank 1: init: no route to rank 0");
  for (int waiter = 0; waiter < 2; ++waiter) {
    try {
      status.waitReady();
      ADD_FAILURE() << "init's error was not thrown";
    } catch (const braid::Error& e) {
      EXPECT_EQ(e.code(), braidSystemError);
      EXPECT_STREQ(e.what(), "rank 1: init: no route to rank 0");
    }
  }
}

TEST(CommStatus, LastErrorIsTheLatestRecorded) {
  CommStatus status;
  EXPECT_EQ(status.lastError(), "");
  status.record(braid::Error(braidInvalidArgument, "first"));
  status.record(braid::Error(braidInvalidUsage, "second"));
  EXPECT_EQ(status.lastError(), "second");
}

TEST(PendingOperations, DrainedOnceTheLastEnds) {
  PendingOperations pending;
  pending.waitDrained();  // none pending: returns at once
  pending.begin();
  pending.begin();
  pending.end();
  expectBlocksUntil([&] { pending.waitDrained(); }, [&] { pending.end(); });
}

}  // namespace
