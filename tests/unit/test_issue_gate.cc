// The issue gate (src/core/issue_gate.h): a member's next call waits until every member has
// queued as many calls as it has; a member that never does is a timeout naming it; members of one
// group share one gate.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "base/error.h"
#include "core/issue_gate.h"

namespace braid {
namespace {

constexpr auto kLong = std::chrono::seconds(60);

TEST(IssueGate, ACallWaitsUntilEveryMemberQueuedThePrevious) {
  IssueGate gate(3);
  gate.awaitTurn(0, 0, Clock::now() + kLong);  // the first call goes at once
  gate.issued(0);
  std::atomic<int> queuedByOthers{0};
  std::thread others([&] {
    for (int member : {1, 2}) {
      gate.awaitTurn(member, member, Clock::now() + kLong);
      queuedByOthers.fetch_add(1);
      gate.issued(member);
    }
  });
  gate.awaitTurn(0, 0, Clock::now() + kLong);  // call 2 of member 0: after 1 and 2 queued call 1
  EXPECT_EQ(queuedByOthers.load(), 2);
  others.join();
}

TEST(IssueGate, AMemberThatNeverQueuesIsATimeoutNamingIt) {
  IssueGate gate(2);
  gate.issued(1);
  gate.issued(1);
  gate.issued(0);
  try {
    gate.awaitTurn(1, 5, Clock::now() + std::chrono::milliseconds(50));
    FAIL() << "member 1's third call went while member 0 had queued one";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), braidTimeout);
    EXPECT_NE(std::string(e.what()).find("rank 5: its call 3 waited for member 0"),
              std::string::npos)
        << e.what();
  }
}

TEST(IssueGate, MembersOfOneGroupShareOneGate) {
  int fifos = 0, other = 0;  // stand-ins for the addresses that name groups
  const auto key = reinterpret_cast<uintptr_t>(&fifos);
  std::shared_ptr<IssueGate> a = IssueGate::join(key, 2), b = IssueGate::join(key, 2);
  EXPECT_EQ(a, b);
  EXPECT_NE(IssueGate::join(reinterpret_cast<uintptr_t>(&other), 2), a);
  a.reset();
  b.reset();
  std::shared_ptr<IssueGate> again = IssueGate::join(key, 3);  // the group gone, a new one
  EXPECT_EQ(again->members(), 3);
}

}  // namespace
}  // namespace braid
