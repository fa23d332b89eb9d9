// Exceptions other than braid's own (here std::bad_alloc, from an allocation made to fail) on the
// paths off the API entry: in an operation (the peers must learn of it at once, not at their
// timeout) and on the threads that run a group's other communicators (nothing may end the
// process). This binary replaces the global operator new so a test can fail one allocation.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "multirank/rank_launcher.h"

namespace {

enum class Arm { Off, ThisThread, OtherThreads };

std::atomic<Arm> gArmed{Arm::Off};
thread_local bool tArmedHere = false;

// Whether the allocation being made should fail; true at most once per arming.
bool shouldFail() {
  const Arm armed = gArmed.load(std::memory_order_relaxed);
  if (armed == Arm::Off || (armed == Arm::ThisThread) != tArmedHere) return false;
  Arm expected = armed;
  return gArmed.compare_exchange_strong(expected, Arm::Off);
}

// The next allocation made by this thread (ThisThread) or by any other (OtherThreads) fails.
void armAllocationFailure(Arm where) {
  tArmedHere = true;
  gArmed.store(where);
}

}  // namespace

// This file defines the allocation and deallocation functions both, over malloc and free.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

void* operator new(size_t bytes) {
  if (shouldFail()) throw std::bad_alloc();
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t bytes) {
  return operator new(bytes);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, size_t) noexcept {
  std::free(p);
}

namespace braid_test {
namespace {

constexpr int kTimeoutMs = 30000;  // a peer that is not told waits this long, and the test fails

std::string lastError(braidComm_t comm) {
  const char* text = braidGetLastError(comm);
  return text ? text : "";
}

// A send/recv that fails on the sender's side in the middle of its operation: the sender reports
// running out of memory, the receiver that the sender failed and why, both at once.
Failures sendWithFailedAllocation(const RankEnv& env) {
  braidComm_t comm = nullptr;
  braidResult_t r = initRank(&comm, env, kTimeoutMs);
  if (r != braidSuccess) return {"init: " + describeResult(r, nullptr)};
  float data[4] = {1, 2, 3, 4};
  Failures failures;
  if (env.rank == 1) {
    armAllocationFailure(Arm::ThisThread);
    r = braidSend(data, 4, braidFloat32, 0, comm, nullptr);
    if (r != braidSystemError || lastError(comm).find("out of memory") == std::string::npos)
      failures.push_back("expected braidSystemError (out of memory), got " +
                         describeResult(r, comm));
  } else {
    r = braidRecv(data, 4, braidFloat32, 1, comm, nullptr);
    const std::string sentence = lastError(comm);
    if (r != braidRemoteError || sentence.find("rank 1 failed") == std::string::npos ||
        sentence.find("out of memory") == std::string::npos)
      failures.push_back("expected braidRemoteError naming rank 1's out of memory, got " +
                         describeResult(r, comm));
  }
  braidCommAbort(comm);
  return failures;
}

TEST(Exceptions, InAnOperationThePeersLearnAtOnceThreads) {
  Failures failures = launchRanks(Launch::Threads, 2, {sendWithFailedAllocation, nullptr},
                                  std::chrono::seconds(2 * kTimeoutMs / 1000));
  EXPECT_TRUE(failures.empty()) << testing::PrintToString(failures);
}

TEST(Exceptions, InAnOperationThePeersLearnAtOnceProcesses) {
  Failures failures = launchRanks(Launch::Processes, 2, {sendWithFailedAllocation, nullptr},
                                  std::chrono::seconds(2 * kTimeoutMs / 1000));
  EXPECT_TRUE(failures.empty()) << testing::PrintToString(failures);
}

// Two ranks of this process driven from this thread: rank 1's part of the group runs on a worker
// thread, where the allocation fails. The group returns an error; the process lives on.
TEST(Exceptions, OnAGroupWorkerThreadTheGroupFails) {
  braidUniqueId id;
  ASSERT_EQ(braidGetUniqueId(&id), braidSuccess) << lastError(nullptr);
  braidConfig_t config = BRAID_CONFIG_INITIALIZER;
  config.timeoutMs = kTimeoutMs;
  config.device = "cpu";
  braidComm_t comms[2] = {};
  braidGroupStart();
  for (int r = 0; r < 2; ++r) braidCommInitRankConfig(&comms[r], 2, id, r, &config);
  ASSERT_EQ(braidGroupEnd(), braidSuccess) << lastError(nullptr);

  // Rank 0 waits for rank 1's reply, so it must learn that rank 1 failed.
  float data[2][4] = {{1, 2, 3, 4}, {}};
  float reply[2][4] = {};
  braidGroupStart();
  braidSend(data[0], 4, braidFloat32, 1, comms[0], nullptr);
  braidRecv(reply[0], 4, braidFloat32, 1, comms[0], nullptr);
  braidRecv(data[1], 4, braidFloat32, 0, comms[1], nullptr);
  braidSend(data[1], 4, braidFloat32, 0, comms[1], nullptr);
  armAllocationFailure(Arm::OtherThreads);
  const braidResult_t r = braidGroupEnd();
  EXPECT_TRUE(r == braidSystemError || r == braidRemoteError) << describeResult(r, nullptr);
  EXPECT_NE(lastError(comms[1]).find("out of memory"), std::string::npos) << lastError(comms[1]);
  EXPECT_NE(lastError(comms[0]).find("rank 1 failed"), std::string::npos) << lastError(comms[0]);
  for (braidComm_t comm : comms) braidCommAbort(comm);
}

}  // namespace
}  // namespace braid_test
