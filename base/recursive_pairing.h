// Who exchanges with whom in a log-step all-reduce (recursive doubling or halving), by position
// in the team's order (every rank in ring order, or the hosts' leaders): the largest power of two
// of the ranks take part (participant indices 0..p-1), and the first 2 x surplus positions pair up,
// each odd one folding into the even one before it. The executor (coll/host_recursive.cc) runs it
// and the cost model (plan/model.cc) prices it: one rule for both, here, since neither layer may
// include the other.
#pragma once

#include <algorithm>
#include <vector>

namespace braid {

struct RecursivePairing {
  int participants = 1;
  int surplus = 0;

  explicit RecursivePairing(int nranks) {
    while (participants * 2 <= nranks) participants *= 2;
    surplus = nranks - participants;
  }
  // Folds into position - 1 and gets the result back from it.
  bool folded(int position) const { return position < 2 * surplus && position % 2 == 1; }
  // Takes position + 1's input first and hands it the result last.
  bool keepsFolded(int position) const { return position < 2 * surplus && position % 2 == 0; }
  int foldPartner(int position) const { return folded(position) ? position - 1 : position + 1; }
  int indexOf(int position) const {
    return position < 2 * surplus ? position / 2 : position - surplus;
  }
  int positionOf(int index) const { return index < surplus ? 2 * index : index + surplus; }
};

// The hierarchical all-reduce's leaders (the communicator hands them to the executor; the model
// prices them): the first rank of each host in `order` (the ring's), in that order; hostOf(rank)
// names a rank's host.
template <class Order, class HostOf>
std::vector<int> hostLeaders(const Order& order, HostOf hostOf) {
  std::vector<int> leaders, hosts;
  for (int rank : order) {
    if (std::find(hosts.begin(), hosts.end(), hostOf(rank)) != hosts.end()) continue;
    hosts.push_back(hostOf(rank));
    leaders.push_back(rank);
  }
  return leaders;
}

}  // namespace braid
