#include "core/issue_gate.h"

#include <algorithm>
#include <map>

#include "base/error.h"

namespace braid {

std::shared_ptr<IssueGate> IssueGate::join(uintptr_t key, int members) {
  static std::mutex mutex;
  static std::map<uintptr_t, std::weak_ptr<IssueGate>> gates;
  const std::lock_guard lock(mutex);
  std::erase_if(gates, [](const auto& entry) { return entry.second.expired(); });
  std::shared_ptr<IssueGate> gate = gates[key].lock();
  if (gate == nullptr) {
    gate = std::make_shared<IssueGate>(members);
    gates[key] = gate;
  }
  return gate;
}

void IssueGate::awaitTurn(int member, int rank, Clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  const uint64_t calls = issued_.at(member);
  auto lagging = [&] {
    return std::find_if(issued_.begin(), issued_.end(), [&](uint64_t n) { return n < calls; });
  };
  if (!changed_.wait_until(lock, deadline, [&] { return lagging() == issued_.end(); }))
    fail(braidTimeout,
         "rank {}: its call {} waited for member {} of the ranks on its GPU in this process to "
         "queue call {} first (their streams may share a hardware queue of the GPU, where calls "
         "out of order stall), and gave up at the communicator's timeout",
         rank, calls + 1, lagging() - issued_.begin(), calls);
}

void IssueGate::issued(int member) {
  {
    const std::lock_guard lock(mutex_);
    ++issued_.at(member);
  }
  changed_.notify_all();
}

}  // namespace braid
