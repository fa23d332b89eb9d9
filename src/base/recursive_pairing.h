// Who exchanges with whom in a log-step all-reduce (recursive doubling or halving), by ring
// position: the largest power of two of the ranks take part (participant indices 0..p-1), and the
// first 2 x surplus positions pair up, each odd one folding into the even one before it. The
// executor (coll/host_recursive.cc) runs it and the cost model (plan/model.cc) prices it: one
// rule for both, here, since neither layer may include the other.
#pragma once

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

}  // namespace braid
